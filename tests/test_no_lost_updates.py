"""8 OS processes x 500 random operations on the same 3 locations (200 each in CI's bounded
suite, ``support/suite.py``): zero lost updates.

Checked from the history (see ``history_check.py``): gap-free version chains, every successful
write exactly once at the version its caller was told, and real-time order respected. Runs on
every durable backend (SQLite files, and the server backends once they join the kits).
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from locstatus import connect

from support.history_check import check_history, load_records, run_load
from support.kits import Kit
from support.suite import sized

LOCATIONS = ["hot-1", "hot-2", "hot-3"]
PROCESSES = 8
OPS = sized(ci=200, long=500)


def test_eight_processes_lose_no_update(durable_kit: Kit, tmp_path: Path) -> None:
    mgr = connect(durable_kit.url)
    mgr.sync_locations(LOCATIONS)
    mgr.close()
    ctx = multiprocessing.get_context("spawn")
    outs = [tmp_path / f"ops-{i}.jsonl" for i in range(PROCESSES)]
    procs = [
        ctx.Process(target=run_load, args=(durable_kit.url, LOCATIONS, OPS, i, str(outs[i])))
        for i in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
        assert p.exitcode == 0, f"load process exited with {p.exitcode}"
    records = load_records(outs)
    assert len(records) == PROCESSES * OPS
    report = check_history(durable_kit.url, LOCATIONS, records)
    # the load really contended: most operations wrote, none failed for a backend reason
    assert report.failed == 0, [r["error"] for r in records if not r["ok"]][:5]
    assert report.writes > PROCESSES * OPS // 4
    print(f"\n{durable_kit.name}: {report}")
