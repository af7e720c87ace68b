"""Corrupt records of every shape, written straight to each backend with its own client while
operators and workers keep working (SQLite, ZooKeeper, MongoDB: the ``durable_kit`` fixture).

Half of the damaged records exist before the workers start, half appear while the load runs.
Each must be reported, by name, as :class:`CorruptRecord` (library), ``corrupt_record``
(``locstatus check``, exit 1 with no other finding), never be rewritten, and never disturb any
other record: the load's history checks and the workers' convergence hold for every good
record, and the workers never adopt a damaged one.

Two shapes are left to ``test_product_bugs.py`` because the product mishandles them today: a
payload carrying ``location``/``version`` keys and a deeply nested one.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest
from harness import Scenario

from locstatus import connect
from locstatus.errors import CorruptRecord

from kits import Kit

SVC = '{"state": "running", "generation": 0}'
SHAPES: dict[str, str] = {
    "not-json": "{broken",
    "empty": "",
    "whitespace": "   \n",
    "json-null": "null",
    "json-list": "[1, 2, 3]",
    "json-string": '"paused"',
    "json-number": "42",
    "json-true": "true",
    "no-services": "{}",
    "services-list": '{"services": []}',
    "services-null": '{"services": null}',
    "service-null": '{"services": {"replication": null}}',
    "bad-state": '{"services": {"replication": {"state": "frozen"}}}',
    "negative-generation": '{"services": {"replication": {"state": "paused", "generation": -1}}}',
    "generation-text": '{"services": {"replication": {"generation": "many"}}}',
    "generation-nan": '{"services": {"replication": {"generation": NaN}}}',
    "generation-inf": '{"services": {"replication": {"generation": 1e400}}}',
    "naive-resume-at": '{"services": {"replication": {"state": "paused", '
                       '"resume_at": "2030-01-01T00:00:00"}}}',
    "resume-at-garbage": '{"services": {"replication": {"resume_at": "tomorrow"}}}',
    "bad-service-name": '{"services": {"../x": ' + SVC + "}}",
    "unknown-field": '{"services": {"replication": ' + SVC + '}, "owner": "x"}',
    "unknown-service-field": '{"services": {"replication": {"state": "running", "x": 1}}}',
    "deleted-at-garbage": '{"services": {}, "deleted_at": "yesterday"}',
    "reason-too-long": '{"services": {"replication": {"reason": "' + "r" * 5000 + '"}}}',
    "huge": '{"services": {"replication": {"actor": "' + "a" * 300_000 + '"}}}',
    "utf8-bom": '\ufeff{"services": {}}',
    "truncated": '{"services": {"replication": {"state": "run',
    "control-chars": '{"services": {"replication": {"state": "running\u0000"}}}',
}


@pytest.mark.parametrize("durable_kit", ["sqlite", "zk", "mongo"], indirect=True)
def test_corrupt_records_of_every_shape_leave_every_other_record_intact(
    durable_kit: Kit, scenario: Callable[..., Scenario]
) -> None:
    shapes = dict(SHAPES)
    if durable_kit.name == "zk":
        # ZooKeeper hands back bytes, and json.loads(bytes) reads a BOM as utf-8-sig: readable
        del shapes["utf8-bom"]
    bad = {f"bad-{name}": text for name, text in shapes.items()}
    names = sorted(bad)
    rng = random.Random(41)
    rng.shuffle(names)
    before, during = names[: len(names) // 2], names[len(names) // 2 :]
    for loc in before:
        durable_kit.write_raw(loc, bad[loc])
    sc = scenario(f"corrupt records of every shape ({len(bad)})", durable_kit.name,
                  durable_kit.url, loaders=3, rate=10.0, agents=2,
                  agent_args=["--lease", "6", "--heartbeat", "1"]).start()
    sc.wait_ops(10)
    gap = max(0.05, (sc.remaining - 1) / max(1, len(during)))
    for loc in during:
        f = sc.faults.start("write_corrupt_record", loc)
        durable_kit.write_raw(loc, bad[loc])
        sc.faults.heal(f)
        time.sleep(min(gap, max(0.0, sc.remaining)))
    for loc in before:
        sc.faults.instant("corrupt_record_at_start", loc)
    while sc.remaining > 0:
        time.sleep(min(0.2, sc.remaining))
    with connect(durable_kit.url) as mgr:
        details = {r.location: r.detail for r in mgr.scan() if isinstance(r, CorruptRecord)}
        assert set(details) == set(bad), sorted(set(bad) ^ set(details))
        for loc in bad:
            with pytest.raises(CorruptRecord, match=loc):
                mgr.status(loc)
            with pytest.raises(CorruptRecord, match=loc):
                mgr.pause(loc)
    sc.finish(expect_corrupt=sorted(bad), enforce_target=False)
    with connect(durable_kit.url) as mgr:
        after = {r.location: r.detail for r in mgr.scan() if isinstance(r, CorruptRecord)}
    assert after == details, "a corrupt record was rewritten"
    for a in sc.agents:
        snap = a.snapshot()
        assert snap is not None and not set(snap["records"]) & set(bad)
        assert snap["metrics"]["corrupt_records"] > 0
    sc.row.notes += f", {len(bad)} shapes"
