"""The sidecar's native ``/v1`` routes over real HTTP (uvicorn on 127.0.0.1, httpx) against a real
backend (docs/design.md §5.3), plus the ``serve`` rules: auth, bind refusal, no secret in logs or errors.

Scenarios read like an operator's: pause one / all, pause what is already paused (no write),
resume, schedule with ``at`` / ``in_seconds``, overwrite a schedule, a manual pause or resume
cancels a schedule, scheduling a running service is refused, and the scheduled resume fires when
a controllable clock reaches it (no sleeping).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

import locstatus
from locstatus import InvalidInput, Manager, State, open_backend
from locstatus.api import create_app
from locstatus.api.principals import hash_token
from locstatus.api.server import BackgroundServer, bind_socket, is_loopback, serve
from locstatus.fsm.diagram import mermaid
from locstatus.models import WorkerInfo
from locstatus.reconciler import Reconciler

from support.fakeclock import FakeClock
from support.kits import Kit

TOKEN = "tok-9f1c2e-never-print-me"
LOCATIONS = ["eu-west-1", "us-east-1", "us-east-2"]
START = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
PROBLEM = "application/problem+json"
JSON = {"Content-Type": "application/json"}
"""What a client of the native API sends with every mutation, with or without a body
(docs/http.md, "Requests from browsers"); the test clients send it by default."""





@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def mgr(backend_url: str, clock: FakeClock) -> Iterator[Manager]:
    m = Manager(open_backend(backend_url), clock=clock)
    m.sync_locations(LOCATIONS)
    yield m
    m.close()


@pytest.fixture
def server(mgr: Manager, clock: FakeClock) -> Iterator[BackgroundServer]:
    with BackgroundServer(create_app(mgr, token=TOKEN)) as srv:
        yield srv


@pytest.fixture
def http(server: BackgroundServer) -> Iterator[httpx.Client]:
    """An authorised client."""
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}", **JSON}, timeout=60
    ) as c:
        yield c


@pytest.fixture
def anon(server: BackgroundServer) -> Iterator[httpx.Client]:
    """A client without credentials."""
    with httpx.Client(base_url=server.url, headers=JSON, timeout=60) as c:
        yield c


def svc(body: dict[str, Any], service: str = "replication") -> dict[str, Any]:
    result: dict[str, Any] = body["services"][service]
    return result


def history_events(mgr: Manager, location: str, service: str = "replication") -> list[str]:
    return [e.event for e in reversed(mgr.history(location, limit=1000)) if e.service == service]


def assert_problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = r.json()
    assert body["status"] == status and body["title"]
    assert TOKEN not in r.text
    return body


# -- reads --------------------------------------------------------------------------------------


def test_list_and_get_locations_with_etag(http: httpx.Client, mgr: Manager) -> None:
    r = http.get("/v1/locations")
    assert r.status_code == 200
    assert [loc["location"] for loc in r.json()] == LOCATIONS
    r = http.get("/v1/locations/us-east-1")
    assert r.status_code == 200
    body = r.json()
    assert body["location"] == "us-east-1"
    assert set(body["services"]) == {"replication", "lifecycle", "ingestion"}
    assert r.headers["etag"] == f'"{mgr.status("us-east-1").version}"' == f'"{body["version"]}"'
    # If-None-Match with the current version: 304; with an older one: the document.
    r2 = http.get("/v1/locations/us-east-1", headers={"If-None-Match": r.headers["etag"]})
    assert r2.status_code == 304 and r2.headers["etag"] == r.headers["etag"]
    r3 = http.get("/v1/locations/us-east-1", headers={"If-None-Match": '"1234567"'})
    assert r3.status_code == 200


def test_reads_need_no_token(anon: httpx.Client) -> None:
    for path in ("/v1/locations", "/v1/locations/us-east-1", "/v1/workers", "/v1/fsm",
                 "/v1/locations/us-east-1/history", "/healthz", "/readyz", "/metrics", "/"):
        assert anon.get(path).status_code == 200, path


def test_unknown_and_invalid_names(http: httpx.Client) -> None:
    assert "nowhere" in assert_problem(http.get("/v1/locations/nowhere"), 404)["detail"]
    assert_problem(http.get("/v1/locations/nowhere/history"), 404)
    assert_problem(http.post("/v1/locations/nowhere/replication/pause"), 404)
    body = assert_problem(http.post("/v1/locations/us-east-1/teleport/pause"), 404)
    assert "teleport" in body["detail"]
    for bad in ("-dash-first", "a" * 129, "sp%20ace", "...", ".hidden", "%C3%A9t%C3%A9"):
        assert_problem(http.get(f"/v1/locations/{bad}"), 400)
        assert_problem(http.post(f"/v1/locations/{bad}/replication/pause"), 400)


# -- pause --------------------------------------------------------------------------------------


def test_pause_one_location(http: httpx.Client, mgr: Manager) -> None:
    before = mgr.status("us-east-1").version
    r = http.post("/v1/locations/us-east-1/replication/pause",
                  json={"reason": "maintenance", "actor": "ops"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert svc(body)["state"] == "paused"  # no live worker: settled in the write after it
    assert svc(body)["reason"] == "maintenance" and svc(body)["actor"] == "ops"
    assert svc(body, "lifecycle")["state"] == "running"
    assert body["version"] == before + 2 and r.headers["etag"] == f'"{before + 2}"'
    assert history_events(mgr, "us-east-1")[-2:] == ["pause", "settle"]
    for other in ("us-east-2", "eu-west-1"):
        assert mgr.status(other).services["replication"].state is State.RUNNING


def test_crr_alias_and_every_service(http: httpx.Client, mgr: Manager) -> None:
    assert http.post("/v1/locations/us-east-2/crr/pause").status_code == 200
    assert mgr.status("us-east-2").services["replication"].state is State.PAUSED
    r = http.post("/v1/locations/eu-west-1/all/pause")
    assert r.status_code == 200
    assert {s["state"] for s in r.json()["services"].values()} == {"paused"}


def test_pause_all_locations(http: httpx.Client, mgr: Manager) -> None:
    r = http.post("/v1/locations/all/replication/pause", json={"reason": "outage"})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert sorted(results) == LOCATIONS
    for loc in LOCATIONS:
        assert svc(results[loc]["status"])["state"] == "paused"
        assert mgr.status(loc).services["replication"].state is State.PAUSED
        assert mgr.status(loc).services["lifecycle"].state is State.RUNNING


def test_pause_already_paused_is_a_noop(http: httpx.Client, mgr: Manager) -> None:
    first = http.post("/v1/locations/us-east-1/replication/pause", json={"reason": "first"})
    entries = len(mgr.history("us-east-1", limit=1000))
    again = http.post("/v1/locations/us-east-1/replication/pause", json={"reason": "second"})
    assert again.status_code == 200
    assert again.json() == first.json()  # same version, same reason: nothing written
    assert again.headers["etag"] == first.headers["etag"]
    assert len(mgr.history("us-east-1", limit=1000)) == entries
    # Bulk pause of already-paused locations writes nothing either.
    version = mgr.status("us-east-1").version
    assert http.post("/v1/locations/all/replication/pause").status_code == 200
    assert mgr.status("us-east-1").version == version


# -- resume and schedule --------------------------------------------------------------------------


def test_resume(http: httpx.Client, mgr: Manager) -> None:
    http.post("/v1/locations/us-east-1/replication/pause")
    r = http.post("/v1/locations/us-east-1/replication/resume", json={"actor": "ops"})
    assert r.status_code == 200, r.text
    assert svc(r.json())["state"] == "running"
    assert svc(r.json())["generation"] == 2
    assert history_events(mgr, "us-east-1")[-2:] == ["resume", "settle"]
    # Resuming a running service: success, nothing written.
    version = mgr.status("us-east-1").version
    again = http.post("/v1/locations/us-east-1/replication/resume")
    assert again.status_code == 200 and again.json()["version"] == version


def test_schedule_with_at_and_in_seconds(
    http: httpx.Client, mgr: Manager, clock: FakeClock
) -> None:
    http.post("/v1/locations/all/replication/pause")
    at = clock() + timedelta(hours=2)
    r = http.post("/v1/locations/us-east-1/replication/resume",
                  json={"at": at.isoformat(), "reason": "window ends"})
    assert r.status_code == 200, r.text
    assert svc(r.json())["state"] == "paused"
    assert datetime.fromisoformat(svc(r.json())["resume_at"]) == at
    # An offset is accepted and stored in UTC.
    local = (clock() + timedelta(hours=3)).astimezone(
        __import__("datetime").timezone(timedelta(hours=5, minutes=30))
    )
    r = http.post("/v1/locations/eu-west-1/replication/resume", json={"at": local.isoformat()})
    assert mgr.status("eu-west-1").services["replication"].resume_at == clock() + timedelta(hours=3)
    assert svc(r.json())["resume_at"].endswith("Z")
    r = http.post("/v1/locations/us-east-2/replication/resume", json={"in_seconds": 5400})
    assert r.status_code == 200
    assert mgr.status("us-east-2").services["replication"].resume_at == clock() + timedelta(
        seconds=5400
    )
    assert history_events(mgr, "us-east-2")[-1] == "schedule_resume"


def test_overwrite_a_schedule(http: httpx.Client, mgr: Manager, clock: FakeClock) -> None:
    http.post("/v1/locations/us-east-1/replication/pause")
    http.post("/v1/locations/us-east-1/replication/resume", json={"in_seconds": 3600})
    r = http.post("/v1/locations/us-east-1/replication/resume", json={"in_seconds": 600})
    assert r.status_code == 200
    assert mgr.status("us-east-1").services["replication"].resume_at == clock() + timedelta(
        seconds=600
    )
    assert history_events(mgr, "us-east-1")[-2:] == ["schedule_resume", "schedule_resume"]


def test_moving_an_existing_schedule_for_all_says_rescheduled_and_when_it_was(
    http: httpx.Client, mgr: Manager, clock: FakeClock
) -> None:
    """Issue 20: ``resume all`` in 1 h over a 2 h schedule names the time it replaced; a new
    schedule has no ``rescheduled`` member."""
    http.post("/v1/locations/all/replication/pause")
    first = http.post("/v1/locations/all/replication/resume", json={"in_seconds": 7200})
    assert first.status_code == 200
    assert all("rescheduled" not in item for item in first.json()["results"].values())
    was = (clock() + timedelta(seconds=7200)).isoformat().replace("+00:00", "Z")
    r = http.post("/v1/locations/all/replication/resume", json={"in_seconds": 3600})
    assert r.status_code == 200
    results = r.json()["results"]
    assert set(results) == set(LOCATIONS)
    for item in results.values():
        assert item["rescheduled"] == {"replication": was}
        assert item["status"]["services"]["replication"]["resume_at"].startswith(
            (clock() + timedelta(seconds=3600)).strftime("%Y-%m-%dT%H:%M:%S")
        )
    same = http.post("/v1/locations/all/replication/resume", json={"in_seconds": 3600})
    assert all("rescheduled" not in item for item in same.json()["results"].values())


def test_manual_pause_or_resume_cancels_a_schedule(http: httpx.Client, mgr: Manager) -> None:
    http.post("/v1/locations/all/replication/pause")
    for loc in ("us-east-1", "us-east-2"):
        http.post(f"/v1/locations/{loc}/replication/resume", json={"in_seconds": 3600})
    r = http.post("/v1/locations/us-east-1/replication/pause", json={"reason": "extend"})
    assert svc(r.json())["state"] == "paused" and svc(r.json())["resume_at"] is None
    assert history_events(mgr, "us-east-1")[-1] == "pause"
    r = http.post("/v1/locations/us-east-2/replication/resume")
    assert svc(r.json())["state"] == "running" and svc(r.json())["resume_at"] is None


def test_cancel_schedule(http: httpx.Client, mgr: Manager) -> None:
    http.post("/v1/locations/us-east-1/replication/pause")
    http.post("/v1/locations/us-east-1/replication/resume", json={"in_seconds": 60})
    r = http.request("DELETE", "/v1/locations/us-east-1/replication/schedule",
                     json={"actor": "ops"})
    assert r.status_code == 200 and svc(r.json())["resume_at"] is None
    assert svc(r.json())["state"] == "paused"
    version = mgr.status("us-east-1").version
    r = http.delete("/v1/locations/us-east-1/replication/schedule")  # nothing scheduled: no-op
    assert r.status_code == 200 and r.json()["version"] == version


def test_schedule_on_an_active_location_is_refused(http: httpx.Client, mgr: Manager) -> None:
    version = mgr.status("us-east-1").version
    r = http.post("/v1/locations/us-east-1/replication/resume", json={"in_seconds": 60})
    body = assert_problem(r, 409)
    assert body["type"] == "urn:locstatus:invalid-transition"
    assert "running" in body["detail"]
    assert mgr.status("us-east-1").version == version
    # Bulk: scheduling targets paused locations; with none paused it is refused too.
    assert_problem(http.post("/v1/locations/all/replication/resume", json={"in_seconds": 60}), 409)
    http.post("/v1/locations/us-east-2/replication/pause")
    r = http.post("/v1/locations/all/replication/resume", json={"in_seconds": 60})
    assert r.status_code == 200 and list(r.json()["results"]) == ["us-east-2"]


def test_schedule_in_the_past_is_bad_input(
    http: httpx.Client, mgr: Manager, clock: FakeClock
) -> None:
    http.post("/v1/locations/us-east-1/replication/pause")
    past = (clock() - timedelta(seconds=1)).isoformat()
    assert_problem(http.post("/v1/locations/us-east-1/replication/resume", json={"at": past}), 400)


def test_scheduled_resume_fires_on_time(
    http: httpx.Client, mgr: Manager, clock: FakeClock
) -> None:
    http.post("/v1/locations/us-east-1/replication/pause")
    http.post("/v1/locations/us-east-1/replication/resume", json={"in_seconds": 3600})
    reconciler = Reconciler(mgr, interval=60)
    clock.advance(3599)
    assert reconciler.run_once().fired == []
    assert http.get("/v1/locations/us-east-1").json()["services"]["replication"]["state"] == (
        "paused"
    )
    clock.advance(1)
    assert reconciler.run_once().fired == [("us-east-1", "replication")]
    body = http.get("/v1/locations/us-east-1").json()
    assert svc(body)["state"] == "running" and svc(body)["resume_at"] is None
    assert history_events(mgr, "us-east-1").count("resume_due") == 1
    assert reconciler.run_once().fired == []  # fires once


def test_wait_reports_lagging_workers(http: httpx.Client, mgr: Manager, clock: FakeClock) -> None:
    mgr.backend.put_worker(WorkerInfo(
        worker_id="w-slow", services=("replication",), locations=("us-east-2",),
        lease_expires_at=clock() + timedelta(hours=1),
    ))
    r = http.post("/v1/locations/us-east-2/replication/pause", json={"wait": 0.2})
    body = assert_problem(r, 504)
    assert body["lagging"] == ["w-slow"]
    assert mgr.status("us-east-2").services["replication"].state is State.PAUSING
    # Bulk: the other locations succeed, the lagging one is reported; never a 200.
    r = http.post("/v1/locations/all/replication/resume", json={"wait": 0.2})
    body = assert_problem(r, 504)
    results = body["results"]
    assert results["us-east-2"]["error"]["lagging"] == ["w-slow"]
    assert "status" in results["us-east-1"] and "status" in results["eu-west-1"]
    # Once the worker acknowledges, the wait succeeds.
    gen = mgr.status("us-east-2").services["replication"].generation
    mgr.backend.ack("w-slow", "us-east-2", "replication", gen)
    r = http.post("/v1/locations/us-east-2/replication/resume", json={"wait": 10})
    assert r.status_code == 200 and svc(r.json())["state"] == "running"


# -- If-Match ---------------------------------------------------------------------------------


def test_if_match(http: httpx.Client, mgr: Manager) -> None:
    etag = http.get("/v1/locations/us-east-1").headers["etag"]
    version = int(etag.strip('"'))
    stale = f'"{version - 1}"'
    body = assert_problem(
        http.post("/v1/locations/us-east-1/replication/pause", headers={"If-Match": stale}), 412
    )
    assert str(version) in body["detail"]
    assert mgr.status("us-east-1").version == version
    r = http.post("/v1/locations/us-east-1/replication/pause", headers={"If-Match": etag})
    assert r.status_code == 200 and r.headers["etag"] == f'"{version + 2}"'  # and settled
    # Weak and unquoted forms, lists and * are accepted.
    for form in ('W/"{v}"', "{v}", '"1", "{v}"', "*"):
        current = mgr.status("us-east-1").version
        header = form.format(v=current)
        r = http.post("/v1/locations/us-east-1/replication/resume", headers={"If-Match": header})
        assert r.status_code == 200, (header, r.text)
        assert r.json()["version"] == current + 2
        r = http.post("/v1/locations/us-east-1/replication/pause")
    assert_problem(http.post("/v1/locations/us-east-1/replication/pause",
                             headers={"If-Match": '"1", "2"'}), 412)
    assert_problem(http.post("/v1/locations/us-east-1/replication/pause",
                             headers={"If-Match": "banana"}), 400)
    assert_problem(http.post("/v1/locations/all/replication/pause",
                             headers={"If-Match": etag}), 400)


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"reason": "x", "surprise": 1},
        {"at": "2031-01-01T00:00:00"},  # naive
        {"at": "2031-01-01T00:00:00Z", "in_seconds": 5},
        {"in_seconds": 0},
        {"in_seconds": -3},
        {"in_seconds": 10**12},
        {"in_seconds": "soon"},
        {"in_seconds": 5, "wait": 1},
        {"wait": -1},
        {"reason": "r" * 1025},
        {"actor": "a" * 257},
        [1, 2],
    ],
)
def test_resume_body_validation(http: httpx.Client, mgr: Manager, body: object) -> None:
    http.post("/v1/locations/us-east-1/replication/pause")
    version = mgr.status("us-east-1").version
    r = http.post("/v1/locations/us-east-1/replication/resume", json=body)
    problem = assert_problem(r, 422)
    assert problem["errors"]
    assert mgr.status("us-east-1").version == version


@pytest.mark.parametrize(
    ("route", "body", "field", "needle"),
    [
        # valid datetimes whose UTC time is not one: a 500 (OverflowError) before
        ("resume", {"at": "9999-12-31T23:59:59-01:00"}, "at", "out of range"),
        ("resume", {"at": "0001-01-01T00:00:00+01:00"}, "at", "out of range"),
        # numbers were read as Unix times; docs/http.md says ISO 8601
        ("resume", {"at": 1924992000}, "at", "a number is not read as a Unix time"),
        ("resume", {"at": 1924992000.5}, "at", "ISO 8601"),
        ("resume", {"at": True}, "at", "ISO 8601"),
        # control characters a terminal acts on (locstatus status/history print them)
        ("pause", {"reason": "disk\x1b]0;owned\x07"}, "reason", "U+001B"),
        ("pause", {"actor": "ops\x1b[2K\x1b[1A"}, "actor", "U+001B"),
        ("resume", {"reason": "a\nb"}, "reason", "U+000A"),
        ("resume", {"at": "2031-01-01T00:00:00Z", "actor": "\x9b2J"}, "actor", "U+009B"),
        # bidirectional controls reorder what the terminal shows (not Cc, refused all the same)
        ("pause", {"reason": "fine \u202eemag"}, "reason", "U+202E"),
        ("pause", {"actor": "ops\u2066x\u2069"}, "actor", "U+2066"),
        ("resume", {"reason": "a\u2028b"}, "reason", "U+2028"),
    ],
)
def test_bad_times_and_control_characters_are_422_naming_the_field(
    http: httpx.Client, mgr: Manager, route: str, body: dict[str, Any], field: str, needle: str
) -> None:
    http.post("/v1/locations/all/replication/pause")
    before = {r.location: r.version for r in mgr.statuses()}
    for location in ("us-east-1", "all"):
        r = http.post(f"/v1/locations/{location}/replication/{route}", json=body)
        problem = assert_problem(r, 422)
        assert [e["loc"] for e in problem["errors"]] == [["body", field]]
        assert needle in problem["errors"][0]["msg"] and needle in problem["detail"]
    assert r.headers["content-type"].startswith(PROBLEM)
    assert {r.location: r.version for r in mgr.statuses()} == before


@pytest.mark.parametrize(
    ("method", "path", "raw", "key"),
    [
        ("POST", "/v1/locations/us-east-1/replication/pause",
         '{"reason": "planned", "reason": "other"}', "reason"),
        ("POST", "/v1/locations/all/replication/resume",
         '{"at": "2031-01-01T00:00:00Z", "at": "2032-01-01T00:00:00Z"}', "at"),
        ("DELETE", "/v1/locations/us-east-1/replication/schedule",
         '{"actor": "a", "reason": "r", "actor": "b"}', "actor"),
    ],
)
def test_a_body_with_a_key_twice_is_422_naming_the_key(
    http: httpx.Client, mgr: Manager, method: str, path: str, raw: str, key: str
) -> None:
    """JSON parsers keep one of two equal keys (the last): the body said two things and was
    read as one. Refused, naming the key, nothing written."""
    http.post("/v1/locations/all/replication/pause")
    before = {r.location: r.version for r in mgr.statuses()}
    r = http.request(method, path, content=raw, headers={"content-type": "application/json"})
    problem = assert_problem(r, 422)
    assert f"key {key!r} twice" in problem["detail"]
    assert {r.location: r.version for r in mgr.statuses()} == before


def test_cancel_refuses_control_characters_too(http: httpx.Client, mgr: Manager) -> None:
    version = mgr.status("us-east-1").version
    r = http.request("DELETE", "/v1/locations/us-east-1/replication/schedule",
                     json={"reason": "x\x1b[2J"})
    assert assert_problem(r, 422)["errors"][0]["loc"] == ["body", "reason"]
    assert mgr.status("us-east-1").version == version


def test_malformed_and_oversize_bodies(http: httpx.Client) -> None:
    r = http.post("/v1/locations/us-east-1/replication/pause", content=b"{nope",
                  headers={"content-type": "application/json"})
    assert_problem(r, 422)
    big = b'{"reason": "' + b"x" * (70 * 1024) + b'"}'
    r = http.post("/v1/locations/us-east-1/replication/pause", content=big,
                  headers={"content-type": "application/json"})
    assert_problem(r, 413)

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while streaming
        for _ in range(70):
            yield b"x" * 1024

    r = http.post("/v1/locations/us-east-1/replication/pause", content=chunks())
    assert_problem(r, 413)


def test_unknown_route_and_method(http: httpx.Client) -> None:
    assert_problem(http.get("/v2/anything"), 404)
    assert_problem(http.put("/v1/locations/us-east-1"), 405)


# -- auth -------------------------------------------------------------------------------------


def test_mutations_need_the_token(anon: httpx.Client, mgr: Manager) -> None:
    version = mgr.status("us-east-1").version
    for method, path in (
        ("POST", "/v1/locations/us-east-1/replication/pause"),
        ("POST", "/v1/locations/all/replication/resume"),
        ("DELETE", "/v1/locations/us-east-1/replication/schedule"),
    ):
        r = anon.request(method, path)
        assert_problem(r, 401)
        assert r.headers["www-authenticate"] == "Bearer"
        r = anon.request(method, path, headers={"Authorization": "Basic dXNlcjpwYXNz"})
        assert_problem(r, 401)
        r = anon.request(method, path, headers={"Authorization": f"Bearer {TOKEN}x"})
        assert_problem(r, 403)
        assert TOKEN not in r.text
    assert mgr.status("us-east-1").version == version


def test_no_token_means_open_mutations(mgr: Manager) -> None:
    with BackgroundServer(create_app(mgr)) as srv:
        r = httpx.post(srv.url + "/v1/locations/us-east-1/replication/pause", headers=JSON,
                       timeout=60)
        assert r.status_code == 200


# -- requests from browsers: cross-site forms and fetches, DNS rebinding ---------------------------

EVIL = "http://evil.example"


@pytest.fixture
def loopback(mgr: Manager) -> Iterator[str]:
    """A sidecar without a token on 127.0.0.1: its port is its only protection."""
    with BackgroundServer(create_app(mgr)) as srv:
        yield srv.url


def versions(mgr: Manager) -> dict[str, int]:
    return {r.location: r.version for r in mgr.statuses()}


@pytest.mark.parametrize(
    ("headers", "body", "status"),
    [
        # what a page on another site can send without the browser asking first (no preflight)
        ({"Origin": EVIL, "Content-Type": "text/plain"}, b"", 403),
        ({"Origin": EVIL, "Content-Type": "application/x-www-form-urlencoded"}, b"a=1", 403),
        ({"Origin": EVIL, "Content-Type": "multipart/form-data; boundary=x"}, b"", 403),
        ({"Origin": EVIL}, b"", 403),  # fetch(url, {method: "POST", mode: "no-cors"})
        ({"Origin": "null"}, b"", 403),  # sandboxed iframe, file: page
        ({"Origin": EVIL, **JSON}, b"{}", 403),  # would need a preflight, refused anyway
        # no Origin (an old browser, a plugin): the body type alone must give it away
        ({"Content-Type": "text/plain"}, b"", 415),
        ({"Content-Type": "application/x-www-form-urlencoded"}, b"reason=x", 415),
        ({"Content-Type": "text/plain"}, b'{"reason": "x"}', 415),
        ({}, b"", 415),
    ],
)
def test_a_cross_site_mutation_is_refused_and_changes_nothing(
    loopback: str, mgr: Manager, headers: dict[str, str], body: bytes, status: int
) -> None:
    """A page on another origin paused every location of a token-less loopback sidecar: an
    empty text/plain or form body was accepted and Origin was not checked."""
    before = versions(mgr)
    for method, path in (
        ("POST", "/v1/locations/all/replication/pause"),
        ("POST", "/v1/locations/us-east-1/all/pause"),
        ("POST", "/v1/locations/all/all/resume"),
        ("DELETE", "/v1/locations/us-east-1/replication/schedule"),
    ):
        r = httpx.request(method, loopback + path, headers=headers, content=body, timeout=60)
        problem = assert_problem(r, status)
        assert problem["type"] == ("urn:locstatus:cross-origin" if status == 403
                                   else "urn:locstatus:unsupported-media-type")
    assert versions(mgr) == before


def test_same_origin_json_and_non_browser_clients_are_served(
    loopback: str, mgr: Manager
) -> None:
    port = loopback.rsplit(":", 1)[1]
    path = loopback + "/v1/locations/us-east-1/replication/pause"
    for origin in (loopback, f"http://localhost:{port}", f"http://LOCALHOST:{port}"):
        host = origin.removeprefix("http://").lower()
        r = httpx.post(path, headers={"Origin": origin, "Host": host, **JSON}, timeout=60)
        assert r.status_code == 200, (origin, r.text)
    r = httpx.post(path, headers={"Content-Type": "application/json; charset=utf-8"},
                   json={"reason": "curl"}, timeout=60)  # no Origin: not a browser
    assert r.status_code == 200, r.text
    assert mgr.status("us-east-1").services["replication"].paused
    # reads and unknown routes are unchanged: the browser never lets a page read them
    assert httpx.get(loopback + "/v1/locations", headers={"Origin": EVIL}).status_code == 200
    assert_problem(httpx.put(loopback + "/v1/locations/us-east-1", headers={"Origin": EVIL}), 405)


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:{port}", "192.168.1.10:{port}", "127.0.0.1.evil.example",
             "localhost.evil.example", "[::2]:{port}", "", "a:b:c"],
)
def test_a_sidecar_without_a_token_serves_only_loopback_hosts(
    loopback: str, mgr: Manager, host: str
) -> None:
    """DNS rebinding: a page on evil.example re-pointed at 127.0.0.1 is same-origin with the
    sidecar to the browser, so it could read everything and send JSON. Its Host gives it away."""
    port = loopback.rsplit(":", 1)[1]
    headers = {"Host": host.format(port=port)}
    before = versions(mgr)
    for method, path in (("GET", "/v1/locations"), ("GET", "/"), ("GET", "/metrics"),
                         ("GET", "/v1/workers"), ("GET", "/openapi.json"),
                         ("POST", "/v1/locations/all/replication/pause")):
        r = httpx.request(method, loopback + path, headers={**headers, **JSON}, timeout=60)
        problem = assert_problem(r, 421)
        assert problem["type"] == "urn:locstatus:misdirected-request"
        assert "DNS rebinding" in problem["detail"] or "parse" in problem["detail"]
        assert "us-east-1" not in r.text
    assert versions(mgr) == before


def test_loopback_hosts_any_port_and_allowed_names_are_served(mgr: Manager) -> None:
    with BackgroundServer(create_app(mgr, allowed_hosts=["s3.zenko.local"])) as srv:
        port = srv.url.rsplit(":", 1)[1]
        for host in (f"127.0.0.1:{port}", "127.0.0.1", "127.0.0.2:1", f"localhost:{port}",
                     "LocalHost.", f"[::1]:{port}", "[::1]", "s3.zenko.local:8000",
                     "S3.Zenko.Local"):
            r = httpx.get(srv.url + "/v1/locations/us-east-1", headers={"Host": host}, timeout=60)
            assert r.status_code == 200, (host, r.text)
        assert_problem(httpx.get(srv.url + "/v1/locations", headers={"Host": "zenko.local"}), 421)


def test_authentication_is_judged_before_the_media_type(
    server: BackgroundServer, mgr: Manager
) -> None:
    """Found by the new-user review (issue 18): ``POST /v1/...`` without a token and without
    ``Content-Type`` answered 415, so a caller fixed the header only to be refused next: now
    401 (no token) or 403 (a token that is not the sidecar's), and 415 only once
    authenticated; the role is still the route's (a read-only principal gets its 403)."""
    before = versions(mgr)
    for method, path in (("POST", "/v1/locations/us-east-1/replication/pause"),
                         ("DELETE", "/v1/locations/us-east-1/replication/schedule"),
                         ("PUT", "/v1/workers/w-1")):
        url = server.url + path
        for headers in ({}, {"Content-Type": "text/plain"}):
            assert_problem(httpx.request(method, url, headers=headers, timeout=60), 401)
            assert_problem(httpx.request(method, url, timeout=60, headers={
                **headers, "Authorization": "Bearer not-the-token-at-all"}), 403)
            body = assert_problem(httpx.request(method, url, timeout=60, headers={
                **headers, "Authorization": f"Bearer {TOKEN}"}), 415)
            assert body["type"] == "urn:locstatus:unsupported-media-type"
    assert versions(mgr) == before


def test_with_a_token_any_host_is_served(server: BackgroundServer) -> None:
    r = httpx.get(server.url + "/v1/locations", headers={"Host": "sidecar.example:8080"})
    assert r.status_code == 200
    r = httpx.post(server.url + "/v1/locations/us-east-1/replication/pause", timeout=60,
                   headers={"Host": "sidecar.example:8080", **JSON,
                            "Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("token", "needle"),
    [
        (" tok-with-space", "leading or trailing whitespace"),
        ("tok-with-newline\n", "leading or trailing whitespace"),
        ("t\u00f6ken", "non-ASCII character at position 1"),
        ("tok\u200b", "non-ASCII character at position 3"),
        ("tok\x7f", "control character at position 3"),
        ("to\tken", "control character at position 2"),
    ],
)
def test_a_token_no_client_can_send_is_refused_at_start(
    backend_url: str, tmp_path: Path, mgr: Manager, token: str, needle: str
) -> None:
    """A token with non-ASCII characters or surrounding spaces could never authenticate: the
    sidecar started and refused every mutation with 401/403."""
    with pytest.raises(InvalidInput, match=needle) as info:
        create_app(mgr, token=token)
    assert token.strip() not in str(info.value)
    proc = subprocess.run(
        # a TEST-NET address: were the token accepted, binding it would fail at once (exit 2
        # naming the address), so the test fails quickly instead of serving forever
        [sys.executable, "-m", "locstatus", "--backend", backend_url, "serve", "--port", "0",
         "--host", "203.0.113.7"],
        env={**os.environ, "LOCSTATUS_API_TOKEN": token}, capture_output=True, text=True,
        timeout=120, cwd=tmp_path, check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: the API token (LOCSTATUS_API_TOKEN)"), proc.stderr
    assert needle in proc.stderr and token.strip() not in proc.stderr
    assert "Traceback" not in proc.stderr


# -- other routes -------------------------------------------------------------------------------


def test_history_workers_fsm(http: httpx.Client, mgr: Manager, clock: FakeClock) -> None:
    http.post("/v1/locations/us-east-1/replication/pause", json={"actor": "ops"})
    r = http.get("/v1/locations/us-east-1/history", params={"limit": 2})
    assert r.status_code == 200
    entries = r.json()
    assert [e["event"] for e in entries] == ["settle", "pause"]
    assert entries[1]["actor"] == "ops" and entries[1]["to_state"] == "pausing"
    assert_problem(http.get("/v1/locations/us-east-1/history", params={"limit": 0}), 422)
    mgr.backend.put_worker(WorkerInfo(worker_id="w1", services=("replication",),
                                      lease_expires_at=clock() + timedelta(seconds=30)))
    mgr.backend.put_worker(WorkerInfo(worker_id="w2", services=("lifecycle",),
                                      lease_expires_at=clock() - timedelta(seconds=1)))
    mgr.backend.put_worker(WorkerInfo(worker_id="w3", services=("lifecycle",), standing=True,
                                      lease_expires_at=clock() - timedelta(seconds=1)))
    workers = {w["worker_id"]: w for w in http.get("/v1/workers").json()}
    assert workers["w1"]["alive"] is True and workers["w2"]["alive"] is False
    # standing (docs/agent.md "Standing registrations"): counts, its holder away since then
    assert [(workers[w]["standing"], workers[w]["away"], workers[w]["alive"])
            for w in ("w1", "w2", "w3")] == [(False, False, True), (False, False, False),
                                             (True, True, True)]
    assert workers["w3"]["lease_expires_at"] is not None
    r = http.get("/v1/fsm")
    assert r.status_code == 200 and r.text == mermaid()
    assert r.headers["content-type"].startswith("text/plain")


def test_health_ready_and_backend_down(backend_url: str, clock: FakeClock) -> None:
    m = Manager(open_backend(backend_url), clock=clock)
    with BackgroundServer(create_app(m)) as srv:
        assert httpx.get(srv.url + "/healthz", timeout=60).json() == {
            "status": "ok", "version": locstatus.__version__
        }
        assert httpx.get(srv.url + "/readyz", timeout=60).status_code == 200
        m.backend.close()  # the backend becomes unreachable
        assert_problem(httpx.get(srv.url + "/readyz", timeout=60), 503)
        assert_problem(httpx.get(srv.url + "/v1/locations", timeout=60), 503)
        assert httpx.get(srv.url + "/healthz", timeout=60).status_code == 200
        metrics = httpx.get(srv.url + "/metrics", timeout=60)
        assert metrics.status_code == 200 and "locstatus_backend_up 0.0" in metrics.text
        assert httpx.get(srv.url + "/", timeout=60).status_code == 503


def test_readyz_reports_a_stopped_reconciler(mgr: Manager, clock: FakeClock) -> None:
    reconciler = Reconciler(mgr, interval=30)
    with BackgroundServer(create_app(mgr, reconciler=reconciler)) as srv:
        assert_problem(httpx.get(srv.url + "/readyz", timeout=60), 503)
        reconciler.start()
        try:
            r = httpx.get(srv.url + "/readyz", timeout=60)
            assert r.status_code == 200 and r.json()["reconciler"] == "running"
        finally:
            reconciler.stop()


def test_check_route_serves_the_last_result(mgr: Manager) -> None:
    from locstatus.api import CheckState

    state = CheckState()
    with BackgroundServer(create_app(mgr, check=state)) as srv:
        assert_problem(httpx.get(srv.url + "/v1/check", timeout=60), 404)
        with state.lock:
            state.result = {"findings": [], "scanned": 3}
            state.at = mgr.clock()
            state.duration = 0.25
        r = httpx.get(srv.url + "/v1/check", timeout=60)
        assert r.status_code == 200
        assert r.json()["result"] == {"findings": [], "scanned": 3}
        with state.lock:
            state.error = "BackendUnavailable: down"
        assert_problem(httpx.get(srv.url + "/v1/check", timeout=60), 503)


def _metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if labels else "") + r" (\S+)"
    m = re.search(r"^" + pattern + "$", text, re.M)
    assert m, f"{name}{{{want}}} not in metrics"
    return float(m.group(1))


def test_metrics(http: httpx.Client, mgr: Manager, clock: FakeClock) -> None:
    http.post("/v1/locations/us-east-1/replication/pause")
    http.post("/v1/locations/us-east-1/replication/pause")
    http.post("/v1/locations/us-east-2/replication/resume", json={"in_seconds": 5})
    http.post("/v1/locations/us-east-1/replication/resume", json={"in_seconds": 60})
    http.get("/v1/locations/eu-west-1")
    mgr.backend.put_worker(WorkerInfo(worker_id="w1", services=("replication",),
                                      lease_expires_at=clock() + timedelta(seconds=30)))
    http.post("/v1/locations/eu-west-1/replication/pause")  # w1 lags: stays pausing
    text = http.get("/metrics").text
    assert _metric(text, "locstatus_transitions_total", event="pause", result="applied") == 2
    assert _metric(text, "locstatus_transitions_total", event="pause", result="noop") == 1
    assert _metric(text, "locstatus_transitions_total", event="schedule_resume",
                   result="InvalidTransition") == 1
    assert _metric(text, "locstatus_http_requests_total", method="GET",
                   route="/v1/locations/{location}", status="200") == 1
    assert _metric(text, "locstatus_services", service="replication", state="paused") == 1
    assert _metric(text, "locstatus_services", service="replication", state="pausing") == 1
    assert _metric(text, "locstatus_services", service="replication", state="running") == 1
    assert _metric(text, "locstatus_scheduled_resumes_pending", service="replication") == 1
    assert _metric(text, "locstatus_lagging_workers", service="replication") == 1
    assert _metric(text, "locstatus_cas_conflicts_total") >= 0
    assert _metric(text, "locstatus_workers", alive="true") == 1
    clock.advance(61)
    text = http.get("/metrics").text
    assert _metric(text, "locstatus_scheduled_resumes_overdue", service="replication") == 1


def test_metrics_and_workers_count_what_does_not_read(
    http: httpx.Client, mgr: Manager, durable_kit: Kit
) -> None:
    """The scrape-time gauges read only the readable records, so a corrupt one silently left
    every count; an unreadable registration counts as the live worker it may be. Both are
    counted, and ``/v1/workers`` lists the registration with what is wrong."""
    text = http.get("/metrics").text
    assert _metric(text, "locstatus_corrupt_records") == 0
    assert _metric(text, "locstatus_corrupt_workers") == 0
    durable_kit.write_raw("us-east-2", "{not json")
    durable_kit.write_raw_worker("w-bad", '{"worker_id": "w-bad"}')
    deadline = time.monotonic() + 10  # ZooKeeper: its watches drop the cached worker list
    while [w.worker_id for w in mgr.workers()] != ["w-bad"]:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert http.post("/v1/locations/eu-west-1/replication/pause").json()[
        "services"]["replication"]["state"] == "pausing"  # w-bad may apply it
    text = http.get("/metrics").text
    assert _metric(text, "locstatus_corrupt_records") == 1
    assert _metric(text, "locstatus_corrupt_workers") == 1
    assert _metric(text, "locstatus_locations", removed="false") == 2
    assert _metric(text, "locstatus_workers", alive="true") == 1
    assert _metric(text, "locstatus_lagging_workers", service="replication") == 1
    (listed,) = http.get("/v1/workers").json()
    assert listed["worker_id"] == "w-bad" and listed["alive"] is True
    assert "services" in listed["corrupt"]
    assert "all: registration corrupt (" in http.get("/").text  # the status page names it


def test_workers_and_metrics_show_clock_offsets_to_the_backend(backend_url: str) -> None:
    """docs/time.md "What an operator sees": each worker's published offset in GET
    /v1/workers, this sidecar's own offset and error bound in /metrics."""
    m = Manager(open_backend(backend_url))  # the backend's own time, measured
    try:
        m.backend.put_worker(WorkerInfo(
            worker_id="w-skewed", services=("replication",), clock_offset_seconds=30.0,
            lease_expires_at=m.clock() + timedelta(minutes=5),
        ))
        with BackgroundServer(create_app(m)) as srv:
            (w,) = httpx.get(srv.url + "/v1/workers", timeout=60).json()
            assert w["clock_offset_seconds"] == 30.0 and w["alive"] is True
            text = httpx.get(srv.url + "/metrics", timeout=60).text
        assert abs(_metric(text, "locstatus_clock_offset_seconds")) < 1.0  # servers on this host
        assert 0 <= _metric(text, "locstatus_clock_uncertainty_seconds") <= 0.25
        assert _metric(text, "locstatus_clock_max_uncertainty_seconds") == 0.25
        assert _metric(text, "locstatus_clock_refusals_total") == 0
    finally:
        m.close()


def test_concurrent_operators_never_lose_a_change(http: httpx.Client, mgr: Manager) -> None:
    """Two operators pausing and resuming different services of one record at once: every
    change lands (compare-and-set + retry), none reverts another."""
    errors: list[str] = []

    def flip(service: str) -> None:
        with httpx.Client(base_url=str(http.base_url), headers=dict(http.headers),
                          timeout=60) as c:
            for i in range(10):
                action = "pause" if i % 2 == 0 else "resume"
                r = c.post(f"/v1/locations/us-east-1/{service}/{action}")
                if r.status_code != 200:
                    errors.append(r.text)

    threads = [threading.Thread(target=flip, args=(s,)) for s in ("replication", "lifecycle")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    rec = mgr.status("us-east-1")
    assert rec.services["replication"].generation == 10
    assert rec.services["lifecycle"].generation == 10


# -- serve ------------------------------------------------------------------------------------


def test_loopback_detection() -> None:
    for host in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "192.0.2.10", "10.1.2.3"):
        assert not is_loopback(host), host


def test_serve_refuses_a_public_bind_without_token(
    backend_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOCSTATUS_API_TOKEN", raising=False)
    with pytest.raises(InvalidInput, match="LOCSTATUS_API_TOKEN") as info:
        serve(backend_url, host="0.0.0.0", port=0, token=None, insecure=False,
              reconcile_interval=1.0, check_interval=None)
    assert "--insecure" in str(info.value)
    with pytest.raises(InvalidInput, match="port"):
        serve(backend_url, host="127.0.0.1", port=70000, token=None, insecure=False,
              reconcile_interval=1.0, check_interval=None)
    with pytest.raises(InvalidInput, match="interval"):
        serve(backend_url, host="127.0.0.1", port=0, token=None, insecure=False,
              reconcile_interval=0, check_interval=None)


def test_serve_reports_a_port_in_use(backend_url: str) -> None:
    taken = bind_socket("127.0.0.1", 0)
    taken.listen()
    port = taken.getsockname()[1]
    try:
        with pytest.raises(InvalidInput, match=f"127.0.0.1:{port}"):
            serve(backend_url, host="127.0.0.1", port=port, token="port-in-use-token-4e7a", insecure=False,
                  reconcile_interval=1.0, check_interval=None)
    finally:
        taken.close()


def start_sidecar(
    backend_url: str, tmp_path: Path, name: str, env: dict[str, str] | None = None,
    **kwargs: object,
) -> tuple[subprocess.Popen[bytes], str, Path]:
    """Start ``serve`` in a real process on a free port; returns (process, base URL, log)."""
    args = {"host": "127.0.0.1", "port": 0, "token": None, "insecure": False,
            "reconcile_interval": 0.2, "check_interval": None, **kwargs}
    code = (
        "from locstatus.api.server import serve\n"
        f"serve({backend_url!r}, **{args!r})\n"
    )
    log_path = tmp_path / f"{name}.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})}, start_new_session=True,
    )
    log.close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        m = re.search(rb"locstatus sidecar on (http://\S+?),", log_path.read_bytes())
        if m:
            url = m.group(1).decode()
            try:
                if httpx.get(url + "/readyz", timeout=10).status_code == 200:
                    return proc, url, log_path
            except httpx.TransportError:
                pass
        if proc.poll() is not None:
            raise AssertionError(f"sidecar exited: {log_path.read_text()}")
        time.sleep(0.1)
    stop_sidecar(proc)
    raise AssertionError(f"sidecar did not become ready: {log_path.read_text()}")


def stop_sidecar(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_the_startup_line_names_the_backbeat_trust_networks(tmp_path: Path) -> None:
    """Found by the new-user review (issue 18): with --backbeat-trust set, nothing said which
    networks were trusted; the startup line now lists them (docs/http.md, "Putting locstatus
    where Backbeat's API server was")."""
    proc, _url, log_path = start_sidecar(
        f"sqlite:///{tmp_path}/trust.db", tmp_path, "trust", env={"LOCSTATUS_API_TOKEN": TOKEN},
        backbeat_trust=["10.100.0.0/16", "::1"],
    )
    try:
        line = next(x for x in log_path.read_text().splitlines() if "locstatus sidecar on" in x)
        assert ("Backbeat-route mutations need no token from 10.100.0.0/16, ::1/128 "
                "(--backbeat-trust)") in line, line
    finally:
        stop_sidecar(proc)


def test_serve_process_never_logs_the_token(
    backend_url: str, tmp_path: Path, mgr: Manager
) -> None:
    proc, url, log_path = start_sidecar(
        backend_url, tmp_path, "sidecar", env={"LOCSTATUS_API_TOKEN": TOKEN},
        check_interval=0.5,
    )
    try:
        path = url + "/v1/locations/us-east-1/replication/pause"
        assert httpx.post(path, headers=JSON, timeout=60).status_code == 401
        assert httpx.post(path, headers={"Authorization": f"Bearer {TOKEN}x", **JSON},
                          timeout=60).status_code == 403
        ok = httpx.post(path, headers={"Authorization": f"Bearer {TOKEN}", **JSON}, timeout=60)
        assert ok.status_code == 200
        assert httpx.post(url + "/v1/locations/-nope/replication/pause",
                          headers={"Authorization": f"Bearer {TOKEN}", **JSON},
                          timeout=60).status_code == 400
        # The periodic read-only consistency check publishes its report at /v1/check.
        deadline = time.monotonic() + 60
        while (check := httpx.get(url + "/v1/check", timeout=60)).status_code == 404:
            assert time.monotonic() < deadline, check.text
            time.sleep(0.1)
        assert check.status_code == 200, check.text
        assert check.json()["result"]["options"]["repair"] is False
    finally:
        stop_sidecar(proc)
    log = log_path.read_text()
    assert "POST /v1/locations/us-east-1/replication/pause HTTP/1.1" in log  # access log is on
    assert "auth token required" in log
    assert TOKEN not in log
    assert mgr.status("us-east-1").services["replication"].state is State.PAUSED


def test_the_access_log_redacts_url_credentials_and_tokens_file_tokens_intact(
    backend_url: str, tmp_path: Path
) -> None:
    worker_token = "mover-token-5e2a9c7b1d03f4aa"
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"principals": [
        {"name": "mover", "role": "worker", "sha256": hash_token(worker_token)}]}))
    proc, url, log_path = start_sidecar(
        backend_url, tmp_path, "sidecar", env={"LOCSTATUS_API_TOKENS_FILE": str(tokens)},
    )
    try:
        for query in ("x=mongodb://u:p@h/", f"token={worker_token}", f"q={worker_token}",
                      f"api_key=not-a-known-one-{TOKEN}"):
            assert httpx.get(f"{url}/v1/locations?{query}", timeout=60).status_code == 200
    finally:
        stop_sidecar(proc)
    log = log_path.read_text()
    assert "Logging error" not in log and "Traceback" not in log, log
    assert "GET /v1/locations?x=mongodb://***@h/ HTTP/1.1" in log
    assert "GET /v1/locations?token=*** HTTP/1.1" in log
    assert "GET /v1/locations?q=*** HTTP/1.1" in log
    assert "GET /v1/locations?api_key=*** HTTP/1.1" in log
    assert worker_token not in log and "u:p@" not in log and TOKEN not in log


@pytest.mark.parametrize("depth", [30_000, 10_000])
def test_a_body_nested_too_deep_is_a_documented_400_and_nothing_is_written(
    http: httpx.Client, mgr: Manager, depth: int
) -> None:
    version = mgr.status("us-east-1").version
    for path in ("/v1/locations/us-east-1/replication/pause", "/v1/workers/w-1"):
        r = http.request("POST" if "pause" in path else "PUT", path,
                         content=b"[" * depth + b"]" * depth)
        body = assert_problem(r, 400)
        assert body["type"] == "urn:locstatus:invalid-input", body
        assert "nested too deep" in body["detail"]
    assert mgr.status("us-east-1").version == version
    assert mgr.workers() == []
    table = (Path(__file__).parents[1] / "docs" / "http.md").read_text()
    assert "`invalid-input`" in table and "nested too deep" in table
