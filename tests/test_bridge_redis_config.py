"""The bridge and Backbeat's Redis settings (docs/backbeat.md, "2. The bridge"): a Redis started
with ``--requirepass`` (Backbeat's ``redis.password``), a wrong or missing password said at
start and in the lag reason, and bad ``config.json`` values refused with the field named,
through the CLI. Found by a hostile review: the password was ignored without a word, the
start probe's result dropped (the lag reason blamed the processor: "its state node does not
exist"), and a port out of range or a chroot with ``..`` gave "unexpected ValueError".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from locstatus import State, connect
from locstatus.backbeat_state import BackbeatConfig
from locstatus.bridge import Bridge, BridgeSettings
from locstatus.cli import app
from locstatus.client import Client

from support.kits_zk import raw_client, zk_server  # noqa: F401  (a fixture)
from support.legacy_processor import LegacyProcessor
from support.redis_server import RedisServer, redis_auth_server  # noqa: F401  (a fixture)

FAST = BridgeSettings(ack_wait=1.0, republish_interval=0.3, lost_after=3.0, tick=0.2,
                      lease_seconds=6)
WORKER = "backbeat.replication.zenko"


@dataclass
class AuthSite:
    zk_hosts: str
    redis: RedisServer
    mgr: Client
    url: str
    tmp: Path

    def config(self, password: str | None) -> dict[str, Any]:
        redis: dict[str, Any] = {"host": "127.0.0.1", "port": self.redis.port}
        if password is not None:
            redis["password"] = password
        return {"zookeeper": {"connectionString": self.zk_hosts}, "redis": redis}

    def processor(self) -> LegacyProcessor:
        return LegacyProcessor(self.zk_hosts, f"127.0.0.1:{self.redis.port}", ["zenko"],
                               password=self.redis.password).start()

    def error(self) -> str:
        for w in self.mgr.workers():
            if w.worker_id == WORKER:
                return w.errors.get("zenko/replication") or ""
        return ""


@pytest.fixture
def site(tmp_path: Path, zk_server: Any,  # noqa: F811
         redis_auth_server: RedisServer) -> Iterator[AuthSite]:  # noqa: F811
    chroot = f"/bb-{uuid.uuid4().hex[:10]}"
    with raw_client(zk_server.hosts) as root:
        root.create(chroot)
    url = f"sqlite:///{tmp_path}/ls.db"
    mgr = connect(url)
    mgr.sync_locations({"zenko": ["replication"]})
    yield AuthSite(f"{zk_server.hosts}{chroot}", redis_auth_server, mgr, url, tmp_path)
    mgr.close()


def wait_for(check: Any, what: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what()
        time.sleep(0.05)


def test_with_the_right_password_the_bridge_bridges(site: AuthSite) -> None:
    cfg = BackbeatConfig.from_config(site.config(site.redis.password))
    with site.processor(), Bridge(site.mgr, cfg, services=["replication"],
                                  settings=FAST) as bridge:
        assert bridge.redis_error is None
        site.mgr.pause("zenko", "replication")
        wait_for(lambda: site.mgr.status("zenko").services["replication"].state
                 is State.PAUSED, site.error)


@pytest.mark.parametrize("password", [None, "not-its-pw-7"], ids=["missing", "wrong"])
def test_a_missing_or_wrong_password_is_said_at_start_and_in_the_lag_reason(
    site: AuthSite, password: str | None,
) -> None:
    cfg_file = site.tmp / "config.json"
    cfg_file.write_text(json.dumps(site.config(password)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCSTATUS_")}
    cmd = [sys.executable, "-m", "locstatus", "--backend", site.url, "bridge", "backbeat",
           "--config", str(cfg_file), "--service", "replication", "--ack-wait", "1"]
    with site.processor():
        bridge = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  env=env)
        try:
            wait_for(lambda: WORKER in [w.worker_id for w in site.mgr.workers()]
                     or bridge.poll() is not None, lambda: "no registration")
            assert bridge.poll() is None
            site.mgr.pause("zenko", "replication")
            wait_for(lambda: "Redis" in site.error(), site.error)
            error = site.error()
            assert f"Backbeat's Redis at redis://127.0.0.1:{site.redis.port} cannot be used" \
                in error, error
            assert ("NOAUTH" if password is None else "WRONGPASS") in error, error
            assert site.mgr.status("zenko").services["replication"].state is State.PAUSING
        finally:
            bridge.send_signal(signal.SIGTERM)
            _out, err = bridge.communicate(timeout=30)
    assert bridge.returncode == 0, err
    text = err.decode()
    start = f"Backbeat's Redis at redis://127.0.0.1:{site.redis.port} cannot be used: "
    assert start in text and "bridging anyway" in text, text
    assert site.redis.password not in text  # the right one is nowhere said
    if password is not None:
        assert password not in text


BAD_CONFIGS = [
    ({"redis": {"host": "127.0.0.1", "port": 99999}},
     "redis.port 99999 is not a TCP port (1-65535)"),
    ({"redis": {"host": "127.0.0.1", "port": 0}}, "redis.port 0 is not a TCP port"),
    ({"redis": {"host": "127.0.0.1", "password": 42}}, "redis.password must be a string"),
    ({"zookeeper": {"connectionString": "127.0.0.1:2181/backbeat/../x"}},
     "zookeeper.connectionString: the chroot /backbeat/../x has a '..' segment"),
    ({"zookeeper": {"connectionString": "127.0.0.1:99999/backbeat"}},
     "zookeeper.connectionString: port '99999' of '127.0.0.1:99999' is not a TCP port"),
    ({"zookeeper": {"connectionString": "127.0.0.1:zk/backbeat"}},
     "port 'zk' of '127.0.0.1:zk' is not a TCP port"),
    ({"queuePopulator": {"mongo": {"replicaSetHosts": "h:27017", "replicaSet": 7}}},
     "queuePopulator.mongo.replicaSet must be a non-empty string"),
]


@pytest.mark.parametrize(("config", "message"), BAD_CONFIGS,
                         ids=[m.split(":")[0].split(" ")[0] for _c, m in BAD_CONFIGS])
def test_a_bad_config_value_is_refused_naming_the_field(
    tmp_path: Path, config: dict[str, Any], message: str,
) -> None:
    url = f"sqlite:///{tmp_path}/ls.db"
    connect(url).close()
    cfg_file = tmp_path / "config.json"
    full = {"zookeeper": {"connectionString": "127.0.0.1:1/backbeat"},
            "redis": {"host": "127.0.0.1", "port": 1}}
    for key, value in config.items():
        full[key] = {**full.get(key, {}), **value}
    cfg_file.write_text(json.dumps(full))
    env = {"LOCSTATUS_BACKEND": None, "LOCSTATUS_SERVICES": None}
    result = CliRunner().invoke(app, ["--backend", url, "bridge", "backbeat", "--config",
                                      str(cfg_file)], env=env)
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr, result.stderr
    assert "unexpected" not in result.stderr, result.stderr
    assert connect(url).workers() == []  # nothing started


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--zookeeper", "127.0.0.1:2181/a/../b", "--zookeeper: the chroot /a/../b has a '..'"),
    ("--redis", "redis://127.0.0.1:99999", "Backbeat's Redis 'redis://127.0.0.1:99999'"),
    ("--redis", "redis://:s3cr3t-x@127.0.0.1:99999",
     "Backbeat's Redis 'redis://:***@127.0.0.1:99999'"),  # the password not shown
], ids=["zookeeper", "redis", "redis-with-password"])
def test_a_bad_address_option_is_refused_naming_it(
    tmp_path: Path, option: str, value: str, message: str,
) -> None:
    url = f"sqlite:///{tmp_path}/ls.db"
    connect(url).close()
    args = {"--zookeeper": "127.0.0.1:1", "--redis": "redis://127.0.0.1:1", option: value}
    env = {"LOCSTATUS_BACKEND": None, "LOCSTATUS_SERVICES": None}
    result = CliRunner().invoke(app, ["--backend", url, "bridge", "backbeat",
                                      *[x for kv in args.items() for x in kv]], env=env)
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr, result.stderr
    assert "unexpected" not in result.stderr and "s3cr3t" not in result.stderr, result.stderr


def test_redis_sentinels_are_refused_at_start_naming_the_field(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ls.db"
    connect(url).close()
    cfg_file = tmp_path / "config.json"
    cfg_file.write_text(json.dumps({
        "zookeeper": {"connectionString": "127.0.0.1:1/backbeat"},
        "redis": {"name": "backbeat", "sentinels": [{"host": "127.0.0.1", "port": 1}]}}))
    env = {"LOCSTATUS_BACKEND": None, "LOCSTATUS_SERVICES": None}
    result = CliRunner().invoke(app, ["--backend", url, "bridge", "backbeat", "--config",
                                      str(cfg_file)], env=env)
    assert result.exit_code == 2, result.stderr
    assert "redis.sentinels (Redis Sentinel), which the bridge does not follow" \
        in result.stderr, result.stderr
