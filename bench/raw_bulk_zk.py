"""Raw kazoo baseline for ``bench/bulk.py --backend zk``: the ZooKeeper I/O of a bulk pause,
resume or create of every location, the fastest way kazoo offers.

- ``flip``: list the locations, read every znode (:data:`READS`: ``get``, the default, kazoo
  alone: one pipelined ``get_async`` per node, :data:`GETS_IN_FLIGHT` in flight; ``multiread``:
  ZooKeeper's multiRead of :data:`~locstatus.backends.zookeeper.multiread.PER_REQUEST` nodes per
  request, :data:`MULTIREADS_IN_FLIGHT` in flight, with locstatus's request class, the I/O
  locstatus does), parse, set the service's state, serialise, then write them in multi-ops of :data:`PER_MULTI` locations each
  (per location a versioned ``set_data`` plus the ``create`` of its history node), every
  multi-op sent with ``commit_async`` at once, :data:`IN_FLIGHT` at a time, every result
  inspected: the fastest kazoo pipeline measured (docs/benchmarks.md, "Bulk operations":
  multi-ops of fifty beat ten, one, and plain ``set_async`` at any window). locstatus sends
  the same groups and adds a ``check`` of the incarnation counter per location.
- ``create``: per location the ``create`` of its znode, its acknowledgements node and its
  history node, in multi-ops of :data:`PER_MULTI` locations, pipelined the same way.

Importing this module registers ``RAW["zk"]`` in the running ``bulk`` module.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from kazoo.client import KazooClient  # noqa: E402

from locstatus.backends.zookeeper import parse_zk_url  # noqa: E402
from locstatus.backends.zookeeper.multiread import MultiRead, requests  # noqa: E402

PER_MULTI = 50
IN_FLIGHT = 20
GETS_IN_FLIGHT = 1000
MULTIREADS_IN_FLIGHT = 5
READS = "get"
"""How ``flip`` reads: ``multiread`` or ``get`` (``bench/bulk.py --raw-reads``)."""


def _bulk() -> ModuleType:
    """The running bulk module: ``__main__`` when bulk.py is the script."""
    main = sys.modules.get("__main__")
    if main is not None and hasattr(main, "RAW") and hasattr(main, "RawSQLite"):
        return main
    import bulk

    return bulk


class RawZk:
    def __init__(self, url: str) -> None:
        params = parse_zk_url(url)
        auth = [("digest", ":".join(params.auth))] if params.auth else None
        self.client = KazooClient(hosts=params.hosts, timeout=params.session_timeout,
                                  auth_data=auth)
        self.client.start(timeout=params.timeout)
        self.root = params.chroot
        self.history = f"{params.chroot}/bench-raw/{uuid.uuid4().hex[:8]}"
        self.client.ensure_path(self.history)
        self.client.ensure_path(f"{params.chroot}/locations")
        self.seq = 0

    def _commit_all(self, ops: list[list[tuple[str, Any]]]) -> None:
        """Send multi-ops of ``PER_MULTI`` locations' operations, ``IN_FLIGHT`` at a time."""
        chunks = [ops[i:i + PER_MULTI] for i in range(0, len(ops), PER_MULTI)]
        for start in range(0, len(chunks), IN_FLIGHT):
            pending = []
            for chunk in chunks[start:start + IN_FLIGHT]:
                tx = self.client.transaction()
                for location_ops in chunk:
                    for name, args in location_ops:
                        getattr(tx, name)(*args)
                pending.append(tx.commit_async())
            for p in pending:
                results = p.get(timeout=30)
                failed = [r for r in results if isinstance(r, Exception)]
                assert not failed, failed[:3]

    def _read_all(self, base: str, names: list[str]) -> Iterator[tuple[str, bytes, Any]]:
        """Every node, pipelined, a bounded number in flight (100 000 sent at once queue the
        session's pings behind them: the connection drops)."""
        if READS == "get":
            for start in range(0, len(names), GETS_IN_FLIGHT):
                chunk = names[start:start + GETS_IN_FLIGHT]
                reads = [self.client.get_async(f"{base}/{n}") for n in chunk]
                for name, pending in zip(chunk, reads, strict=True):
                    data, stat = pending.get(timeout=30)
                    yield name, data, stat
            return
        runs = requests([f"{base}/{n}" for n in names], 1_000_000)
        done = 0
        for start in range(0, len(runs), MULTIREADS_IN_FLIGHT):
            pending = []
            for run in runs[start:start + MULTIREADS_IN_FLIGHT]:
                result = self.client.handler.async_result()
                self.client._call(MultiRead(run), result)
                pending.append((len(run), result))
            for count, result in pending:
                answers = result.get(timeout=30)
                assert len(answers) == count and not any(
                    isinstance(a, Exception) for a in answers), answers[:3]
                for name, (data, stat) in zip(names[done:done + count], answers, strict=True):
                    yield name, data, stat
                done += count

    def flip(self, event: str) -> None:
        bulk = _bulk()
        op_id = uuid.uuid4().hex
        state = bulk.STATES[event]
        base = f"{self.root}/locations"
        names = self.client.get_children(base)
        ops: list[list[tuple[str, Any]]] = []
        for name, data, stat in self._read_all(base, names):
            doc = json.loads(data)
            was = doc["services"][bulk.SERVICE]["state"]
            doc["services"][bulk.SERVICE]["state"] = state
            doc["services"][bulk.SERVICE]["op_id"] = op_id
            self.seq += 1
            ops.append([
                ("set_data", (f"{base}/{name}", json.dumps(doc, separators=(",", ":")).encode(),
                              stat.version)),
                ("create", (f"{self.history}/{self.seq:010d}", bulk.history_row(
                    name, stat.version + 1, event, state, op_id, was).encode())),
            ])
        self._commit_all(ops)

    def create(self, locations: list[str]) -> None:
        bulk = _bulk()
        now = datetime.now(UTC).isoformat()
        op_id = uuid.uuid4().hex
        base = f"{self.root}/locations"
        acks = f"{self.root}/bench-raw-acks-{uuid.uuid4().hex[:8]}"
        self.client.ensure_path(acks)
        ops: list[list[tuple[str, Any]]] = []
        for name in locations:
            doc = {"services": {bulk.SERVICE: {
                "state": "running", "generation": 0, "resume_at": None, "reason": None,
                "actor": None, "op_id": op_id, "updated_at": now}}, "deleted_at": None,
                "incarnation": 0}
            # the nodes locstatus's create makes (zookeeper/layout.py): the location's
            # incarnation counter (created, then set), its record, its acks, its history's
            # incarnation and first bucket, and the create's entry in it
            life = f"{self.history}/{name}"
            ops.append([
                ("create", (life, b"")),
                ("set_data", (life, b"", 0)),
                ("create", (f"{base}/{name}", json.dumps(doc, separators=(",", ":")).encode())),
                ("create", (f"{acks}/{name}", b"")),
                ("create", (f"{life}/{0:010d}", b"")),
                ("create", (f"{life}/{0:010d}/b{0:07d}", b"")),
                ("create", (f"{life}/{0:010d}/b{0:07d}/{1:010d}",
                            bulk.history_row(name, 1, "create", None, op_id).encode())),
            ])
        self._commit_all(ops)

    def close(self) -> None:
        self.client.stop()
        self.client.close()


_bulk().RAW["zk"] = RawZk
