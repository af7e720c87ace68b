"""Named callers and roles (docs/http.md "Callers and roles") over real HTTP on a real store:
tokens from a file of hashes, each naming a principal and a role; the actor of every change is
the principal; a worker acts as itself only; the single ``LOCSTATUS_API_TOKEN`` is one operator;
SIGHUP reloads the file (a broken file keeps the previous set); tokens never reach a log or an
answer; the history is searchable by actor over HTTP and in the CLI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from locstatus import InvalidInput, Manager, open_backend
from locstatus.api import create_app
from locstatus.api.principals import MIN_TOKEN_LENGTH, RELOAD_TIMEOUT, Principals, hash_token
from locstatus.api.server import BackgroundServer
from locstatus.api.workers import hub_of
from locstatus.audit import history_by_actor

from support.kits_zk import wait_until
from support.sse import SseReader

LOCATIONS = ["eu-west-1", "us-east-1"]
JSON = {"Content-Type": "application/json"}
TOKENS = {
    "alice": ("operator", "alice-token-0b7d4e9c2a51f3"),
    "bob": ("read", "bob-token-7c1e0d2b9a4f85"),
    "mover": ("worker", "mover-token-5e2a9c7b1d03f4"),
    "proxy": ("operator", "proxy-token-3f9b2c8e1a7d06"),
    "root": ("admin", "root-token-8d4c1f6a2e9b37"),
}


def entries(**extra: dict[str, Any]) -> dict[str, Any]:
    out = []
    for name, (role, token) in TOKENS.items():
        e: dict[str, Any] = {"name": name, "role": role, "sha256": hash_token(token)}
        e.update(extra.get(name, {}))
        out.append(e)
    return {"principals": out}


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    p = tmp_path / "tokens.json"
    p.write_text(json.dumps(entries(mover={"workers": ["mover-*"]},
                                    proxy={"forward_actor": True})))
    return p


@pytest.fixture
def mgr(backend_url: str) -> Iterator[Manager]:
    m = Manager(open_backend(backend_url))
    m.sync_locations(LOCATIONS)
    yield m
    m.close()


@pytest.fixture
def server(mgr: Manager, tokens_file: Path) -> Iterator[BackgroundServer]:
    principals = Principals.from_settings(tokens_file=tokens_file, token=None)
    with BackgroundServer(create_app(mgr, principals=principals)) as s:
        yield s


def client(server: BackgroundServer, who: str | None) -> httpx.Client:
    headers = dict(JSON)
    if who is not None:
        headers["Authorization"] = f"Bearer {TOKENS[who][1] if who in TOKENS else who}"
    return httpx.Client(base_url=server.url, headers=headers, timeout=30)


def actors(mgr: Manager, loc: str = "us-east-1") -> list[str | None]:
    """Actors of the operators' changes, newest first (settles are the settler's)."""
    ops = {"pause", "resume", "schedule_resume", "cancel_scheduled_resume"}
    return [e.actor for e in mgr.history(loc, limit=100) if e.event in ops]


def test_the_actor_of_a_change_is_the_principal(server: BackgroundServer, mgr: Manager) -> None:
    with client(server, "alice") as alice:
        r = alice.post("/v1/locations/us-east-1/replication/pause", json={"reason": "maint"})
        assert r.status_code == 200, r.text
        assert r.json()["services"]["replication"]["actor"] == "alice"
    with client(server, "root") as root:
        assert root.post("/v1/locations/us-east-1/replication/resume", json={}).status_code == 200
    with client(server, "alice") as alice:  # the Backbeat routes too
        assert alice.post("/_/backbeat/api/crr/pause/eu-west-1").status_code == 200
    assert mgr.status("eu-west-1").services["replication"].actor == "alice"
    assert actors(mgr)[:2] == ["root", "alice"]


def test_who_may_do_what(server: BackgroundServer, mgr: Manager) -> None:
    pause = "/v1/locations/us-east-1/replication/pause"
    with client(server, None) as anon:
        r = anon.post(pause, json={})
        assert r.status_code == 401 and r.headers["content-type"] == "application/problem+json"
        assert anon.get("/v1/locations/us-east-1").status_code == 200  # reads stay public
    with client(server, "not-a-token-of-this-sidecar") as stranger:
        assert stranger.post(pause, json={}).status_code == 403
    for who in ("bob", "mover"):
        with client(server, who) as c:
            r = c.post(pause, json={})
            assert r.status_code == 403, who
            assert r.json()["type"] == "urn:locstatus:role"
            assert f"principal {who!r}" in r.json()["detail"]
    assert actors(mgr) == []  # nothing was written


def test_an_actor_is_accepted_only_from_a_principal_that_may_forward_one(
    server: BackgroundServer, mgr: Manager
) -> None:
    pause = "/v1/locations/us-east-1/replication/pause"
    with client(server, "alice") as alice:
        r = alice.post(pause, json={"actor": "mallory"})
        assert r.status_code == 403 and "forward_actor" in r.json()["detail"]
        assert actors(mgr) == []
        assert alice.post(pause, json={"actor": "alice"}).status_code == 200
    with client(server, "proxy") as proxy:
        r = proxy.post("/v1/locations/us-east-1/replication/resume", json={"actor": "carol"})
        assert r.status_code == 200
    assert actors(mgr)[:2] == ["carol", "alice"]


def test_a_worker_principal_acts_as_its_own_workers_only(server: BackgroundServer) -> None:
    body = {"services": ["replication"]}
    with client(server, "mover") as mover:
        assert mover.put("/v1/workers/mover-1", json=body).status_code == 200
        r = mover.put("/v1/workers/lifecycle-1", json=body)
        assert r.status_code == 403 and "'lifecycle-1'" in r.json()["detail"]
        assert mover.put("/v1/workers/lifecycle-1/acks/us-east-1/replication",
                         json={"generation": 0}).status_code == 403
        with mover.stream("GET", "/v1/workers/lifecycle-1/watch") as s:
            assert s.status_code == 403
    with client(server, "bob") as bob:
        assert bob.put("/v1/workers/bob", json=body).status_code == 403
    with client(server, None) as anon:
        with anon.stream("GET", "/v1/workers/mover-1/watch") as s:
            assert s.status_code == 401
        assert anon.delete("/v1/workers/mover-1").status_code == 401
    with client(server, "alice") as alice:  # an operator may act for any worker
        assert alice.delete("/v1/workers/mover-1").json()["removed"] is True


def test_the_single_token_is_one_operator(mgr: Manager) -> None:
    token = "legacy-token-1f4e7a0c9b2d"
    with BackgroundServer(create_app(mgr, token=token)) as srv, httpx.Client(
        base_url=srv.url, headers={**JSON, "Authorization": f"Bearer {token}"}
    ) as c:
        assert c.post("/v1/locations/us-east-1/replication/pause", json={}).status_code == 200
        r = c.post("/v1/locations/us-east-1/replication/resume", json={"actor": "ops-bot"})
        assert r.status_code == 200
    assert actors(mgr)[:2] == ["ops-bot", "operator"]


def test_history_by_actor_over_http_and_in_the_cli(
    server: BackgroundServer, mgr: Manager, backend_url: str
) -> None:
    for who, op in [("alice", "pause"), ("root", "resume"), ("alice", "resume"),
                    ("root", "pause"), ("alice", "pause")]:
        with client(server, who) as c:
            assert c.post(f"/v1/locations/us-east-1/replication/{op}", json={}).status_code == 200
    with client(server, "bob") as bob:
        r = bob.get("/v1/locations/us-east-1/history", params={"actor": "alice"})
        assert r.status_code == 200
        mine = r.json()
        assert mine and {e["actor"] for e in mine} == {"alice"}
        # alice's pause and the settle her call made; her resume and second pause were no-ops
        assert [e["event"] for e in mine] == ["settle", "pause"]
        one = bob.get("/v1/locations/us-east-1/history", params={"actor": "alice", "limit": 1})
        assert len(one.json()) == 1
        assert bob.get("/v1/locations/us-east-1/history",
                       params={"actor": "nobody"}).json() == []
        bad = bob.get("/v1/locations/us-east-1/history", params={"actor": ""})
        assert bad.status_code == 422
    proc = subprocess.run(
        [sys.executable, "-m", "locstatus", "--backend", backend_url, "history", "us-east-1",
         "--actor", "root", "--json"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got and {e["actor"] for e in got} == {"root"}
    assert history_by_actor(mgr, "us-east-1", "root", limit=10) == [
        e for e in mgr.history("us-east-1", limit=100) if e.actor == "root"
    ]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{", "not JSON"),
        ('{"tokens": []}', 'expected {"principals": [...]}'),
        ('{"principals": [{"name": "a", "role": "god", "sha256": "' + "0" * 64 + '"}]}',
         "'role' must be one of"),
        ('{"principals": [{"name": "a", "role": "read", "sha256": "abc"}]}', "64 lower-case hex"),
        ('{"principals": [{"name": "all", "role": "read", "sha256": "' + "0" * 64 + '"}]}',
         "'name'"),
        ('{"principals": [{"name": "a", "role": "read", "sha256": "' + "0" * 64 + '", "x": 1}]}',
         "unknown member"),
        ('{"principals": [{"name": "a", "role": "read", "sha256": "' + "0" * 64 + '"}, '
         '{"name": "b", "role": "read", "sha256": "' + "0" * 64 + '"}]}', "same token"),
        ('{"principals": [{"name": "a", "role": "read", "sha256": "' + "0" * 64 + '"}, '
         '{"name": "a", "role": "read", "sha256": "' + "1" * 64 + '"}]}', "used twice"),
    ],
)
def test_a_bad_tokens_file_is_refused_naming_what_is_wrong(
    tmp_path: Path, content: str, needle: str
) -> None:
    p = tmp_path / "tokens.json"
    p.write_text(content)
    with pytest.raises(InvalidInput, match=r"tokens\.json") as info:
        Principals.from_settings(tokens_file=p, token=None)
    assert needle in str(info.value)


def test_a_token_too_short_to_be_a_secret_is_refused(mgr: Manager) -> None:
    """A one-character token was accepted, and its redaction from logs removed that character
    from every later log line (routed follow-up: token minimum length)."""
    for token in ("t", "secret-" + "9" * (MIN_TOKEN_LENGTH - 8)):
        with pytest.raises(InvalidInput, match=f"at least {MIN_TOKEN_LENGTH}") as info:
            create_app(mgr, token=token)
        assert "secret-9" not in str(info.value)
        # both ways out: a longer LOCSTATUS_API_TOKEN, or an entry of the tokens file
        assert "set a longer one" in str(info.value)
        assert "LOCSTATUS_API_TOKENS_FILE" in str(info.value)
        assert "locstatus tokens new NAME ROLE" in str(info.value)
    create_app(mgr, token="x" * MIN_TOKEN_LENGTH)


def test_the_helper_makes_a_token_and_its_entry(tmp_path: Path) -> None:
    """``locstatus tokens new`` (was ``python -m locstatus.api.principals new``, which printed
    runpy's RuntimeWarning on every run: the package imports the module before it runs)."""
    proc = subprocess.run(
        [sys.executable, "-m", "locstatus", "tokens", "new", "dave", "worker"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    assert proc.stderr == ""
    token = proc.stdout.split("it is shown once): ", 1)[1].split()[0]
    entry = json.loads(proc.stdout.split("LOCSTATUS_API_TOKENS_FILE: ", 1)[1])
    assert entry == {"name": "dave", "role": "worker", "sha256": hash_token(token)}
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"principals": [entry]}))
    who = Principals.from_settings(tokens_file=p, token=None).authenticate(token)
    assert who is not None and who.name == "dave"
    hashed = subprocess.run(
        [sys.executable, "-m", "locstatus", "tokens", "hash"],
        input=token + "\n", capture_output=True, text=True, timeout=60, check=True,
    )
    assert hashed.stdout.strip() == hash_token(token) and hashed.stderr == ""
    bad = subprocess.run(
        [sys.executable, "-m", "locstatus", "tokens", "new", "dave", "boss"],
        capture_output=True, text=True, timeout=60,
    )
    assert bad.returncode == 2 and "role" in bad.stderr and bad.stdout == ""


