"""Backbeat-compatible routes ``/_/backbeat/api/{crr|ingestion|lifecycle}/...`` over real HTTP
against a real backend (docs/design.md §5.3), with a controllable clock.

The scenarios are the ones Backbeat's own documentation describes (pause all / one, resume,
schedule in N hours with 6 as the default, read and cancel the schedule, status per location),
plus where locstatus is stricter: a refused transition is a 409 problem, an invalid ``hours`` a
400, an unknown site a 404, never a 200 carrying an error.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from locstatus import Manager, State, open_backend
from locstatus.api import create_app
from locstatus.api.backbeat import iso_date
from locstatus.api.server import BackgroundServer
from locstatus.reconciler import Reconciler

from support.fakeclock import FakeClock

TOKEN = "bb-token-0c7e51-9a2f"
API = "/_/backbeat/api"
START = datetime(2030, 6, 28, 5, 40, 20, 600000, tzinfo=UTC)
# Replication sites, ingestion and lifecycle locations as in Backbeat's sample config (its
# conf/config.json and conf/locationConfig.json; tests/test_locations.py reads them from
# ../shared/fixtures/backbeat beside the repository): not every location has every service.
LOCATIONS = {
    "aws-location": ["replication", "lifecycle"],
    "wontwork-location": ["replication", "lifecycle"],
    "zenko": ["replication"],
    "a-zenko-location": ["ingestion"],
    "us-east-1": ["lifecycle"],
}
SITES = ["aws-location", "wontwork-location", "zenko"]





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
def http(mgr: Manager, clock: FakeClock) -> Iterator[httpx.Client]:
    with BackgroundServer(create_app(mgr, token=TOKEN)) as srv, httpx.Client(
        base_url=srv.url + API, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
    ) as c:
        yield c


def state(mgr: Manager, loc: str, service: str = "replication") -> State:
    return mgr.status(loc).services[service].state


def resume_at(mgr: Manager, loc: str, service: str = "replication") -> datetime | None:
    return mgr.status(loc).services[service].resume_at


def assert_problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = r.json()
    assert body["status"] == status
    return body


# -- status -----------------------------------------------------------------------------------


def test_status_all_and_one(http: httpx.Client) -> None:
    r = http.get("/crr/status")
    assert r.status_code == 200
    assert r.json() == dict.fromkeys(SITES, "enabled")  # locations without crr are absent
    assert http.get("/crr/status/all").json() == r.json()
    assert http.get("/crr/status/zenko").json() == {"zenko": "enabled"}
    assert http.get("/ingestion/status").json() == {"a-zenko-location": "enabled"}
    assert sorted(http.get("/lifecycle/status").json()) == [
        "aws-location", "us-east-1", "wontwork-location"
    ]


def test_unknown_site_or_service_is_404(http: httpx.Client) -> None:
    assert_problem(http.get("/crr/status/nowhere"), 404)
    assert_problem(http.get("/crr/status/us-east-1"), 404)  # exists, but has no replication
    assert_problem(http.post("/crr/pause/nowhere"), 404)
    assert_problem(http.post("/crr/resume/nowhere/schedule"), 404)
    assert_problem(http.get("/crr/resume/nowhere"), 404)
    assert_problem(http.delete("/crr/resume/nowhere/schedule"), 404)
    assert_problem(http.get("/teleport/status"), 404)
    assert_problem(http.post("/teleport/pause"), 404)
    assert_problem(http.get("/crr/status/-bad-"), 400)


# -- pause / resume ----------------------------------------------------------------------------


def test_pause_all(http: httpx.Client, mgr: Manager) -> None:
    r = http.post("/crr/pause")
    assert r.status_code == 200, r.text
    assert r.json() == dict.fromkeys(SITES, "disabled")
    assert all(state(mgr, s) is State.PAUSED for s in SITES)
    assert state(mgr, "aws-location", "lifecycle") is State.RUNNING
    assert http.get("/crr/status").json() == dict.fromkeys(SITES, "disabled")
    assert http.post("/crr/pause/all").json() == dict.fromkeys(SITES, "disabled")


def test_pause_one(http: httpx.Client, mgr: Manager) -> None:
    r = http.post("/crr/pause/zenko")
    assert r.status_code == 200 and r.json() == {"zenko": "disabled"}
    assert state(mgr, "zenko") is State.PAUSED
    assert state(mgr, "aws-location") is State.RUNNING
    assert http.get("/crr/status").json() == {
        "aws-location": "enabled", "wontwork-location": "enabled", "zenko": "disabled"
    }


def test_pause_an_already_paused_location_changes_nothing(
    http: httpx.Client, mgr: Manager
) -> None:
    http.post("/crr/pause/zenko")
    version = mgr.status("zenko").version
    entries = len(mgr.history("zenko", limit=1000))
    r = http.post("/crr/pause/zenko")
    assert r.status_code == 200 and r.json() == {"zenko": "disabled"}
    assert mgr.status("zenko").version == version
    assert len(mgr.history("zenko", limit=1000)) == entries


def test_resume_one_and_all(http: httpx.Client, mgr: Manager) -> None:
    http.post("/crr/pause")
    r = http.post("/crr/resume/zenko")
    assert r.status_code == 200 and r.json() == {"zenko": "enabled"}
    assert state(mgr, "zenko") is State.RUNNING
    r = http.post("/crr/resume")
    assert r.status_code == 200 and r.json() == dict.fromkeys(SITES, "enabled")
    assert all(state(mgr, s) is State.RUNNING for s in SITES)


def test_ingestion_and_lifecycle_services(http: httpx.Client, mgr: Manager) -> None:
    assert http.post("/ingestion/pause/a-zenko-location").status_code == 200
    assert state(mgr, "a-zenko-location", "ingestion") is State.PAUSED
    assert http.post("/lifecycle/pause").json() == {
        "aws-location": "disabled", "us-east-1": "disabled", "wontwork-location": "disabled"
    }
    assert state(mgr, "aws-location") is State.RUNNING  # replication untouched


# -- scheduled resume ---------------------------------------------------------------------------


def test_schedule_defaults_to_six_hours(
    http: httpx.Client, mgr: Manager, clock: FakeClock
) -> None:
    http.post("/crr/pause/zenko")
    r = http.post("/crr/resume/zenko/schedule")
    assert r.status_code == 200, r.text
    due = clock() + timedelta(hours=6)
    assert r.json() == {"zenko": "2030-06-28T11:40:20.600Z"} == {"zenko": iso_date(due)}
    assert resume_at(mgr, "zenko") == due
    assert state(mgr, "zenko") is State.PAUSED
    # An empty JSON object means the default too.
    http.post("/crr/resume/zenko/schedule", json={"hours": 1})
    r = http.post("/crr/resume/zenko/schedule", json={})
    assert resume_at(mgr, "zenko") == due


def test_schedule_with_hours_and_read_it_back(
    http: httpx.Client, mgr: Manager, clock: FakeClock
) -> None:
    http.post("/crr/pause")
    r = http.post("/crr/resume/zenko/schedule", json={"hours": 2})
    assert r.status_code == 200
    due = iso_date(clock() + timedelta(hours=2))
    assert r.json() == {"zenko": due}
    expected = {"aws-location": "none", "wontwork-location": "none", "zenko": due}
    for path in ("/crr/resume", "/crr/resume/all", "/crr/resume/schedule",
                 "/crr/resume/all/schedule"):
        assert http.get(path).json() == expected, path
    assert http.get("/crr/resume/zenko").json() == {"zenko": due}
    assert http.get("/crr/resume/zenko/schedule").json() == {"zenko": due}
    assert http.get("/crr/resume/aws-location").json() == {"aws-location": "none"}


def test_a_schedule_body_with_a_key_twice_is_400_naming_the_key(
    http: httpx.Client, mgr: Manager
) -> None:
    """``{"hours": 1, "hours": 48}`` was read as 48 hours (the last key wins)."""
    http.post("/crr/pause")
    before = {r.location: r.version for r in mgr.statuses()}
    for path in ("/crr/resume/zenko/schedule", "/crr/resume/all/schedule"):
        r = http.post(path, content=b'{"hours": 1, "hours": 48}')
        problem = assert_problem(r, 400)
        assert "key 'hours' twice" in problem["detail"]
    assert {r.location: r.version for r in mgr.statuses()} == before
    assert resume_at(mgr, "zenko") is None


def test_overwrite_a_schedule(http: httpx.Client, mgr: Manager, clock: FakeClock) -> None:
    http.post("/crr/pause/zenko")
    http.post("/crr/resume/zenko/schedule", json={"hours": 2})
    r = http.post("/crr/resume/zenko/schedule", json={"hours": 5})
    assert r.json() == {"zenko": iso_date(clock() + timedelta(hours=5))}
    assert resume_at(mgr, "zenko") == clock() + timedelta(hours=5)
    events = [e.event for e in mgr.history("zenko", limit=10) if e.service == "replication"]
    assert events[:2] == ["schedule_resume", "schedule_resume"]


def test_schedule_all_targets_paused_sites(
    http: httpx.Client, mgr: Manager, clock: FakeClock
) -> None:
    assert_problem(http.post("/crr/resume/all/schedule", json={"hours": 1}), 409)  # none paused
    http.post("/crr/pause/zenko")
    http.post("/crr/pause/aws-location")
    r = http.post("/crr/resume/all/schedule", json={"hours": 1})
    due = iso_date(clock() + timedelta(hours=1))
    assert r.status_code == 200 and r.json() == {"aws-location": due, "zenko": due}
    assert http.post("/crr/resume/schedule", json={"hours": 3}).status_code == 200
    assert resume_at(mgr, "wontwork-location") is None


def test_schedule_on_an_active_location_is_refused(http: httpx.Client, mgr: Manager) -> None:
    version = mgr.status("zenko").version
    body = assert_problem(http.post("/crr/resume/zenko/schedule", json={"hours": 2}), 409)
    assert "running" in body["detail"]
    assert mgr.status("zenko").version == version
    assert http.get("/crr/resume/zenko").json() == {"zenko": "none"}


@pytest.mark.parametrize(
    "content",
    [b'{"hours": 0}', b'{"hours": -2}', b'{"hours": 1.5}', b'{"hours": "2"}',
     b'{"hours": true}', b'{"hours": null}', b'{"hours": 100000}', b'{"hours": 2, "days": 1}',
     b'[2]', b'"2"', b"{not json", b'{"hours": NaN}', b" ", b"\r\n\t "],
)
def test_invalid_hours_is_400(http: httpx.Client, mgr: Manager, content: bytes) -> None:
    http.post("/crr/pause/zenko")
    version = mgr.status("zenko").version
    r = http.post("/crr/resume/zenko/schedule", content=content,
                  headers={"content-type": "application/json"})
    body = assert_problem(r, 400)
    assert any(word in body["detail"] for word in ("hours", "JSON", "unknown field"))
    assert mgr.status("zenko").version == version


def test_cancel_a_schedule(http: httpx.Client, mgr: Manager) -> None:
    http.post("/crr/pause")
    for path in ("/crr/resume/zenko/schedule", "/crr/resume/zenko"):
        http.post("/crr/resume/zenko/schedule", json={"hours": 2})
        r = http.delete(path)
        assert r.status_code == 200 and r.json() == {"zenko": "none"}, path
        assert resume_at(mgr, "zenko") is None
        assert state(mgr, "zenko") is State.PAUSED
    http.post("/crr/resume/all/schedule", json={"hours": 2})
    r = http.delete("/crr/resume/all/schedule")
    assert r.json() == dict.fromkeys(SITES, "none")
    assert all(resume_at(mgr, s) is None for s in SITES)


def test_manual_pause_or_resume_cancels_a_schedule(http: httpx.Client, mgr: Manager) -> None:
    http.post("/crr/pause")
    http.post("/crr/resume/all/schedule", json={"hours": 2})
    http.post("/crr/pause/zenko")
    assert resume_at(mgr, "zenko") is None and state(mgr, "zenko") is State.PAUSED
    assert http.get("/crr/resume/zenko").json() == {"zenko": "none"}
    http.post("/crr/resume/aws-location")
    assert resume_at(mgr, "aws-location") is None
    assert http.get("/crr/status/aws-location").json() == {"aws-location": "enabled"}
    assert resume_at(mgr, "wontwork-location") is not None  # the others keep theirs


def test_scheduled_resume_fires_on_time(
    http: httpx.Client, mgr: Manager, clock: FakeClock
) -> None:
    http.post("/crr/pause/zenko")
    http.post("/crr/resume/zenko/schedule", json={"hours": 1})
    reconciler = Reconciler(mgr, interval=60)
    clock.advance(3600 - 1)
    reconciler.run_once()
    assert http.get("/crr/status/zenko").json() == {"zenko": "disabled"}
    clock.advance(1)
    assert reconciler.run_once().fired == [("zenko", "replication")]
    assert http.get("/crr/status/zenko").json() == {"zenko": "enabled"}
    assert http.get("/crr/resume/zenko").json() == {"zenko": "none"}
    events = [e.event for e in mgr.history("zenko", limit=100) if e.service == "replication"]
    assert events.count("resume_due") == 1


# -- auth ---------------------------------------------------------------------------------------


def test_mutations_need_the_token_reads_do_not(http: httpx.Client, mgr: Manager) -> None:
    base = str(http.base_url)
    with httpx.Client(base_url=base, timeout=60) as anon:
        for method, path in (("POST", "/crr/pause"), ("POST", "/crr/pause/zenko"),
                             ("POST", "/crr/resume/zenko"), ("POST", "/crr/resume/zenko/schedule"),
                             ("DELETE", "/crr/resume/zenko/schedule")):
            assert_problem(anon.request(method, path), 401)
        assert anon.get("/crr/status").status_code == 200
        assert anon.get("/crr/resume").status_code == 200
    assert state(mgr, "zenko") is State.RUNNING


# -- requests from browsers, and what Backbeat's clients really send ------------------------------

EVIL = "http://evil.example"


@pytest.fixture
def loopback(mgr: Manager, clock: FakeClock) -> Iterator[str]:
    """A sidecar without a token on 127.0.0.1, as Backbeat's API server runs."""
    with BackgroundServer(create_app(mgr)) as srv:
        yield srv.url + API


