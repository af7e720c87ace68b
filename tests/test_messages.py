"""Messages people read (issue 20): each says what was wrong in words and what to do, through
the interface where it was seen (the CLI in a real process or typer's runner, the sidecar over
HTTP), on a real SQLite file."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from locstatus import Manager, open_backend
from locstatus.api import create_app
from locstatus.api.server import BackgroundServer
from locstatus.cli import app

ENV = {"LOCSTATUS_BACKEND": None, "LOCSTATUS_SERVICES": None, "LOCSTATUS_API_TOKEN": None,
       "COLUMNS": "200", "USER": "tester"}


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'locstatus.db'}"
    mgr = Manager(open_backend(url))
    mgr.sync_locations(["us-east-1", "eu-central-1-frankfurt", "ap-south-tokyo"])
    mgr.close()
    yield url


def cli(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["--backend", url, *args], env=ENV, catch_exceptions=False)
    return result.exit_code, result.stderr


def test_an_interval_out_of_bounds_says_the_bounds_in_words(url: str) -> None:
    code, err = cli(url, "serve", "--reconcile-interval", "0")
    assert code == 2
    assert "invalid --reconcile-interval '0': expected a number of seconds more than 0 and " \
        "at most 315360000 (3650 days)" in err, err
    assert "e+" not in err and ".." not in err
    code, err = cli(url, "pause", "us-east-1", "--wait", "-1")
    assert code == 2 and "expected a number of seconds from 0 to 86400 (1 day)" in err, err


def test_an_unknown_location_suggests_the_closest_stored_one(url: str) -> None:
    for args in (["pause", "us-est-1"], ["status", "us-est-1"], ["history", "us-est-1"],
                 ["resume", "us-est-1", "--in", "1h"]):
        code, err = cli(url, *args)
        assert code == 1, (args, err)
        assert "unknown location 'us-est-1'; did you mean 'us-east-1'?" in err, (args, err)
    code, err = cli(url, "status", "eu-central-1-frankfrt")
    assert "did you mean 'eu-central-1-frankfurt'?" in err, err
    code, err = cli(url, "pause", "zzz-nothing-alike")
    assert code == 1 and "unknown location 'zzz-nothing-alike'" in err
    assert "did you mean" not in err


def test_a_body_that_is_not_json_says_so_over_http(url: str) -> None:
    mgr = Manager(open_backend(url))
    try:
        with BackgroundServer(create_app(mgr)) as srv:
            path = srv.url + "/v1/locations/us-east-1/replication/pause"
            headers = {"Content-Type": "application/json"}
            r = httpx.post(path, content=b"not json", headers=headers, timeout=60)
            assert r.status_code == 422
            detail = r.json()["detail"]
            assert detail.startswith("body: the request body is not JSON (Expecting value at "
                                     "character 0); send a JSON object"), detail
            assert "JSON decode error" not in r.text and "body.0" not in r.text
            r = httpx.post(path, content=b"[1]", headers=headers, timeout=60)
            assert r.status_code == 422 and "must be a JSON object" in r.json()["detail"]
            assert mgr.status("us-east-1").version == 1  # nothing written
    finally:
        mgr.close()


def test_a_port_in_use_says_how_to_pick_another(url: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOCSTATUS_")}
        proc = subprocess.run(
            [sys.executable, "-m", "locstatus", "--backend", url, "serve", "--port", str(port)],
            capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path, check=False,
        )
    assert proc.returncode == 2, proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in proc.stderr
    assert "pick another with --port N, or --port 0 for any free one" in proc.stderr
