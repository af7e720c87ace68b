"""Ctrl-C landing anywhere in a bulk operation on a real SQLite store (docs/cli.md, "Bulk:
`all`"): what was done is always reported, the command exits 130.

A SIGINT is delivered where CPython next runs Python code; inside a pydantic serialization
(a record's enum values, while a batch is encoded) pydantic wraps the KeyboardInterrupt in a
``PydanticSerializationError`` (a failure mode seen on 10 000 locations). The in-process test
delivers a real SIGINT (``signal.raise_signal``) from a trace hook exactly there.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from locstatus import Manager, State
from locstatus.backends.sqlite import SQLiteBackend
from locstatus.errors import AmbiguousCommit
from locstatus.manager import BulkInterrupted, Operation, Outcome

N = 2500  # three SQLite batches of 1000


def test_ctrl_c_inside_a_batchs_encoding_is_an_interrupt_with_the_report(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/locstatus.db"
    names = [f"loc-{i:05d}" for i in range(N)]
    with Manager(SQLiteBackend(url)) as setup:
        setup.sync_locations({n: ["replication"] for n in names})
    encodes = 0

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal encodes
        if event != "call":
            return
        if frame.f_code.co_name == "encode_record":
            encodes += 1
        back = frame.f_back
        if (  # batch 2's writes (batch 1: 1000 writes, then 1000 settles)
            encodes == 2500 and back is not None and back.f_code.co_name == "model_dump_json"
        ):  # a Python call from inside pydantic's Rust serializer: an enum's value
            sys.setprofile(None)
            signal.raise_signal(signal.SIGINT)

    mgr = Manager(SQLiteBackend(url))
    sys.setprofile(profile)
    try:
        with pytest.raises(BulkInterrupted) as info:
            mgr.bulk(Operation.pause("replication"), op_id="bulk-in-encode")
    finally:
        sys.setprofile(None)
        sys.settrace(None)
    report = info.value.report
    assert report.interrupted and encodes >= 2500
    by = {i.location: i for i in report.items}
    written = [i for i in report.items if i.outcome is Outcome.CHANGED]
    unknown = report.failed
    assert len(written) == 1000 and len(unknown) == 1000  # batch 1 written, batch 2 in flight
    assert all(isinstance(i.error, AmbiguousCommit) and "bulk-in-encode" in i.error.message
               for i in unknown)
    for loc in names:
        state = mgr.status(loc).services["replication"].state
        assert (state is not State.RUNNING) == (by.get(loc) in written), loc
    mgr.close()