def test_sighup_reloads_the_tokens_file_and_a_broken_empty_or_stuck_one_keeps_the_last(
    tmp_path: Path, backend_url: str
) -> None:
    mgr = Manager(open_backend(backend_url))
    mgr.sync_locations(LOCATIONS)
    mgr.close()
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(entries()))
    env = {**os.environ, "LOCSTATUS_API_TOKENS_FILE": str(path), "LOCSTATUS_BACKEND": backend_url}
    env.pop("LOCSTATUS_API_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "locstatus", "serve", "--port", "0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    log: list[str] = []
    try:
        assert proc.stdout is not None
        url = None
        deadline = time.monotonic() + 30
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            log.append(line)
            if "locstatus sidecar on " in line:
                url = line.split("locstatus sidecar on ", 1)[1].split(",")[0]
        assert url is not None, "".join(log)
        assert "5 principal(s)" in "".join(log)

        def up() -> bool:
            try:
                return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 30, what="the sidecar serving")

        def pause_as(token: str) -> int:
            r = httpx.post(f"{url}/v1/locations/us-east-1/replication/pause", json={},
                           headers={**JSON, "Authorization": f"Bearer {token}"}, timeout=10)
            return r.status_code

        alice, dave = TOKENS["alice"][1], "dave-token-2c9e7f1a4b6d08"
        assert pause_as(alice) == 200 and pause_as(dave) == 403
        path.write_text(json.dumps({"principals": [
            {"name": "dave", "role": "operator", "sha256": hash_token(dave)}]}))
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: pause_as(dave) == 200, 10, what="dave after the reload")
        assert pause_as(alice) == 403
        path.write_text("{ broken")
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert pause_as(dave) == 200  # the previous set stays in force
        path.write_text(json.dumps({"principals": []}))  # would lock every caller out
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert pause_as(dave) == 200
        path.unlink()
        os.mkfifo(path)  # a read that never ends (as on a hung NFS mount)
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        started = time.monotonic()
        assert up() and time.monotonic() - started < 2  # the event loop is not blocked
        assert pause_as(dave) == 200
        time.sleep(RELOAD_TIMEOUT)
        assert pause_as(dave) == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    text = "".join(log) + out
    assert "not reloaded" in text and "reloaded: 1 principal(s)" in text
    assert "names no principal" in text and f"took over {RELOAD_TIMEOUT:g}s" in text
    for _, token in TOKENS.values():
        assert token not in text
    assert "dave-token" not in text


