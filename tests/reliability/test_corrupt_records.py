"""Corrupt records of every shape, written straight to each backend with its own client while
operators and workers keep working (SQLite, ZooKeeper, MongoDB: the ``durable_kit`` fixture).

Half of the damaged records exist before the workers start, half appear while the load runs.
Each must be reported, by name, as :class:`CorruptRecord` (library), ``corrupt_record``
(``locstatus check``, exit 1 with no other finding), never be rewritten, and never disturb any
other record: the load's history checks and the workers' convergence hold for every good
record, and the workers never adopt a damaged one.

Every shape but one is wrong in one way only: each service entry is otherwise complete, since
a record that leaves a field out is itself corrupt (``corrupt_shapes.PARTIAL``: a service
without ``state``, Backbeat's BB-37, was read as ``running``). Backends storing JSON text also
get a key written twice and payloads nested deeper than a parser recurses (ZooKeeper raised
``RecursionError`` from every read of all records). A payload carrying ``location``/``version``
keys is left to ``test_product_bugs.py``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest
from harness import Scenario

from locstatus import connect
from locstatus.errors import CorruptRecord

from support import corrupt_shapes as shapes
from support.kits import Kit

SVC = shapes.entry(state="running", resume_at=None)


def one(**changes: object) -> str:
    """A complete payload of one service, ``changes`` applied to its entry (``...``: left out):
    each shape below is wrong in one way only."""
    return shapes.record(f'{{"replication": {shapes.entry(**changes)}}}')


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
    "services-list": shapes.record("[]"),
    "services-null": shapes.record("null"),
    "service-null": shapes.record('{"replication": null}'),
    "bad-state": one(state="frozen"),
    "negative-generation": one(generation=-1),
    "generation-text": one(generation="many"),
    "generation-nan": shapes.record(
        '{"replication": ' + shapes.entry(generation=...)[:-1] + ', "generation": NaN}}'),
    "generation-inf": shapes.record(
        '{"replication": ' + shapes.entry(generation=...)[:-1] + ', "generation": 1e400}}'),
    "naive-resume-at": one(resume_at="2030-01-01T00:00:00"),
    "resume-at-garbage": one(resume_at="tomorrow"),
    "bad-service-name": shapes.record('{"../x": ' + SVC + "}"),
    "unknown-field": shapes.record('{"replication": ' + SVC + "}")[:-1] + ', "owner": "x"}',
    "unknown-service-field": one(x=1),
    "deleted-at-garbage": shapes.record('{"replication": ' + SVC + "}", '"yesterday"'),
    "reason-too-long": one(reason="r" * 5000),
    "huge": one(actor="a" * 300_000),
    "utf8-bom": "\ufeff" + shapes.GOOD,
    "truncated": shapes.GOOD[:60],
    "control-chars": one(state="running\u0000"),
    **{f"partial-{name}": text for name, text in shapes.PARTIAL.items()},
}
"""Shapes every backend can hold (MongoDB stores a JSON object's fields as the document's)."""

TEXT_SHAPES: dict[str, str] = {
    **{f"twice-{name}": text for name, text in shapes.DUPLICATE_KEYS.items()},
    **shapes.DEEP,
}
"""Shapes only a backend storing JSON text can hold: a key twice, nesting deeper than a parser
recurses."""


@pytest.mark.parametrize("durable_kit", ["sqlite", "zk", "mongo"], indirect=True)
def test_corrupt_records_of_every_shape_leave_every_other_record_intact(
    durable_kit: Kit, scenario: Callable[..., Scenario]
) -> None:
    every = {**SHAPES, **(TEXT_SHAPES if durable_kit.name != "mongo" else {})}
    bad = {f"bad-{name}": text for name, text in every.items()}
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
