"""Two operators at once on a fleet (issue 21): bulk pauses, resumes, schedules and cancels of
``all`` and of lists, racing each other and single operations on some of the same locations,
each in its own OS process, on every durable backend. Afterwards no update is lost, no state
changed without its history, and every location's reported outcome agrees with its history
(``support/bulk_race.py``)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from locstatus import connect

from support.bulk_race import SERVICES, check_fleet, run_bulk, run_singles
from support.kits import Kit
from support.suite import sized

FLEET = sized(ci=300, long=2000)
SINGLE_OPS = sized(ci=60, long=150)


def test_bulks_racing_singles_and_each_other(durable_kit: Kit, tmp_path: Path) -> None:
    locations = [f"loc-{i:05d}" for i in range(FLEET)]
    mgr = connect(durable_kit.url)
    mgr.sync_locations({name: SERVICES for name in locations})
    mgr.close()
    plan: list[tuple[str, list[str] | None]] = [
        ("pause", None), ("schedule", None), ("resume", locations[::3]),
        ("pause", locations[::2]), ("cancel", None),
    ]
    bulk_outs = [tmp_path / f"bulk-{i}.json" for i in range(len(plan))]
    single_outs = [tmp_path / f"singles-{i}.json" for i in range(2)]
    hot = locations[:40]  # where the single operations land, the bulks cross them
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=run_bulk, args=(durable_kit.url, kind, names, str(out)))
        for (kind, names), out in zip(plan, bulk_outs, strict=True)
    ] + [
        ctx.Process(target=run_singles, args=(durable_kit.url, hot, SINGLE_OPS, i, str(out)))
        for i, out in enumerate(single_outs)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(900)
        assert p.exitcode == 0, f"an operator process exited with {p.exitcode}"
    bad = check_fleet(durable_kit.url, locations, bulk_outs, single_outs)
    assert not bad, "\n".join(bad[:20])