def _watch(server: BackgroundServer, path: str, who: str | None) -> SseReader:
    headers = {} if who is None else {"Authorization": f"Bearer {TOKENS[who][1]}"}
    return SseReader(f"{server.url}{path}?heartbeat=0.2", headers)


def test_token_less_streams_cannot_lock_workers_out(server: BackgroundServer) -> None:
    hub = hub_of(server.app)
    hub.max_streams, hub.max_shared_streams = 4, 2
    with client(server, "mover") as mover:
        for wid in ("mover-1", "mover-2"):
            assert mover.put(f"/v1/workers/{wid}", json={"services": ["replication"]}).is_success
    streams: list[SseReader] = []
    try:
        codes = []
        for _ in range(4):  # as many as the whole sidecar serves
            streams.append(_watch(server, "/v1/watch", None))
            codes.append(streams[-1].status)
        assert codes == [200, 200, 429, 429]
        assert "share 2" in streams[-1].error["detail"]
        with_read = _watch(server, "/v1/watch", "bob")  # a read principal shares that pool
        streams.append(with_read)
        assert with_read.status == 429
        for wid in ("mover-1", "mover-2"):  # the workers keep their room
            streams.append(_watch(server, f"/v1/workers/{wid}/watch", "mover"))
            assert streams[-1].status == 200, streams[-1].error
    finally:
        for s in streams:
            s.close()
    wait_until(lambda: hub.open_streams() == 0, 10, what="closed streams counted out")


