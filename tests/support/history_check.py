"""Load generator and history checker for "no lost updates" scenarios (issues 2, 3, 4, 8).

:func:`run_load` is run in N OS processes; each issues random pause / resume / schedule / cancel
operations through the manager on a few locations and records every operation (start and end
time, op_id, outcome, the version it produced) to a JSON-lines file.

:func:`check_history` reads the backend's history afterwards and asserts, per location:

- the versions of the history form a gap-free chain (each write is exactly one above the one
  before it);
- every operation reported successful that changed something appears in the history exactly once
  (by op_id), at the version the caller was told (or, when the call settled its own change, that
  settle's write is the version told); none reported failed appears;
- real-time order: an operation that completed before another started has the lower version.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from locstatus import LocstatusError, connect
from locstatus.manager import RetryPolicy
from locstatus.models import HistoryEntry, new_op_id

OPS = ("pause", "resume", "schedule", "cancel")


def run_load(url: str, locations: list[str], ops: int, seed: int, out: str) -> None:
    """Issue ``ops`` random operations on ``locations``; append one JSON line per operation
    to ``out``: {op, op_id, location, service, start, end, ok, wrote, version, error}."""
    rng = random.Random(seed)
    mgr = connect(url, retry=RetryPolicy(max_attempts=200, max_seconds=60))
    services = ["replication", "lifecycle", "ingestion"]
    with open(out, "w") as fh:
        for _ in range(ops):
            op = rng.choice(OPS)
            loc = rng.choice(locations)
            svc = rng.choice(services)
            op_id = new_op_id()
            start = time.time()
            ok, wrote, version, error = True, False, None, None
            try:
                if op == "pause":
                    rec = mgr.pause(loc, svc, reason="load", actor=f"p{seed}", op_id=op_id)
                elif op == "resume":
                    rec = mgr.resume(loc, svc, actor=f"p{seed}", op_id=op_id)
                elif op == "schedule":
                    rec = mgr.resume(
                        loc, svc, at=timedelta(minutes=rng.randint(5, 500)), op_id=op_id
                    )
                else:
                    rec = mgr.cancel_scheduled_resume(loc, svc, op_id=op_id)
                wrote = rec.services[svc].op_id == op_id
                version = rec.version
            except LocstatusError as exc:
                ok, error = False, f"{type(exc).__name__}: {exc}"
            end = time.time()
            fh.write(
                json.dumps(
                    {
                        "op": op, "op_id": op_id, "location": loc, "service": svc,
                        "start": start, "end": end, "ok": ok, "wrote": wrote,
                        "version": version, "error": error,
                    }
                )
                + "\n"
            )
    mgr.close()


@dataclass
class Report:
    operations: int
    writes: int
    refused: int
    failed: int
    lost: int
    duplicated: int


def load_records(paths: list[Path]) -> list[dict[str, object]]:
    return [json.loads(line) for p in paths for line in p.read_text().splitlines() if line]


def full_history(url: str, location: str) -> list[HistoryEntry]:
    mgr = connect(url)
    try:
        return list(reversed(mgr.backend.history(location, limit=10**7)))
    finally:
        mgr.close()


def check_history(url: str, locations: list[str], records: list[dict[str, object]]) -> Report:
    """Assert the three properties above; return counts for the report."""
    lost = duplicated = 0
    refused = sum(1 for r in records if not r["ok"] and "InvalidTransition" in str(r["error"]))
    failed = sum(1 for r in records if not r["ok"]) - refused
    writes = sum(1 for r in records if r["wrote"])
    for loc in locations:
        hist = full_history(url, loc)
        versions = list(dict.fromkeys(e.version for e in hist))
        gaps = [(a, b) for a, b in itertools.pairwise(versions) if b != a + 1]
        assert not gaps, f"{loc}: history versions are not a gap-free chain: {gaps[:5]}"
        # The versions each operation's own change landed at; a change no live worker applies
        # is settled by the same call right after, in a write of its own under the same op_id
        # (its settle rows), and the call returns that write's version.
        by_op: dict[str, set[int]] = {}
        settled: dict[str, int] = {}
        for e in hist:
            if e.event == "settle":
                settled[e.op_id] = e.version
            else:
                by_op.setdefault(e.op_id, set()).add(e.version)
        mine = [r for r in records if r["location"] == loc]
        for r in mine:
            found = by_op.get(str(r["op_id"]), set())
            if r["wrote"]:
                if len(found) == 0:
                    lost += 1
                elif len(found) > 1:
                    duplicated += 1
                else:
                    told = {r["version"]}
                    assert found == told or (
                        settled.get(str(r["op_id"])) == r["version"] and min(found) < r["version"]  # type: ignore[operator]
                    ), f"{loc}: op {r['op_id']} at {found}, told {r['version']}"
            elif not r["ok"]:
                assert not found, f"{loc}: failed op {r['op_id']} appears in history"
            else:
                assert not found, f"{loc}: op {r['op_id']} reported no change but appears"
        wrote = sorted((r for r in mine if r["wrote"]), key=lambda r: float(r["end"]))  # type: ignore[arg-type]
        # real-time order: if a ended before b started, version(a) < version(b)
        by_start = sorted(wrote, key=lambda r: float(r["start"]))  # type: ignore[arg-type]
        max_done_version = -1
        j = 0
        for b in by_start:
            while j < len(wrote) and float(wrote[j]["end"]) < float(b["start"]):  # type: ignore[arg-type]
                max_done_version = max(max_done_version, int(wrote[j]["version"]))  # type: ignore[call-overload]
                j += 1
            assert int(b["version"]) > max_done_version, (  # type: ignore[call-overload]
                f"{loc}: op {b['op_id']} started after a write at version {max_done_version} "
                f"completed, yet got version {b['version']}"
            )
    assert lost == 0, f"{lost} acknowledged operations are missing from history"
    assert duplicated == 0, f"{duplicated} operations appear more than once"
    return Report(len(records), writes, refused, failed, lost, duplicated)
