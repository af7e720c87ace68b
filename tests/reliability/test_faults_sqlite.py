"""SQLite writers killed inside their write transaction, under random operator load.

4 load processes (hot and cold locations), 3 worker agents (3 s lease), faults repeated for the
scenario's load time, then the checks of ``harness.Scenario.finish``: nothing lost or
duplicated, history consistent with every caller, converged (target: 2 s after the last
fault). Worker faults on SQLite are in ``test_faults_workers.py``.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from faults import wait_for
from harness import Scenario

from support.history_check import full_history


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/locstatus.db"


def test_writers_killed_inside_their_transaction_commit_nothing(
    scenario: Callable[..., Scenario], tmp_path: Path
) -> None:
    """A writer stalls after its UPDATE and history INSERT, before COMMIT, holding the write
    lock; it is killed with SIGKILL. Load processes are also killed at random (mid-operation)
    and restarted. The stalled writes must never appear, everyone else must carry on, and the
    database must pass ``PRAGMA integrity_check``."""
    url = sqlite_url(tmp_path)
    sc = scenario("sqlite writer killed inside a transaction", "sqlite", url).start()
    assert sc.load is not None
    rng = random.Random(3)
    trapped: list[Path] = []
    sc.wait_ops(20)
    while sc.remaining > 1:
        proc, marker, out = sc.load.trap()
        f = sc.faults.start("kill9_writer_in_txn", str(marker.name))
        wait_for(marker.exists, 60, "the trapped writer to hold its transaction")
        before = sc.load.lines()
        time.sleep(rng.uniform(0.05, 0.5))  # everyone else waits on the write lock meanwhile
        proc.kill9()
        sc.faults.heal(f)
        trapped.append(out)
        sc.wait_ops(5)  # the lock went with the process: the others write again
        assert sc.load.lines() > before
        if rng.random() < 0.5:
            slot = rng.randrange(len(sc.load.slots))
            g = sc.faults.start("kill9_load_process", f"slot {slot}")
            sc.load.kill9(slot)
            sc.load.restart(slot)
            sc.faults.heal(g)
        time.sleep(min(max(0.0, sc.remaining - 0.2), rng.uniform(0.2, 1.0)))
    sc.finish()
    # the trapped operations: begun, never finished, never committed
    import json

    trap_ops = [json.loads(p.read_text().splitlines()[-1]) for p in trapped]  # the stalled one
    assert len(trap_ops) == len(trapped) >= 1 and all(op["k"] == "b" for op in trap_ops)
    for op in trap_ops:
        assert not any(e.op_id == op["op_id"] for e in full_history(url, op["location"])), op
    db = sqlite3.connect(tmp_path / "locstatus.db")
    try:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        db.close()