def test_a_worker_principal_is_limited_per_worker_id_and_by_its_own_cap(
    mgr: Manager, tmp_path: Path
) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(entries(mover={"workers": ["mover-*"], "max_streams": 3})))
    principals = Principals.from_settings(tokens_file=path, token=None)
    with BackgroundServer(create_app(mgr, principals=principals)) as server:
        hub = hub_of(server.app)
        hub.max_streams_per_caller = 1
        streams: list[SseReader] = []
        try:
            with client(server, "mover") as mover:
                for i in range(4):
                    assert mover.put(f"/v1/workers/mover-{i}",
                                     json={"services": ["replication"]}).is_success
            for i in range(3):  # one principal, many workers: counted per worker id
                streams.append(_watch(server, f"/v1/workers/mover-{i}/watch", "mover"))
                assert streams[-1].status == 200, streams[-1].error
            again = _watch(server, "/v1/workers/mover-0/watch", "mover")
            streams.append(again)
            assert again.status == 429 and "most per caller" in again.error["detail"]
            over = _watch(server, "/v1/workers/mover-3/watch", "mover")
            streams.append(over)
            assert over.status == 429 and "'max_streams'" in over.error["detail"]
            # refused before anything is read: an unregistered worker is a 429, not a 404
            unknown = _watch(server, "/v1/workers/mover-404/watch", "mover")
            streams.append(unknown)
            assert unknown.status == 429
        finally:
            for s in streams:
                s.close()
        wait_until(lambda: hub.open_streams() == 0, 10, what="closed streams counted out")


def test_max_streams_in_the_tokens_file_must_be_a_positive_integer(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    for bad in (0, -1, "3", True, 1.5):
        path.write_text(json.dumps(entries(mover={"max_streams": bad})))
        with pytest.raises(InvalidInput, match="'max_streams' must be a positive integer"):
            Principals.from_settings(tokens_file=path, token=None)
