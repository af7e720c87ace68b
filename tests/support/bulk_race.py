"""Two operators at once on a fleet: bulk operations racing each other and single operations
on some of the same locations, each in its own OS process (issue 21).

:func:`run_bulk` runs one :meth:`Manager.bulk <locstatus.manager.Manager.bulk>` and saves its
per-location report; :func:`run_singles` issues random single operations and saves each with
its op_id. :func:`check_fleet` then reads every location's full history and finds, per
location: a version chain with a gap, a record whose service disagrees with its last history
row (a state change without its history, or the reverse), a location a bulk report called
``changed`` whose op_id is not in the history exactly once at (or before) the version told,
one called ``unchanged``/``skipped``/``failed`` (outcome known) whose op_id is there anyway,
and the same for every single operation.
"""

from __future__ import annotations

import itertools
import json
import random
from datetime import timedelta
from pathlib import Path

from locstatus import LocstatusError, connect
from locstatus.errors import AmbiguousCommit
from locstatus.manager import Operation, RetryPolicy
from locstatus.models import new_op_id

SERVICES = ["replication", "lifecycle", "ingestion"]
BULKS = {
    "pause": lambda: Operation.pause("replication", reason="bulk pause", actor="op-a"),
    "resume": lambda: Operation.resume("replication", actor="op-b"),
    "schedule": lambda: Operation.resume(None, at=timedelta(hours=3), actor="op-c"),
    "cancel": lambda: Operation.cancel_scheduled_resume(None, actor="op-d"),
}


def run_bulk(url: str, kind: str, names: list[str] | None, out: str) -> None:
    """One bulk operation of ``kind`` (a key of :data:`BULKS`) on ``names`` (None: all);
    writes ``{"op_id", "items": {location: [outcome, version, error type]}}`` to ``out``."""
    mgr = connect(url, retry=RetryPolicy(max_attempts=200, max_seconds=60))
    op_id = new_op_id()
    try:
        report = mgr.bulk(BULKS[kind](), names, op_id=op_id)
    finally:
        mgr.close()
    items = {
        i.location: [
            i.outcome.value,
            None if i.status is None else i.status.version,
            None if i.error is None else type(i.error).__name__,
        ]
        for i in report.items
    }
    Path(out).write_text(json.dumps({"op_id": op_id, "kind": kind, "items": items}))


def run_singles(url: str, locations: list[str], ops: int, seed: int, out: str) -> None:
    """``ops`` random single operations on ``locations``; writes a JSON list of
    ``[location, op_id, wrote, error type]`` to ``out``."""
    rng = random.Random(seed)
    mgr = connect(url, retry=RetryPolicy(max_attempts=200, max_seconds=60))
    rows: list[list[object]] = []
    try:
        for _ in range(ops):
            loc, svc, op_id = rng.choice(locations), rng.choice(SERVICES), new_op_id()
            kind = rng.choice(["pause", "resume", "schedule", "cancel"])
            try:
                if kind == "pause":
                    rec = mgr.pause(loc, svc, actor=f"single-{seed}", op_id=op_id)
                elif kind == "resume":
                    rec = mgr.resume(loc, svc, actor=f"single-{seed}", op_id=op_id)
                elif kind == "schedule":
                    rec = mgr.resume(loc, svc, at=timedelta(minutes=rng.randint(5, 500)),
                                     op_id=op_id)
                else:
                    rec = mgr.cancel_scheduled_resume(loc, svc, op_id=op_id)
                rows.append([loc, op_id, rec.services[svc].op_id == op_id, None])
            except LocstatusError as exc:
                rows.append([loc, op_id, False, type(exc).__name__])
    finally:
        mgr.close()
    Path(out).write_text(json.dumps(rows))


def check_fleet(url: str, locations: list[str], bulk_outs: list[Path],
                single_outs: list[Path]) -> list[str]:
    """Every disagreement found (see the module docstring), as readable lines."""
    bulks = [json.loads(p.read_text()) for p in bulk_outs]
    singles = [row for p in single_outs for row in json.loads(p.read_text())]
    bad: list[str] = []
    mgr = connect(url)
    try:
        for loc in locations:
            rec = mgr.status(loc)
            hist = list(reversed(mgr.backend.history(loc, limit=10**7)))
            versions = list(dict.fromkeys(e.version for e in hist))
            if any(b != a + 1 for a, b in itertools.pairwise(versions)):
                bad.append(f"{loc}: history versions have a gap: {versions}")
            if versions and versions[-1] != rec.version:
                bad.append(f"{loc}: last history version {versions[-1]}, record {rec.version}")
            last = {e.service: e for e in hist}
            for svc, st in rec.services.items():
                e = last.get(svc)
                if e is None:
                    if st.generation:
                        bad.append(f"{loc}/{svc}: generation {st.generation} with no history")
                elif (e.to_state, e.generation, e.op_id) != (st.state, st.generation, st.op_id):
                    bad.append(f"{loc}/{svc}: record {st.state}/{st.generation}/{st.op_id}, "
                               f"last history {e.to_state}/{e.generation}/{e.op_id}")
            own: dict[str, set[int]] = {}
            for e in hist:
                if e.event != "settle":
                    own.setdefault(e.op_id, set()).add(e.version)
            for b in bulks:
                item = b["items"].get(loc)
                if item is None:
                    continue
                outcome, version, error = item
                found = own.get(b["op_id"], set())
                if outcome == "changed" and (len(found) != 1 or min(found) > version):
                    bad.append(f"{loc}: {b['kind']} changed at {version}, history {found}")
                elif outcome != "changed" and found and error != AmbiguousCommit.__name__:
                    bad.append(f"{loc}: {b['kind']} {outcome} ({error}) but in history {found}")
            for where, op_id, wrote, error in singles:
                if where != loc:
                    continue
                found = own.get(op_id, set())
                if wrote and len(found) != 1:
                    bad.append(f"{loc}: single {op_id} wrote, history {found}")
                elif not wrote and found and error != AmbiguousCommit.__name__:
                    bad.append(f"{loc}: single {op_id} did not write ({error}), history {found}")
    finally:
        mgr.close()
    return bad
