"""The worker protocol over HTTP (docs/http.md, "Workers over HTTP") against a real sidecar
(uvicorn on 127.0.0.1) on SQLite and on ZooKeeper: an HTTP worker registers, watches and
acknowledges, and a pause stays ``pausing`` until it acknowledged, exactly as for a Python
agent (docs/agent.md); stale acknowledgements are 409s carrying the record, a watch resumes
from ``Last-Event-ID`` or is told to re-list (410), removals arrive as events to acknowledge,
a lease that lapses stops blocking, and streams are limited.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from locstatus import State, connect
from locstatus.agent import Agent
from locstatus.api import create_app
from locstatus.api.server import BackgroundServer
from locstatus.api.watch import WatchHub
from locstatus.api.workers import hub_of
from locstatus.client import Client

from support.kit_table import KIT_FACTORIES
from support.kits_zk import wait_until
from support.sse import SseReader

LOCATIONS = ["eu-west-1", "us-east-1"]
JSON = {"Content-Type": "application/json"}


@pytest.fixture(params=["sqlite", "zk"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    kit = KIT_FACTORIES[request.param](request, tmp_path)
    try:
        yield kit.url
    finally:
        kit.close()


@pytest.fixture
def mgr(url: str) -> Iterator[Client]:
    m = connect(url)
    m.sync_locations(LOCATIONS)
    yield m
    m.close()


@pytest.fixture
def server(mgr: Client) -> Iterator[BackgroundServer]:
    with BackgroundServer(create_app(mgr)) as s:
        yield s


@pytest.fixture
def http(server: BackgroundServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=JSON, timeout=30) as c:
        yield c


def register(http: httpx.Client, wid: str, **body: Any) -> dict[str, Any]:
    body.setdefault("services", ["replication"])
    r = http.put(f"/v1/workers/{wid}", json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def watch(server: BackgroundServer, wid: str | None, **headers: str) -> SseReader:
    path = f"/v1/workers/{wid}/watch" if wid else "/v1/watch"
    return SseReader(f"{server.url}{path}?heartbeat=0.2", headers)


def state(mgr: Client, loc: str = "us-east-1") -> State:
    return mgr.status(loc).services["replication"].state


def pause_in_background(http: httpx.Client, loc: str = "us-east-1") -> threading.Thread:
    t = threading.Thread(
        target=lambda: http.post(f"/v1/locations/{loc}/replication/pause", json={}), daemon=True
    )
    t.start()
    return t


def test_http_worker_holds_pausing_until_it_acknowledges_beside_a_python_agent(
    server: BackgroundServer, http: httpx.Client, mgr: Client
) -> None:
    register(http, "node-1", lease_seconds=10)
    stream = watch(server, "node-1")
    try:
        snap = stream.next("snapshot")
        assert {r["location"] for r in snap.data["records"]} == set(LOCATIONS)
        assert snap.id and snap.id.endswith("-" + snap.id.rsplit("-", 1)[1])
        paused_by_agent: list[str] = []
        agent = Agent(mgr, "py-1", services=["replication"], lease_seconds=5)
        agent.on_pause("replication")(paused_by_agent.append)
        with agent:
            wait_until(lambda: len(mgr.workers()) == 2, 10, what="both registered")
            r = http.post("/v1/locations/us-east-1/replication/pause", json={})
            assert r.status_code == 200
            ev = stream.next("location")
            assert ev.data["location"] == "us-east-1" and ev.id and ev.id > snap.id
            rec = ev.data["record"]
            assert rec["services"]["replication"]["state"] == "pausing"
            wait_until(lambda: paused_by_agent == ["us-east-1"], 10, what="agent's on_pause")
            time.sleep(1.0)  # the agent acknowledged; the HTTP worker has not
            assert state(mgr) is State.PAUSING
            lagging = mgr.lagging("us-east-1", "replication")
            assert lagging == ["node-1"]
            gen = rec["services"]["replication"]["generation"]
            r = http.put(
                "/v1/workers/node-1/acks/us-east-1/replication",
                json={"generation": gen, "if_version": rec["version"]},
            )
            assert r.status_code == 200, r.text
            wait_until(lambda: state(mgr) is State.PAUSED, 10, what="settled after both acks")
            ev = stream.next("location")
            assert ev.data["record"]["services"]["replication"]["state"] == "paused"
    finally:
        stream.close()


def test_a_stale_acknowledgement_is_a_409_with_the_record_to_apply(
    http: httpx.Client, mgr: Client
) -> None:
    register(http, "node-1")
    first = mgr.pause("us-east-1", "replication")
    mgr.resume("us-east-1", "replication")  # moved on while the worker applied the pause
    gen = first.services["replication"].generation
    r = http.put(
        "/v1/workers/node-1/acks/us-east-1/replication",
        json={"generation": gen, "if_version": first.version},
    )
    assert r.status_code == 409
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["type"] == "urn:locstatus:version-conflict"
    now = body["record"]
    assert now["services"]["replication"]["state"] == "resuming"
    assert mgr.backend.acks("us-east-1").get("node-1", {}).get("replication") is None
    r = http.put(
        "/v1/workers/node-1/acks/us-east-1/replication",
        json={"generation": now["services"]["replication"]["generation"],
              "if_version": now["version"]},
    )
    assert r.status_code == 200
    wait_until(lambda: state(mgr) is State.RUNNING, 10, what="resume settled")


def test_last_event_id_resumes_without_loss_and_a_stale_cursor_is_a_410(
    server: BackgroundServer, http: httpx.Client, mgr: Client
) -> None:
    register(http, "node-1")
    stream = watch(server, "node-1")
    snap = stream.next("snapshot")
    stream.close()
    mgr.pause("us-east-1", "replication")  # missed while disconnected
    mgr.pause("eu-west-1", "replication")
    resumed = watch(server, "node-1", **{"Last-Event-ID": snap.id or ""})
    try:
        seen = {}
        for _ in range(2):
            ev = resumed.next("location")
            seen[ev.data["location"]] = ev.data["record"]["services"]["replication"]["state"]
        assert seen == {"us-east-1": "pausing", "eu-west-1": "pausing"} or set(
            seen.values()
        ) <= {"pausing", "paused"}
    finally:
        resumed.close()
    for cursor in ("not-an-id", "0123456789ab-5", f"{snap.id}999"):
        gone = watch(server, "node-1", **{"Last-Event-ID": cursor})
        assert gone.status == 410, cursor
        assert gone.error["type"] == "urn:locstatus:stale-cursor"
        gone.close()


def test_a_cursor_older_than_the_buffer_is_told_to_relist(
    server: BackgroundServer, http: httpx.Client, mgr: Client
) -> None:
    hub = server.app.state.watch_hub = WatchHub(mgr, buffer=4)
    register(http, "node-1")
    stream = watch(server, "node-1")
    snap = stream.next("snapshot")
    stream.close()
    for i in range(3):  # six events, each waited for (hints coalesce): the buffer holds four
        for op in (mgr.pause, mgr.resume):
            before = hub.stats["events"]
            op("us-east-1", "replication")
            wait_until(lambda b=before: hub.stats["events"] > b, 10, what=f"event of round {i}")
    gone = watch(server, "node-1", **{"Last-Event-ID": snap.id or ""})
    assert gone.status == 410
    assert "re-list" in gone.error["detail"]
    fresh = watch(server, "node-1")  # re-listing works
    try:
        snap2 = fresh.next("snapshot")
        (us,) = [r for r in snap2.data["records"] if r["location"] == "us-east-1"]
        assert us["record"]["services"]["replication"]["generation"] == 6
    finally:
        fresh.close()


def test_a_removal_is_an_event_acknowledged_as_a_tombstone(
    server: BackgroundServer, http: httpx.Client, mgr: Client
) -> None:
    register(http, "node-1")
    stream = watch(server, "node-1")
    try:
        stream.next("snapshot")
        mgr.remove_location("eu-west-1")
        ev = stream.next("location")
        assert ev.data["location"] == "eu-west-1" and ev.data["removed"] is True
        gen = ev.data["remove_generation"]
        assert isinstance(gen, int) and gen > 0
        r = http.put(
            f"/v1/workers/node-1/acks/eu-west-1/{ev.data['remove_service']}",
            json={"generation": gen, "if_version": ev.data["record"]["version"]},
        )
        assert r.status_code == 200, r.text
        assert mgr.backend.acks("eu-west-1")["node-1"]["_tombstone"] == gen
    finally:
        stream.close()


def test_a_lapsed_lease_stops_blocking_and_its_acks_are_refused(
    http: httpx.Client, mgr: Client
) -> None:
    register(http, "node-1", lease_seconds=1)
    mgr.pause("us-east-1", "replication")
    assert state(mgr) is State.PAUSING  # node-1 applies it and has not acknowledged
    # what the sidecar's reconciler does: settle; it goes through once the lease lapsed
    wait_until(
        lambda: mgr.settle("us-east-1").services["replication"].state is State.PAUSED, 15,
        what="settled once the lease lapsed",
    )
    rec = mgr.status("us-east-1")
    r = http.put(
        "/v1/workers/node-1/acks/us-east-1/replication",
        json={"generation": rec.services["replication"].generation, "if_version": rec.version},
    )
    assert r.status_code == 409 and r.json()["type"] == "urn:locstatus:lease-lapsed"


def test_registration_is_idempotent_and_delete_unregisters(
    http: httpx.Client, mgr: Client
) -> None:
    a = register(http, "node-1", errors={"us-east-1/replication": "boom"})
    b = register(http, "node-1", errors={"us-east-1/replication": "boom"})
    assert b["lease_expires_at"] >= a["lease_expires_at"]
    (w,) = [w for w in http.get("/v1/workers").json() if w["worker_id"] == "node-1"]
    assert w["errors"] == {"us-east-1/replication": "boom"} and w["alive"] is True
    assert w["lease_expires_at"] is not None
    mgr.pause("us-east-1", "replication")
    assert state(mgr) is State.PAUSING
    r = http.delete("/v1/workers/node-1")
    assert r.status_code == 200 and r.json() == {"worker_id": "node-1", "removed": True}
    assert http.delete("/v1/workers/node-1").json()["removed"] is False
    mgr.settle("us-east-1")
    assert state(mgr) is State.PAUSED


def test_delete_and_an_ordinary_put_never_end_a_standing_registration(
    http: httpx.Client, mgr: Client
) -> None:
    """docs/agent.md "Standing registrations": only a retirement ends one. ``DELETE
    /v1/workers/{id}`` of a standing registration (its holder away) is a 409 naming
    ``locstatus workers retire``, and an ordinary ``PUT`` of its id too: nothing removed or
    replaced, so a pause made then stays pausing until it is retired. (Once, the loopback
    DELETE, with no token, removed the Backbeat bridge's processor and the pause settled.)"""
    wid = "backbeat.replication.zenko"
    held = Agent(mgr, wid, services=["replication"], locations=["us-east-1"], standing=True)
    held.start()
    held.stop()  # left standing, its holder away
    r = http.delete(f"/v1/workers/{wid}")
    assert r.status_code == 409, r.text
    assert f"locstatus workers retire {wid}" in r.json()["detail"]
    r = http.put(f"/v1/workers/{wid}", json={"services": ["replication"]})
    assert r.status_code == 409, r.text
    assert f"locstatus workers retire {wid}" in r.json()["detail"]
    assert [(w.worker_id, w.standing) for w in mgr.workers()] == [(wid, True)]
    mgr.pause("us-east-1", "replication")
    time.sleep(0.5)
    mgr.settle("us-east-1")
    assert state(mgr) is State.PAUSING  # waits for what the standing registration stands for
    mgr.retire_worker(wid, actor="test")
    mgr.settle("us-east-1")
    assert state(mgr) is State.PAUSED and mgr.workers() == []


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("PUT", "/v1/workers/all", {"services": ["replication"]}, 400),
        ("PUT", "/v1/workers/a%20b", {"services": ["replication"]}, 400),
        ("PUT", "/v1/workers/w", {"services": ["nope"]}, 404),
        ("PUT", "/v1/workers/w", {"services": []}, 422),
        ("PUT", "/v1/workers/w", {"services": ["replication"], "lease_seconds": 0}, 422),
        ("PUT", "/v1/workers/w", {"services": ["replication"], "extra": 1}, 422),
        ("PUT", "/v1/workers/w", {"services": ["replication"], "locations": ["all"]}, 400),
        ("PUT", "/v1/workers/ghost/acks/us-east-1/replication", {"generation": 1}, 404),
        ("PUT", "/v1/workers/w/acks/us-east-1/replication", {"generation": -1}, 422),
        ("GET", "/v1/workers/ghost/watch", None, 404),
    ],
)
def test_bad_input_is_a_problem_naming_it(
    http: httpx.Client, method: str, path: str, body: Any, status: int
) -> None:
    r = http.request(method, path, json=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["detail"]


def test_an_ack_for_a_service_the_worker_does_not_apply_is_refused(
    http: httpx.Client, mgr: Client
) -> None:
    register(http, "node-1", locations=["eu-west-1"])
    r = http.put("/v1/workers/node-1/acks/us-east-1/replication", json={"generation": 1})
    assert r.status_code == 400 and "does not apply" in r.json()["detail"]
    assert "node-1" not in mgr.backend.acks("us-east-1")


def test_streams_are_limited_per_caller_and_per_sidecar(
    server: BackgroundServer, http: httpx.Client
) -> None:
    hub = hub_of(server.app)
    hub.max_streams_per_caller = 2
    register(http, "node-1")
    open_ = [watch(server, "node-1") for _ in range(2)]
    try:
        refused = watch(server, "node-1")
        assert refused.status == 429 and refused.error["type"] == "urn:locstatus:too-many-streams"
        hub.max_streams = 3
        other = watch(server, None)
        assert other.status == 200
        assert watch(server, None).status == 429
        other.close()
    finally:
        for s in open_:
            s.close()
    wait_until(lambda: hub.open_streams() == 0, 10, what="closed streams counted out")


def test_heartbeats_keep_a_quiet_stream_alive(server: BackgroundServer, http: httpx.Client) -> None:
    register(http, "node-1")
    stream = watch(server, "node-1")
    try:
        stream.next("snapshot")
        beats = [stream.next("heartbeat", timeout=5) for _ in range(3)]
        assert all(b.id is None and "server_time" in b.data for b in beats)
    finally:
        stream.close()


def test_the_worker_routes_are_in_the_openapi_document(http: httpx.Client) -> None:
    doc = http.get("/openapi.json").json()
    paths = doc["paths"]
    assert {"put", "delete"} <= set(paths["/v1/workers/{worker_id}"])
    assert "put" in paths["/v1/workers/{worker_id}/acks/{location}/{service}"]
    watch_doc = paths["/v1/workers/{worker_id}/watch"]["get"]
    assert "text/event-stream" in watch_doc["responses"]["200"]["content"]
    assert "410" in watch_doc["responses"] and "429" in watch_doc["responses"]


@pytest.mark.parametrize("kind", ["sqlite", "zk"])
def test_a_corrupt_record_reaches_the_worker_as_a_corrupt_event_not_silence(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """docs/http.md "Workers over HTTP": a record that cannot be read is a ``corrupt`` event
    (and a ``corrupt`` member of a snapshot); the good record read after it is published even
    when it equals the last good one, so the worker clears the error it reports."""
    kit = KIT_FACTORIES[kind](request, tmp_path)
    mgr = connect(kit.url)
    try:
        mgr.sync_locations(LOCATIONS)
        good = mgr.status("us-east-1").model_dump_json(include={"services", "deleted_at"})
        with BackgroundServer(create_app(mgr)) as srv, \
                httpx.Client(base_url=srv.url, headers=JSON, timeout=30) as http:
            register(http, "node-1")
            stream = watch(srv, "node-1")
            try:
                stream.next("snapshot")
                kit.write_raw("us-east-1", '{"services": {"replication": {"state": 7}}}')
                ev = stream.next("corrupt")
                assert ev.id and ev.data["location"] == "us-east-1"
                assert "services.replication" in ev.data["detail"]
                # A new stream is told in its snapshot, with the last good record kept.
                other = watch(srv, "node-1")
                try:
                    snap = other.next("snapshot").data
                    assert [c["location"] for c in snap["corrupt"]] == ["us-east-1"]
                    assert "us-east-1" in [r["location"] for r in snap["records"]]
                finally:
                    other.close()
                kit.write_raw("us-east-1", good)  # repaired by hand
                fixed = stream.next("location")
                assert fixed.data["location"] == "us-east-1"
                assert fixed.data["record"]["services"]["replication"]["state"] == "running"
            finally:
                stream.close()
    finally:
        mgr.close()
        kit.close()


def test_an_ack_of_a_generation_the_record_does_not_have_is_refused_and_not_written(
    http: httpx.Client, mgr: Client
) -> None:
    """A worker that acknowledged a generation ahead of the record would count as having
    applied every later pause too: a later pause would settle without it."""
    register(http, "mover-1")
    current = mgr.status("us-east-1")
    gen = current.services["replication"].generation
    path = "/v1/workers/mover-1/acks/us-east-1/replication"
    for body in (
        {"generation": gen + 1_000_000},
        {"generation": 2**62, "if_version": current.version},
        {"generation": gen + 1, "if_version": current.version},
    ):
        r = http.put(path, json=body)
        assert r.status_code in (409, 422), (body, r.text)
        assert r.headers["content-type"] == "application/problem+json"
        assert "generation" in r.json()["detail"], r.text
        assert mgr.backend.acks("us-east-1").get("mover-1") is None, body
    r = http.put("/v1/workers/mover-1/acks/us-east-1/_tombstone", json={"generation": 2**62})
    assert r.status_code in (409, 422), r.text
    assert mgr.backend.acks("us-east-1").get("mover-1") is None
    # The pause waits for mover-1, which has acknowledged nothing it applied.
    r = http.post("/v1/locations/us-east-1/replication/pause", json={"wait": 1})
    assert state(mgr) is State.PAUSING, r.text  # the wait ran out: mover-1 lags
    now = mgr.status("us-east-1")
    r = http.put(path, json={"generation": now.services["replication"].generation,
                             "if_version": now.version})
    assert r.status_code == 200, r.text
    wait_until(lambda: state(mgr) is State.PAUSED, 10, what="settled after the real ack")
