"""Product bugs the reliability suite found, each shown by a deterministic test.

All seven are fixed; each test stays as a plain regression test: an ambiguous commit that
landed reported as "nothing changed" (43d6615) or with another write's version (70ae685),
payloads carrying their own location/version, deeply nested payloads, undecodable reason/actor
text, a service argument of the wrong type (7b0673c), a client stalled mid-body (7ec6aa3: 408
after 5 s). A bug found later gets its test here marked ``xfail(strict=True)`` while it is
open: it runs on every submission, the suite stays green, and the day it is fixed the strict
marker turns the pass into a failure so the fixer removes the marker. ``docs/reliability.md``
describes each bug.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

import pytest

from locstatus import connect
from locstatus.backends.sqlite import SQLiteBackend
from locstatus.check import run_check
from locstatus.errors import AmbiguousCommit, CorruptRecord
from locstatus.manager import Manager
from locstatus.models import HistoryEntry, LocationStatus, State, WorkerInfo, utcnow

from support.kits import sqlite_kit


class AnswerLost(SQLiteBackend):
    """SQLite whose first compare-and-set commits but whose answer is lost
    (:class:`AmbiguousCommit`); ``meanwhile`` runs in between, as another process would."""

    def __init__(self, url: str, *, meanwhile: Callable[[], None]) -> None:
        super().__init__(url)
        self.meanwhile = meanwhile
        self.armed = True

    def compare_and_set(
        self, record: LocationStatus, expected_version: int, history: Sequence[HistoryEntry],
    ) -> LocationStatus:
        stored = super().compare_and_set(record, expected_version, history)
        if self.armed:
            self.armed = False
            self.meanwhile()
            raise AmbiguousCommit("connection lost after the write was sent (test)")
        return stored


def test_an_ambiguous_commit_that_landed_is_reported_as_applied(tmp_path: Path) -> None:
    """docs/design.md §3.2 and the Manager docstring: ``status.services[s].op_id == op_id`` tells a
    caller whether its call changed anything. Here the pause lands, its answer is lost, and a
    worker settles the pause before the manager re-reads: the pause is in the history exactly
    once (correct), but the caller gets a record that does not carry its op_id, at a version
    that is not its write's (seen under load as "noop" answers for applied writes in
    ``test_client_connections_cut_mid_write``)."""
    url = f"sqlite:///{tmp_path}/locstatus.db"
    other = connect(url)
    other.sync_locations({"site": ["replication"]})
    other.backend.put_worker(WorkerInfo(
        worker_id="w1", services=("replication",),
        lease_expires_at=utcnow() + timedelta(hours=1),
    ))

    def worker_applies_and_settles() -> None:
        other.backend.ack("w1", "site", "replication", 1)
        other.settle("site", "replication")

    mgr = Manager(AnswerLost(url, meanwhile=worker_applies_and_settles))
    try:
        rec = mgr.pause("site", "replication", op_id="op-pause")
        ops = [e.op_id for e in mgr.history("site", 50)]
        assert ops.count("op-pause") == 1  # applied exactly once
        # the caller gets the record exactly as its write stored it, as without the ambiguity
        # (the worker's settle came after it)
        assert rec.services["replication"].op_id == "op-pause", (
            "the caller cannot tell that its pause was applied"
        )
        assert rec.services["replication"].state is State.PAUSING
        pause_version = next(e.version for e in mgr.history("site", 50) if e.op_id == "op-pause")
        assert rec.version == pause_version
        assert mgr.status("site").services["replication"].state is State.PAUSED
    finally:
        mgr.close()
        other.close()


def test_a_payload_naming_another_location_never_reaches_that_location(tmp_path: Path) -> None:
    """Backend contract invariant 5 (corrupt data never breaks its neighbours) and docs/design.md §2:
    the record of ``site-b`` is damaged into a copy of ``site-a``'s document, keys included
    (an operator's stray copy-paste). Reading ``site-b`` must give ``site-b`` or
    :class:`CorruptRecord`; here it gives ``site-a`` at the copied version, a pause of
    ``site-b`` overwrites ``site-a`` (which loses two of its services), and the check reports
    the store clean."""
    kit = sqlite_kit(tmp_path)
    mgr = connect(kit.url)
    try:
        mgr.sync_locations(["site-a", "site-b"])
        a = mgr.status("site-a")
        kit.write_raw("site-b", json.dumps({
            "location": "site-a", "version": a.version,
            "services": {"replication": {"state": "running"}},
        }))
        try:
            b = mgr.status("site-b")
        except CorruptRecord:
            b = None
        if b is not None:
            assert b.location == "site-b"
        with contextlib.suppress(CorruptRecord):
            mgr.pause("site-b")
        assert mgr.status("site-a") == a, "a write to site-b changed site-a"
        assert run_check(mgr).status != "clean"
    finally:
        mgr.close()


DEEP = "[" * 100_000 + "]" * 100_000


def test_a_deeply_nested_payload_is_a_corrupt_record_not_a_crash(tmp_path: Path) -> None:
    """Backend contract invariant 5: ``read_all`` returns a corrupt record as its error and
    carries on. A 100 000-deep JSON array stored as a record makes ``json.loads`` raise
    :class:`RecursionError`, which ``codec.decode_record`` does not catch: ``status`` of that
    location, ``statuses()``/``scan()`` of every location, ``locstatus status`` and the check
    all fail, and an agent's watch thread (which catches only ``LocstatusError``) dies, so the
    worker never sees another change."""
    kit = sqlite_kit(tmp_path)
    mgr = connect(kit.url)
    try:
        mgr.sync_locations(["site-a", "site-b"])
        kit.write_raw("site-b", DEEP)
        with pytest.raises(CorruptRecord):
            mgr.status("site-b")
        assert [r.location for r in mgr.statuses()] == ["site-a"]
        assert [f.location for f in run_check(mgr).findings] == ["site-b"]
    finally:
        mgr.close()


@pytest.mark.parametrize("field", ["reason", "actor"])
def test_a_reason_that_cannot_be_stored_is_invalid_input(tmp_path: Path, field: str) -> None:
    """docs/design.md §2: bad input is rejected with a clear error before it reaches a backend. Python
    decodes non-UTF-8 bytes of a command line as lone surrogates (``locstatus pause LOC
    --reason $'\\xff'``); the library raises ``PydanticSerializationError`` (not a
    :class:`LocstatusError`) and the CLI prints "unexpected PydanticSerializationError"."""
    from locstatus.errors import InvalidInput

    mgr = connect(f"sqlite:///{tmp_path}/locstatus.db")
    try:
        mgr.sync_locations(["site"])
        bad = "maintenance \udcff"
        with pytest.raises(InvalidInput, match=field):
            if field == "reason":
                mgr.pause("site", "replication", reason=bad)
            else:
                mgr.pause("site", "replication", actor=bad)
    finally:
        mgr.close()


def test_a_service_argument_of_the_wrong_type_is_invalid_input(tmp_path: Path) -> None:
    """A location of the wrong type is :class:`InvalidInput` (``tests/test_bad_input.py``
    ``pause-int``); a service of the wrong type raises ``TypeError: 'int' object is not
    iterable`` from ``Manager._services_arg`` (now ``locstatus.manager.plans.services_arg``; found by ``test_hostile_input.py``)."""
    from locstatus.errors import InvalidInput

    mgr = connect(f"sqlite:///{tmp_path}/locstatus.db")
    try:
        mgr.sync_locations(["site"])
        with pytest.raises(InvalidInput):
            mgr.cancel_scheduled_resume("site", 0)  # type: ignore[arg-type]
    finally:
        mgr.close()


def test_a_client_that_stalls_mid_body_gets_an_answer(tmp_path: Path) -> None:
    """Issue 8 item 4: slow clients get a clear error. A client declares a 100-byte body,
    sends 10 bytes and stops. The sidecar used to hold the connection (and the request) open
    forever, with no 408 and no close; it now answers 408 (a problem document) once its 5 s
    body deadline passes, and writes nothing."""
    import socket
    import sys

    import httpx
    from faults import Proc, wait_for

    from support.servers import free_ports

    url = f"sqlite:///{tmp_path}/locstatus.db"
    with connect(url) as mgr:
        mgr.sync_locations(["site"])
        before = mgr.status("site")
    port = free_ports(1)[0]
    proc = Proc([sys.executable, "-m", "locstatus", "--backend", url, "serve", "--port",
                 str(port)], tmp_path / "sidecar.log")

    def up() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, 60, "the sidecar")
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"POST /v1/locations/site/replication/pause HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                      b'{"reason":')
            try:
                answer: bytes | None = s.recv(65536)
            except TimeoutError:
                answer = None
        assert answer is not None, "no answer and no close 30 s after the client stalled"
        assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
        assert b"application/problem+json" in answer
        with connect(url) as mgr:
            assert mgr.status("site") == before
    finally:
        proc.terminate()


def test_an_ambiguous_commit_that_landed_reports_its_own_version(tmp_path: Path) -> None:
    """The rest of the first bug (43d6615 fixed the case where the caller's service changed
    again): the pause of ``replication`` lands, its answer is lost, and meanwhile another
    operator pauses ``lifecycle`` of the same location. The current record still carries the
    caller's op_id on ``replication``, so the manager returns it as is: the caller is told
    the version of the *other* write. Seen under load by ``test_client_connections_cut_mid_write``
    ("is at [29] after an ambiguous commit, its caller was told wrote v30")."""
    url = f"sqlite:///{tmp_path}/locstatus.db"
    other = connect(url)
    other.sync_locations({"site": ["replication", "lifecycle"]})

    mgr = Manager(AnswerLost(
        url, meanwhile=lambda: other.pause("site", "lifecycle", op_id="op-other")
    ))
    try:
        rec = mgr.pause("site", "replication", op_id="op-pause")
        rows = [e for e in mgr.history("site", 50) if e.op_id == "op-pause"]
        pauses = [e.version for e in rows if e.event == "pause"]
        assert len(pauses) == 1  # applied exactly once: this part holds
        assert rec.services["replication"].op_id == "op-pause"  # holds since 43d6615
        # The call's last write is its own settle (no worker applies replication): the
        # caller is told that version, never the other operator's.
        mine = max(e.version for e in rows)
        assert rec.version == mine, f"the caller is told v{rec.version}, its write is v{mine}"
        assert rec.services["replication"].state == "paused"
    finally:
        mgr.close()
        other.close()