def test_backbeat_clients_are_served_as_they_send(loopback: str, mgr: Manager) -> None:
    """Backbeat's own functional tests (tests/functional/api/routes.js) and Zenko's end-to-end
    tests POST with no Content-Type, with an empty body or {"hours": 1}; signed S3 SDK clients
    send application/json or application/octet-stream with an AWS Authorization header, and
    CloudServer forwards a console's browser Origin with them."""
    with httpx.Client(base_url=loopback, timeout=60) as c:
        assert c.post("/crr/pause", content=b"").json() == dict.fromkeys(SITES, "disabled")
        r = c.post("/crr/resume/zenko/schedule", content=b'{"hours": 1}')
        assert r.status_code == 200, r.text
        assert resume_at(mgr, "zenko") is not None
        assert c.post("/crr/resume/aws-location").status_code == 200  # python requests.post(url)
        signed = {"Authorization": "AWS4-HMAC-SHA256 Credential=AKIA/20300628/us-east-1/s3/"
                  "aws4_request, SignedHeaders=host, Signature=00", "Origin": EVIL}
        for kind in ("application/json", "application/octet-stream"):
            r = c.post("/ingestion/pause/a-zenko-location", content=b"{}",
                       headers={**signed, "Content-Type": kind})
            assert r.status_code == 200, (kind, r.text)
        r = c.post("/crr/pause/zenko", headers={"Origin": loopback.split(API)[0]})
        assert r.status_code == 200, r.text  # the sidecar's own origin
    assert state(mgr, "a-zenko-location", "ingestion") is State.PAUSED  # no worker to wait for
    assert state(mgr, "aws-location") is State.RUNNING


