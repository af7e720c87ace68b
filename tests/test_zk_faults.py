"""Faults of a real 3-node ZooKeeper ensemble on 127.0.0.1 (``servers.start_ensemble``).

- The leader is killed with SIGKILL while several OS processes write: every operation either
  succeeded exactly once (at the version its caller was told, gap-free history, real-time order)
  or failed with a clear error that says whether its outcome is known; the clients carry on
  once a quorum is back, and again after the old leader rejoins.
- The whole ensemble is stopped and started again (same data): writes while it is down fail
  cleanly without being applied later, and afterwards records, history and the worker
  registrations are all there.

Each scenario is bounded (well under two minutes on two shared cores).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from locstatus import LocstatusError, connect
from locstatus.backends.zookeeper import ZooKeeperBackend
from locstatus.errors import BackendUnavailable
from locstatus.manager import RetryPolicy
from locstatus.models import State, WorkerInfo, new_op_id

from support.history_check import full_history
from support.kits_zk import raw_client, wait_until
from support.servers import ZooKeeperEnsemble, start_ensemble

LOCATIONS = ["hot-1", "hot-2", "hot-3"]
SERVICES = ["replication", "lifecycle", "ingestion"]


@pytest.fixture
def ensemble(tmp_path: Path) -> Iterator[ZooKeeperEnsemble]:
    ens = start_ensemble(tmp_path, 3)
    try:
        yield ens
    finally:
        ens.close()


def load_until_stopped(url: str, seed: int, out: str, stop: str, max_ops: int) -> None:
    """One OS process: random operations until ``stop`` exists; one JSON line per operation,
    written before the next starts (line-buffered), like ``history_check.run_load``."""
    rng = random.Random(seed)
    mgr = connect(url, retry=RetryPolicy(max_attempts=200, max_seconds=60))
    with open(out, "w", buffering=1) as fh:
        for _ in range(max_ops):
            if os.path.exists(stop):
                break
            op, loc, svc = rng.choice(["pause", "resume", "schedule"]), rng.choice(LOCATIONS), rng.choice(SERVICES)
            op_id = new_op_id()
            start = time.time()
            ok, wrote, version, error = True, False, None, None
            try:
                if op == "pause":
                    rec = mgr.pause(loc, svc, op_id=op_id)
                elif op == "resume":
                    rec = mgr.resume(loc, svc, op_id=op_id)
                else:
                    rec = mgr.resume(loc, svc, at=timedelta(hours=rng.randint(1, 9)), op_id=op_id)
                wrote = rec.services[svc].op_id == op_id
                version = rec.version
            except LocstatusError as exc:
                ok, error = False, f"{type(exc).__name__}: {exc}"
            fh.write(json.dumps({
                "op_id": op_id, "location": loc, "start": start, "end": time.time(), "ok": ok,
                "wrote": wrote, "version": version, "error": error,
            }) + "\n")
            time.sleep(0.005)
    Path(out + ".stats").write_text(json.dumps(mgr.stats))
    mgr.close()


def _records(outs: list[Path]) -> list[dict[str, object]]:
    return [json.loads(line) for p in outs if p.exists() for line in p.read_text().splitlines() if line]


def _check(url: str, records: list[dict[str, object]]) -> dict[str, int]:
    """Exactly-once and clear-failure checks over the history of every location."""
    refused = failed = unknown = 0
    for r in records:
        if r["ok"]:
            continue
        error = str(r["error"])
        if error.startswith("InvalidTransition"):
            refused += 1
            continue
        failed += 1
        assert error.split(":")[0] in ("BackendUnavailable", "AmbiguousCommit", "ConflictError"), error
        assert "ZooKeeper" in error or "conflict" in error, f"unclear error: {error}"
        unknown += "outcome is unknown" in error
    for loc in LOCATIONS:
        hist = full_history(url, loc)
        versions = list(dict.fromkeys(e.version for e in hist))
        assert versions == list(range(versions[0], versions[0] + len(versions))), f"{loc}: gap"
        # each operation's own change; its settle, when the call settled it itself (no live
        # worker applies it), is a write of its own after it, and the version the call returns
        seen: dict[str, set[int]] = {}
        settled: dict[str, int] = {}
        for e in hist:
            if e.event == "settle":
                settled[e.op_id] = e.version
            else:
                seen.setdefault(e.op_id, set()).add(e.version)
        mine = [r for r in records if r["location"] == loc]
        for r in mine:
            found = seen.get(str(r["op_id"]), set())
            if r["wrote"]:
                assert found == {r["version"]} or (
                    len(found) == 1 and settled.get(str(r["op_id"])) == r["version"]
                    and min(found) < r["version"]  # type: ignore[operator]
                ), f"{loc}: op {r['op_id']} at {found}, told {r['version']}"
            elif not r["ok"] and "outcome is unknown" in str(r["error"]):
                assert len(found) <= 1, f"{loc}: op {r['op_id']} applied twice"
            else:
                assert not found, f"{loc}: op {r['op_id']} ({r['error'] or 'no-op'}) is in the history"
        done = sorted((r for r in mine if r["wrote"]), key=lambda r: float(r["end"]))  # type: ignore[arg-type]
        for a in done:
            later = [b for b in done if float(b["start"]) > float(a["end"])]  # type: ignore[arg-type]
            assert all(int(b["version"]) > int(a["version"]) for b in later), f"{loc}: order"  # type: ignore[call-overload]
    return {"operations": len(records), "writes": sum(bool(r["wrote"]) for r in records),
            "refused": refused, "failed": failed, "outcome_unknown": unknown}


def _lines(paths: list[Path]) -> int:
    return sum(p.read_text().count("\n") for p in paths if p.exists())


@pytest.mark.slow
def test_killing_the_leader_under_load_loses_and_duplicates_nothing(
    ensemble: ZooKeeperEnsemble, tmp_path: Path
) -> None:
    url = f"zk://{ensemble.hosts}/faults?timeout=30&session_timeout=10"
    mgr = connect(url)
    mgr.sync_locations(LOCATIONS)
    mgr.close()
    stop = tmp_path / "stop"
    outs = [tmp_path / f"ops-{i}.jsonl" for i in range(4)]
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=load_until_stopped, args=(url, i, str(outs[i]), str(stop), 3000))
        for i in range(len(outs))
    ]
    for p in procs:
        p.start()
    try:
        wait_until(lambda: _lines(outs) >= 200, 60, what="the load to get going")
        leader = ensemble.leader()
        killed_at = time.time()
        ensemble.kill(leader)  # kill -9
        new_leader = ensemble.leader(timeout=30)
        quorum_at = time.time()
        assert new_leader != leader
        wait_until(lambda: _lines(outs) >= 200 + 100, 60, what="writes on the new quorum")
        ensemble.start(leader)  # the old leader rejoins as a follower
        rejoined_at = time.time()
        at_rejoin = _lines(outs)
        wait_until(lambda: _lines(outs) >= at_rejoin + 200, 60, what="writes after the rejoin")
    finally:
        stop.touch()
        for p in procs:
            p.join(120)
    assert [p.exitcode for p in procs] == [0] * len(procs)
    records = _records(outs)
    report = _check(url, records)
    for name in ("ambiguous", "conflicts"):
        report[name] = sum(json.loads(Path(f"{o}.stats").read_text())[name] for o in outs)
    during = [r for r in records if killed_at <= float(r["start"]) <= quorum_at]  # type: ignore[arg-type]
    after = [r for r in records if float(r["start"]) > rejoined_at]  # type: ignore[arg-type]
    assert after and all(r["ok"] or str(r["error"]).startswith("InvalidTransition") for r in after)
    print(f"\nleader {leader} killed; new leader {new_leader} after {quorum_at - killed_at:.1f}s; "
          f"{len(during)} operations started during the election, {len(after)} after the "
          f"rejoin; {report}")


@pytest.mark.slow
def test_a_whole_ensemble_restart_keeps_records_history_and_workers(
    ensemble: ZooKeeperEnsemble, tmp_path: Path
) -> None:
    url = f"zk://{ensemble.hosts}/restart?timeout=3&session_timeout=20"
    mgr = connect(url)
    worker = ZooKeeperBackend(url)
    try:
        mgr.sync_locations({"site-a": ["replication"], "site-b": ["replication"]})
        mgr.pause("site-a", "replication", op_id="op-before")
        worker.put_worker(
            WorkerInfo(worker_id="w-1", services=("replication",), locations=("site-a",))
        )
        worker.ack("w-1", "site-a", "replication", 1)
        before = {r.location: r for r in mgr.statuses()}

        ensemble.stop()  # every member, SIGTERM
        with pytest.raises(BackendUnavailable, match="ZooKeeper"):
            mgr.pause("site-b", "replication", op_id="op-during")
        ensemble.start_all()

        wait_until(lambda: _ok(mgr.backend.ping), 60, what="the client to reconnect")
        after = {r.location: r for r in mgr.statuses()}
        assert after == before
        rec = mgr.pause("site-b", "replication", op_id="op-after")
        assert rec.services["replication"].state is State.PAUSED
        ops = [e.op_id for e in mgr.history("site-b", 50)]
        assert "op-during" not in ops and "op-after" in ops
        assert "op-before" in [e.op_id for e in mgr.history("site-a", 50)]
        wait_until(lambda: [w.worker_id for w in mgr.workers()] == ["w-1"], 30, what="w-1 registered")
        wait_until(lambda: mgr.backend.acks("site-a") == {"w-1": {"replication": 1}}, 30,
                   what="w-1's ack")
        with raw_client(ensemble.hosts) as raw:
            assert raw.exists("/restart/workers/w-1").ephemeralOwner != 0
    finally:
        worker.close()
        mgr.close()


def _ok(fn: object) -> bool:
    try:
        fn()  # type: ignore[operator]
    except BackendUnavailable:
        return False
    return True
