"""A record that does not say its state is corrupt on every read path, never "running"
(Backbeat's BB-37), and never left out where records are listed.

An operator pauses a location; then its record is overwritten with the backend's own client by
something that is not locstatus (a half-written payload, a hand edit that drops a field or
repeats a key, a payload nested deeper than any parser recurses). Every way of reading it must
say "corrupt, and why", for that location only: the library (``status``, ``statuses``,
``listing``, ``scan``), the consistency check, the sidecar's list and location routes, its
Backbeat routes (one location and ``all``), its bulk mutations and its status page, and the
reconciler's pass over every record. Runs on every durable backend with its real server.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from locstatus import CorruptRecord, Manager, State, open_backend
from locstatus.api import create_app
from locstatus.api.server import BackgroundServer
from locstatus.check import run_check
from locstatus.reconciler import Reconciler

from support import corrupt_shapes as shapes
from support.fakeclock import FakeClock
from support.kits import Kit

START = datetime(2030, 6, 1, 12, 0, tzinfo=UTC)
PROBLEM = "application/problem+json"
BAD, GOOD = "half-written", ["eu-west-1", "us-east-1"]


@pytest.fixture
def damaged(durable_kit: Kit, request: pytest.FixtureRequest) -> Iterator[Manager]:
    """A store with two good locations and ``BAD``, paused with a scheduled resume through
    locstatus, then overwritten with the backend's own client by the shape the test names."""
    clock = FakeClock(START)
    mgr = Manager(open_backend(durable_kit.url), clock=clock)
    mgr.sync_locations([*GOOD, BAD])
    mgr.pause(BAD, "replication", reason="maint", actor="ops")
    mgr.resume(BAD, "replication", at=START.replace(hour=18))
    mgr.pause("us-east-1", "replication")
    shape: str = request.param
    durable_kit.write_raw(BAD, {**shapes.PARTIAL, **shapes.DUPLICATE_KEYS, **shapes.DEEP}[shape])
    yield mgr
    mgr.close()


def _assert_corrupt_everywhere(mgr: Manager) -> None:
    # the library
    with pytest.raises(CorruptRecord) as exc:
        mgr.status(BAD)
    assert exc.value.location == BAD
    assert [r.location for r in mgr.statuses()] == GOOD
    records, corrupt = mgr.listing()
    assert [r.location for r in records] == GOOD and [c.location for c in corrupt] == [BAD]
    assert [c.location for c in mgr.scan() if isinstance(c, CorruptRecord)] == [BAD]
    # the reconciler's pass goes on for every other location
    Reconciler(mgr, interval=60).run_once()
    assert mgr.status("us-east-1").services["replication"].state is State.PAUSED
    # the check
    report = run_check(mgr)
    assert [(f.kind.value, f.location) for f in report.findings] == [("corrupt_record", BAD)]
    assert report.findings[0].evidence["detail"] == exc.value.detail
    # the sidecar
    with BackgroundServer(create_app(mgr)) as srv, httpx.Client(
        base_url=srv.url, timeout=60
    ) as http:
        _assert_served_as_corrupt(http, exc.value.detail)


def _problem(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code == 500, resp.text
    assert resp.headers["content-type"] == PROBLEM
    body: dict[str, Any] = resp.json()
    assert body["type"] == "urn:locstatus:corrupt-record" and body["status"] == 500
    return body


def _assert_listing(body: dict[str, Any], detail: str) -> None:
    assert [(e["location"], e["type"], e["status"]) for e in body["errors"]] == [
        (BAD, "urn:locstatus:corrupt-record", 500)]
    assert detail in body["errors"][0]["detail"] and BAD in body["detail"]


def _assert_served_as_corrupt(http: httpx.Client, detail: str) -> None:
    one = _problem(http.get(f"/v1/locations/{BAD}"))
    assert detail in one["detail"]
    listed = _problem(http.get("/v1/locations"))
    assert [r["location"] for r in listed["locations"]] == GOOD
    _assert_listing(listed, detail)
    listed = _problem(http.get("/v1/locations", params={"include_removed": "true"}))
    assert [r["location"] for r in listed["locations"]] == GOOD
    # Backbeat: one location is an error, "all" names it beside the others
    _problem(http.get(f"/_/backbeat/api/crr/status/{BAD}"))
    status = _problem(http.get("/_/backbeat/api/crr/status"))
    assert status["locations"] == {"eu-west-1": "enabled", "us-east-1": "disabled"}
    _assert_listing(status, detail)
    schedule = _problem(http.get("/_/backbeat/api/crr/resume"))
    assert schedule["locations"] == {"eu-west-1": "none", "us-east-1": "none"}
    _assert_listing(schedule, detail)
    _problem(http.get(f"/_/backbeat/api/crr/resume/{BAD}/schedule"))
    # a bulk operation over "all" fails for it, and still acts on the others
    bulk = http.post("/v1/locations/all/lifecycle/pause", json={})
    assert bulk.status_code == 500 and bulk.headers["content-type"] == PROBLEM
    results = bulk.json()["results"]
    assert results[BAD]["error"]["type"] == "urn:locstatus:corrupt-record"
    assert {loc: r["status"]["services"]["lifecycle"]["state"]  # no worker: settled at once
            for loc, r in results.items() if loc != BAD} == dict.fromkeys(GOOD, "paused")
    # the page shows it as a corrupt row, not as running, and not missing
    page = http.get("/", params={"refresh": "0"})
    assert page.status_code == 200
    assert f'<tr data-location="{BAD}" data-state="corrupt">' in page.text
    assert 'id="corrupt"' in page.text and f'data-location="{BAD}" data-service' not in page.text


@pytest.mark.parametrize(
    "damaged",
    ["service-without-state", "generation-and-reason-only", "crr-beside-empty-replication",
     "no-resume-at"],
    indirect=True,
)
def test_a_half_written_record_is_corrupt_on_every_read_path(damaged: Manager) -> None:
    _assert_corrupt_everywhere(damaged)


@pytest.mark.parametrize("durable_kit", ["sqlite", "zk"], indirect=True)
@pytest.mark.parametrize("damaged", ["state-twice-compact", "deep-array"], indirect=True)
def test_a_stored_text_with_a_key_twice_or_too_deep_is_corrupt_on_every_read_path(
    damaged: Manager,
) -> None:
    _assert_corrupt_everywhere(damaged)
