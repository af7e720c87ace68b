"""What the sidecar logs for a bulk ``all`` (docs/http.md, "Logs"): one INFO line per call with
its counts by outcome and duration, a WARNING per failed location for the first ten only, each
location's change at DEBUG: at 100 000 locations one line per location was 100 000 lines for
one call."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from locstatus import Manager
from locstatus.api import create_app
from locstatus.api.server import BackgroundServer
from locstatus.backends.sqlite import SQLiteBackend

from support.fleets import sqlite_fleet

N, BAD = 300, 13


@pytest.fixture
def http(tmp_path: Path) -> Iterator[httpx.Client]:
    url = f"sqlite:///{tmp_path}/locstatus.db"
    sqlite_fleet(url, [f"loc-{i:03d}" for i in range(N)], corrupt=BAD)
    with Manager(SQLiteBackend(url)) as mgr, BackgroundServer(create_app(mgr)) as srv, \
            httpx.Client(base_url=srv.url, timeout=120) as client:
        yield client


def _ours(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "locstatus.api" and r.levelno == level]


def test_a_bulk_call_logs_one_info_line_and_its_first_failures(
    http: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="locstatus")
    r = http.post("/v1/locations/all/replication/pause", json={"actor": "ops"})
    assert r.status_code == 500 and len(r.json()["results"]) == N, r.text
    infos = _ours(caplog, logging.INFO)
    assert [i.getMessage().split(" in ")[0] for i in infos] == [
        f"pause all: {N - BAD} changed, 0 unchanged, 0 skipped, {BAD} failed"
    ]
    info = infos[0]
    assert (info.changed, info.failed, info.locations, info.actor) == (  # type: ignore[attr-defined]
        N - BAD, BAD, N, "ops"
    )
    assert info.duration > 0  # type: ignore[attr-defined]
    warnings = [w.getMessage() for w in _ours(caplog, logging.WARNING)]
    assert [w.split(":")[0] for w in warnings[:10]] == [
        f"pause all loc-{i:03d}" for i in range(10)
    ]
    assert warnings[10:] == [
        f"pause all: {BAD - 10} more failed locations not logged (op_id {info.op_id})"  # type: ignore[attr-defined]
    ]


def test_each_locations_change_of_a_bulk_call_is_logged_at_debug(
    http: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="locstatus.api")
    r = http.post("/v1/locations/all/replication/pause", json={})
    assert r.status_code == 500 and len(r.json()["results"]) == N, r.text
    changes = [rec for rec in _ours(caplog, logging.DEBUG) if "/replication: pausing" in
               rec.getMessage() or "/replication: paused" in rec.getMessage()]
    assert len(changes) == N - BAD
    assert len(_ours(caplog, logging.INFO)) == 1