@pytest.mark.parametrize(
    ("headers", "body", "status"),
    [
        ({"Origin": EVIL}, b"", 403),  # fetch(url, {method: "POST", mode: "no-cors"})
        ({"Origin": "null"}, b"", 403),
        ({"Origin": EVIL, "Content-Type": "application/json"}, b"{}", 403),
        ({"Content-Type": "text/plain"}, b"", 415),  # a cross-site form or fetch, no Origin
        ({"Content-Type": "application/x-www-form-urlencoded"}, b"hours=1", 415),
        ({"Content-Type": "multipart/form-data; boundary=b"}, b"", 415),
    ],
)
def test_a_cross_site_backbeat_mutation_is_refused(
    loopback: str, mgr: Manager, headers: dict[str, str], body: bytes, status: int
) -> None:
    mgr.pause("zenko", "replication")
    mgr.resume("zenko", "replication", at=timedelta(hours=2))
    before = {r.location: r.version for r in mgr.statuses()}
    for method, path in (("POST", "/crr/pause"), ("POST", "/crr/resume"),
                         ("POST", "/crr/resume/zenko/schedule"), ("DELETE", "/crr/resume/zenko"),
                         ("POST", "/lifecycle/pause/us-east-1")):
        r = httpx.request(method, loopback + path, headers=headers, content=body, timeout=60)
        assert_problem(r, status)
    assert {r.location: r.version for r in mgr.statuses()} == before
    assert httpx.get(loopback + "/crr/status", headers={"Origin": EVIL}).status_code == 200


def test_a_backbeat_route_is_not_served_to_a_rebound_host(loopback: str, mgr: Manager) -> None:
    for method, path in (("GET", "/crr/status"), ("POST", "/crr/pause")):
        r = httpx.request(method, loopback + path, headers={"Host": "evil.example"}, timeout=60)
        assert_problem(r, 421)
    assert state(mgr, "zenko") is State.RUNNING


def test_removed_locations_are_absent_and_404(http: httpx.Client, mgr: Manager) -> None:
    mgr.remove_location("wontwork-location")  # tombstone (docs/design.md §3.5)
    assert http.get("/crr/status").json() == {"aws-location": "enabled", "zenko": "enabled"}
    assert http.post("/crr/pause").json() == {"aws-location": "disabled", "zenko": "disabled"}
    assert_problem(http.get("/crr/status/wontwork-location"), 404)
    assert_problem(http.post("/crr/pause/wontwork-location"), 404)
    assert state(mgr, "wontwork-location") is State.RUNNING
