"""Location records and their history on ZooKeeper: create, read, compare-and-set, delete and
history pages, each write one labelled multi-op (docs/zookeeper.md).

Why it is shaped so:

- **Compare-and-set is one multi-op**: ``check(history/<loc>, incarnation + 1)`` +
  ``set_data(locations/<loc>, payload, znode version)`` + ``create(history node)``. The check on
  the incarnation counter is what makes a stale version of a deleted-and-recreated record fail
  *inside* the transaction; ``czxid`` would tell a recreation apart too, but it cannot be
  checked in a multi-op, only read before it (a race), so the counter replaces it.
- **Each refusal is one domain error**: the label of the failed operation and its error decide
  (``match`` on the :class:`~locstatus.backends.zookeeper.txn.Refusal`), and an outcome lost
  with the connection (:class:`AmbiguousCommit`) is never mistaken for a refusal: the manager
  resolves it by the write's history (invariants 4, 9), a create and a delete here by a re-read.
- **Batches** (:meth:`Records.compare_and_set_many`, :meth:`Records.create_many`) put
  :data:`GROUP` locations' operations in one multi-op and send every multi-op of the batch at
  once, pipelined: one server transaction per fifty locations and one wait per batch. A
  multi-op is all or nothing: a refused compare-and-set group decides the location whose
  operation failed and sends the others again as a group; a refused create group is sent
  again one location per multi-op. A conflict fails only its own location.
- **Bulk reads** (:meth:`Records.read_many`, :meth:`Records.read_all`) ask for many records
  per request (:meth:`ZkClient.get_many`, ZooKeeper's multiRead), each answered as its own
  read would be.
- **Delete** removes the record and its acknowledgements atomically; its history is keyed by
  incarnation, so what an interrupted clean-up leaves behind is never read again.

:class:`Records` is over 500 lines, on purpose: the batched writes build their multi-ops from
the same per-location operation builders as the single writes (``_cas_parts``, ``_cas_ops``,
``_create_parts``) and decide each refusal by the same labels; one class keeps each write and
its batched form side by side, where a change to one is seen to need the other.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any, NoReturn, cast

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.protocol.states import ZnodeStat
from pydantic import TypeAdapter

from locstatus.backends import codec
from locstatus.backends.base import (
    CasItem,
    CasResult,
    CreateItem,
    ReadResult,
    distinct_locations,
)
from locstatus.backends.history import HistoryPage
from locstatus.backends.zookeeper.client import ZkClient
from locstatus.backends.zookeeper.layout import (
    BUCKET,
    Layout,
    decode_record,
    join_version,
    record_bytes,
    split_version,
    text_bytes,
)
from locstatus.backends.zookeeper.txn import Refusal, Transaction
from locstatus.errors import (
    AlreadyExists,
    AmbiguousCommit,
    BackendUnavailable,
    CorruptRecord,
    LocstatusError,
    NotFound,
    VersionConflict,
)
from locstatus.models import HistoryEntry, LocationStatus, copy_with, with_version

log = logging.getLogger(__name__)

_HISTORY = TypeAdapter(list[HistoryEntry])
_RACES = 20
"""Attempts of a create or delete that keeps meeting a concurrent one."""
GROUP = 50
"""Locations per multi-op in a batched compare-and-set or create (one server transaction, one
log append, for fifty locations). Measured with kazoo alone (docs/benchmarks.md, "Bulk
operations"): 20 000 versioned sets with their history nodes took 2.4-2.9 s and 0.7 s of
client CPU in multi-ops of ten, 0.9-1.1 s and 0.45 s in multi-ops of fifty, 7-10 s one
location per multi-op; the server's and kazoo's cost is per request more than per
operation."""


class Records:
    """The record and history operations of :class:`ZooKeeperBackend` (same contract, same
    errors: :class:`~locstatus.backends.base.Backend`), over one :class:`ZkClient`."""

    def __init__(self, client: ZkClient, paths: Layout) -> None:
        self.client = client
        self.paths = paths
        self.kazoo = client.kazoo

    def decode(self, location: str, raw: bytes, stat: ZnodeStat) -> LocationStatus:
        """The record stored as ``raw`` with ``stat``. Raises :class:`CorruptRecord`."""
        return decode_record(location, raw, stat.version, self._incarnation_of)

    def _incarnation_of(self, location: str) -> int:
        """Fallback for a record without an ``incarnation`` field (written by hand)."""
        path = self.paths.history(location)
        stat = self.client.call(
            f"read location {location!r}", lambda: self.client.get(self.kazoo.exists_async(path))
        )
        return max(0, stat.version - 1) if stat is not None else 0

    # -- create ------------------------------------------------------------------------------

    def create(self, record: LocationStatus, history: Sequence[HistoryEntry]) -> LocationStatus:
        loc = record.location
        pa, client = self.paths, self.client
        parent = pa.history(loc)
        for _ in range(_RACES):

            def counter() -> int:
                with contextlib.suppress(NodeExistsError):
                    client.get(self.kazoo.create_async(parent, b""))
                return cast(int, client.get(self.kazoo.exists_async(parent)).version)

            inc = client.call(f"create location {loc!r}", counter)
            version = join_version(inc, 1)
            txn, payload = self._create_txn(record, history, inc)
            try:
                refused = client.commit(f"create of location {loc!r}", txn)
            except AmbiguousCommit:
                refused = self._resolve_create(loc, payload)
            match refused:
                case None:
                    return copy_with(record, {"version": version})
                case Refusal("location", NodeExistsError()):
                    raise AlreadyExists(f"location {loc!r} already exists")
                case Refusal("incarnation", BadVersionError() | NoNodeError()):
                    continue  # a concurrent create or delete: read the counter again
                case Refusal("acks" | "history" as label, NodeExistsError()):
                    # Left over by an interrupted purge or an older layout: not part of a live
                    # record.
                    log.warning("location %s: removing leftover %s nodes before create", loc,
                                label)
                    client.call("clean up", partial(client.delete_tree, pa.acks(loc)))
                    client.call("clean up", partial(client.delete_tree, pa.incarnation(loc, inc)))
                    continue
                case Refusal(label, exc):
                    raise client.unavailable(f"create location {loc!r} ({label})", exc)
        raise BackendUnavailable(f"create of location {loc!r} kept racing; try again")

    def create_many(
        self, items: Sequence[CreateItem], *, texts: Sequence[tuple[str, str]] | None = None
    ) -> list[CasResult]:
        """Creates grouped :data:`GROUP` locations to a multi-op, every group sent at once,
        pipelined on the session (:meth:`ZkClient.commit_many`), each location created as
        the first life of a location never stored (its incarnation counter created in the
        same multi-op, where :meth:`create` reads or creates it first). A group refused (a
        location there already, or stored before: its counter exists) or whose answer was
        lost and not found applied is done again one location at a time by :meth:`create`,
        which handles each of those."""
        distinct_locations(record.location for record, _ in items)
        results: list[CasResult | None] = [None] * len(items)
        groups: list[list[int]] = []
        txns: list[Transaction] = []
        payloads: dict[int, bytes] = {}
        size = self.client.params.max_bytes
        parent_of = self.paths.history

        def add(txn: Transaction, record: LocationStatus, payload: bytes, entries: bytes,
                with_history: bool) -> None:
            parent = parent_of(record.location)
            txn.create("incarnation", parent)
            txn.set_data("incarnation", parent, b"", 0)
            self._create_ops(txn, record, 0, payload, entries, with_history)

        for i, (record, history) in enumerate(items):
            try:
                payload, entries = self._create_parts(
                    record, history, 0, None if texts is None else texts[i]
                )
            except LocstatusError as exc:
                results[i] = exc
                continue
            if not groups or len(groups[-1]) >= GROUP:
                groups.append([])
                txns.append(self.client.transaction())
            mark = txns[-1].mark()
            add(txns[-1], record, payload, entries, bool(history))
            if groups[-1] and txns[-1].size > size:  # too large with it: it starts the next
                txns[-1].undo(mark)
                groups.append([])
                txns.append(self.client.transaction())
                add(txns[-1], record, payload, entries, bool(history))
            payloads[i] = payload
            groups[-1].append(i)
        outcomes = self.client.commit_many(
            lambda k: f"create of location {items[groups[k][0]][0].location!r}", txns
        )
        for group, outcome in zip(groups, outcomes, strict=True):
            if isinstance(outcome, AmbiguousCommit):
                try:  # one multi-op: all of it applied or none
                    outcome = self._resolve_create(items[group[0]][0].location,
                                                   payloads[group[0]])
                except LocstatusError as exc:
                    outcome = exc
            if isinstance(outcome, LocstatusError):
                for i in group:
                    results[i] = outcome  # unreachable, closed, or still unknown: as alone
            elif outcome is None:
                for i in group:
                    record = items[i][0]
                    results[i] = copy_with(record, {"version": join_version(0, 1)})
        for i, (record, history) in enumerate(items):
            if results[i] is None:
                try:
                    results[i] = self.create(record, history)
                except LocstatusError as exc:
                    results[i] = exc
        return [r for r in results if r is not None]

    def _create_parts(
        self, record: LocationStatus, history: Sequence[HistoryEntry], inc: int,
        texts: tuple[str, str] | None = None,
    ) -> tuple[bytes, bytes]:
        """The payload and history bytes of a create as life ``inc + 1`` (from ``texts``, the
        codec's texts of a first life's create, when given: :meth:`Backend.create_many`).
        Raises :class:`InvalidInput` for a record too large."""
        if texts is not None and inc == 0:
            payload, entries = text_bytes(texts[0], inc), texts[1].encode()
        else:
            payload = record_bytes(record, inc)
            entries = _HISTORY.dump_json(codec.stamp(history, join_version(inc, 1)))
        self.client.check_size(record.location, "record and history", payload, entries)
        return payload, entries

    def _create_ops(
        self, txn: Transaction, record: LocationStatus, inc: int, payload: bytes,
        entries: bytes, with_history: bool,
    ) -> None:
        loc = record.location
        pa = self.paths
        txn.create("location", pa.location(loc), payload)
        txn.create("acks", pa.acks(loc))
        txn.create("history", pa.incarnation(loc, inc))
        txn.create("history", pa.bucket(loc, inc, 1))
        if with_history:
            txn.create("history", pa.entry(loc, inc, 1), entries)

    def _create_txn(
        self, record: LocationStatus, history: Sequence[HistoryEntry], inc: int
    ) -> tuple[Transaction, bytes]:
        """The multi-op creating ``record`` as life ``inc + 1`` (the counter read at ``inc``),
        and its payload. Raises :class:`InvalidInput` for a record too large."""
        payload, entries = self._create_parts(record, history, inc)
        parent = self.paths.history(record.location)
        txn = self.client.transaction()
        txn.check("incarnation", parent, inc)
        txn.set_data("incarnation", parent, b"", inc)
        self._create_ops(txn, record, inc, payload, entries, bool(history))
        return txn, payload

    def _resolve_create(self, location: str, payload: bytes) -> Refusal | None:
        """After an ambiguous create: None if our record is there, a refusal to act on else."""

        def look() -> tuple[bytes, ZnodeStat] | None:
            try:
                return cast(
                    "tuple[bytes, ZnodeStat]",
                    self.client.get(self.kazoo.get_async(self.paths.location(location))),
                )
            except NoNodeError:
                return None

        found = self.client.call(f"read location {location!r}", look)
        if found is None:
            return Refusal("incarnation", BadVersionError())  # not there: try again
        if found[0] == payload and found[1].version == 0:
            return None
        return Refusal("location", NodeExistsError())

    # -- reads -------------------------------------------------------------------------------

    def read(self, location: str) -> LocationStatus:
        path = self.paths.location(location)

        def get() -> tuple[bytes, ZnodeStat]:
            try:
                return cast("tuple[bytes, ZnodeStat]", self.client.get(self.kazoo.get_async(path)))
            except NoNodeError:
                raise NotFound(f"unknown location {location!r}") from None

        raw, stat = self.client.call(f"read location {location!r}", get)
        return self.decode(location, raw, stat)

    def read_many(self, locations: Sequence[str]) -> list[ReadResult]:
        """Many records per request (:meth:`ZkClient.get_many`: multiRead, pipelined); a node
        gone is its :class:`NotFound`, one that does not decode its :class:`CorruptRecord`.
        A name given twice is read twice."""
        client = self.client
        location = self.paths.location
        paths = [location(loc) for loc in locations]  # names checked before any I/O
        got = client.call(f"read {len(paths)} locations", partial(client.get_many, paths))
        out: list[ReadResult] = []
        for loc, node in zip(locations, got, strict=True):
            if node is None:
                out.append(NotFound(f"unknown location {loc!r}"))
                continue
            try:
                out.append(self.decode(loc, *node))
            except CorruptRecord as exc:
                out.append(exc)
        return out

    def read_all(self) -> list[LocationStatus | CorruptRecord]:
        pa, client = self.paths, self.client

        def get_all() -> list[tuple[str, bytes, ZnodeStat]]:
            names = sorted(client.get(self.kazoo.get_children_async(pa.locations)))
            nodes = client.get_many([f"{pa.locations}/{n}" for n in names])
            return [  # a node deleted since the listing is left out
                (name, *node) for name, node in zip(names, nodes, strict=True) if node is not None
            ]

        out: list[LocationStatus | CorruptRecord] = []
        for name, raw, stat in client.call("read every location", get_all):
            try:
                out.append(self.decode(name, raw, stat))
            except CorruptRecord as exc:
                out.append(exc)
            except LocstatusError as exc:  # an invalid node name, put there by hand
                out.append(CorruptRecord(name, str(exc)))
        return out

    # -- compare-and-set and delete ----------------------------------------------------------

    def compare_and_set(
        self, record: LocationStatus, expected_version: int, history: Sequence[HistoryEntry]
    ) -> LocationStatus:
        txn = self._cas_txn(record, expected_version, history)
        refused = self.client.commit(f"compare-and-set of location {record.location!r}", txn)
        return self._cas_outcome(record, expected_version, refused)

    def compare_and_set_many(self, items: Sequence[CasItem]) -> list[CasResult]:
        """Items grouped :data:`GROUP` locations to a multi-op (each location's operations
        those of :meth:`compare_and_set`, a group at most ``max_bytes``), every group sent at
        once, pipelined on the session (:meth:`ZkClient.commit_many`). A group that applied
        wrote each of its locations at its own version with its history. A group the server
        refused (a conflict at one of its locations refuses them all) names the operation
        that failed: that location alone is decided by it, as its lone write would be, and
        the group's other locations are sent again as one group without it, until each is
        decided; a refusal that names no operation sends each of its locations alone. A group
        whose answer was lost leaves each of its locations :class:`AmbiguousCommit` (each
        resolved by its op_id, as a lone write's)."""
        distinct_locations(item.record.location for item in items)
        out: list[CasResult | None] = [None] * len(items)
        parts: dict[int, tuple[bytes, bytes]] = {}  # encoded as the first round builds
        work = [(list(range(len(items))), GROUP)]
        while work:  # each round decides at least one location of every refused group
            pending, group_size = work.pop()
            again, alone = self._cas_round(items, parts, pending, group_size, out)
            if again:
                work.append((again, group_size))
            if alone:
                work.append((alone, 1))
        return [r for r in out if r is not None]

    def _cas_round(
        self, items: Sequence[CasItem], parts: dict[int, tuple[bytes, bytes]],
        pending: list[int], group_size: int, out: list[CasResult | None],
    ) -> tuple[list[int], list[int]]:
        """One pipelined round of :meth:`compare_and_set_many`: the items ``pending`` (their
        indexes) sent in groups of ``group_size``, each group sent as soon as it is built (the
        server writes the first while the next are encoded), the outcome of each decided one
        put in ``out`` (one that cannot be encoded: its error, nothing sent). Returns the
        undecided rest of the refused groups whose failed operation is known (sent again as
        groups), and those of the refused groups whose is not (sent again alone)."""
        groups: list[list[int]] = []
        firsts: list[list[int]] = []  # per group: where each location's operations start
        size = self.client.params.max_bytes

        def build() -> Iterator[Transaction]:
            txn: Transaction | None = None
            for i in pending:
                item = items[i]
                part = parts.get(i)
                if part is None:
                    try:
                        part = parts[i] = self._cas_parts(
                            item.record, item.expected_version, item.history
                        )
                    except LocstatusError as exc:  # not a version of it, too large
                        out[i] = exc
                        continue
                if txn is None or len(groups[-1]) >= group_size:
                    if txn is not None:
                        yield txn  # groups[-1] complete: sent while the next is built
                    groups.append([])
                    firsts.append([])
                    txn = self.client.transaction()
                mark = txn.mark()
                start = mark[1]
                self._cas_ops(txn, item.record, item.expected_version, part)
                if groups[-1] and txn.size > size:  # too large with it: it starts the next
                    txn.undo(mark)
                    yield txn
                    groups.append([])
                    firsts.append([])
                    txn = self.client.transaction()
                    start = 0
                    self._cas_ops(txn, item.record, item.expected_version, part)
                firsts[-1].append(start)
                groups[-1].append(i)
            if txn is not None:
                yield txn

        def what(k: int) -> str:
            locs = [items[i].record.location for i in groups[k]]
            return f"compare-and-set of location {locs[0]!r}" + (
                f" and {len(locs) - 1} more" if len(locs) > 1 else ""
            )

        again: list[int] = []
        alone: list[int] = []
        outcomes = self.client.commit_many(what, build())
        for group, first, outcome in zip(groups, firsts, outcomes, strict=True):
            if isinstance(outcome, LocstatusError):  # lost, unreachable: each as alone
                for i in group:
                    out[i] = outcome
            elif outcome is None:
                for i in group:
                    item = items[i]
                    out[i] = with_version(item.record, item.expected_version + 1)
            elif len(group) == 1:
                out[group[0]] = self._outcome_of(items[group[0]], outcome)
            elif outcome.at < 0:  # refused as a whole, no operation named: each alone
                alone.extend(group)
            else:  # the location whose operation failed is decided; the rest go again
                failed = bisect.bisect_right(first, outcome.at) - 1
                out[group[failed]] = self._outcome_of(items[group[failed]], outcome)
                again.extend(i for k, i in enumerate(group) if k != failed)
        return again, alone

    def _outcome_of(self, item: CasItem, refused: Refusal | None) -> CasResult:
        try:
            return self._cas_outcome(item.record, item.expected_version, refused)
        except LocstatusError as exc:
            return exc

    def _cas_parts(
        self, record: LocationStatus, expected_version: int, history: Sequence[HistoryEntry]
    ) -> tuple[bytes, bytes]:
        """The payload and history bytes of one compare-and-set. Raises
        :class:`VersionConflict` for a version no life of the record has, :class:`InvalidInput`
        for a write too large (nothing sent)."""
        loc = record.location
        inc, seq = split_version(expected_version)
        if seq < 1:
            raise VersionConflict(f"location {loc!r}: {expected_version} is not a version of it")
        payload = record_bytes(record, inc)
        version = expected_version + 1
        entries = _HISTORY.dump_json(codec.stamp(history, version)) if history else b""
        self.client.check_size(loc, "record and history", payload, entries)
        return payload, entries

    def _cas_ops(
        self, txn: Transaction, record: LocationStatus, expected_version: int,
        parts: tuple[bytes, bytes],
    ) -> None:
        """Add one compare-and-set's operations to ``txn`` (see the module docstring)."""
        loc = record.location
        pa = self.paths
        inc, seq = split_version(expected_version)
        payload, entries = parts
        txn.check("incarnation", pa.history(loc), inc + 1)
        txn.set_data("location", pa.location(loc), payload, seq - 1)
        if (seq + 1) % BUCKET == 0:
            txn.create("history", pa.bucket(loc, inc, seq + 1))
        if entries:
            txn.create("history", pa.entry(loc, inc, seq + 1), entries)

    def _cas_txn(
        self, record: LocationStatus, expected_version: int, history: Sequence[HistoryEntry]
    ) -> Transaction:
        """The multi-op of one compare-and-set. Raises as :meth:`_cas_parts`."""
        txn = self.client.transaction()
        self._cas_ops(txn, record, expected_version,
                      self._cas_parts(record, expected_version, history))
        return txn

    def _cas_outcome(
        self, record: LocationStatus, expected_version: int, refused: Refusal | None
    ) -> LocationStatus:
        """The stored record of a compare-and-set that applied, or the error of its refusal."""
        loc = record.location
        version = expected_version + 1
        match refused:
            case None:
                return with_version(record, version)
            case Refusal("location", NoNodeError()):
                raise NotFound(f"unknown location {loc!r}")
            case Refusal("location", BadVersionError()):
                raise VersionConflict(f"location {loc!r} changed since version {expected_version}")
            case Refusal("incarnation", NoNodeError() | BadVersionError() as exc):
                self._explain_incarnation(loc, expected_version, exc)
            case Refusal("history", exc):
                raise CorruptRecord(
                    loc, f"history of version {version} cannot be written ({type(exc).__name__})"
                )
            case Refusal(label, exc):
                raise self.client.unavailable(
                    f"compare-and-set of location {loc!r} ({label})", exc
                )

    def _explain_incarnation(self, location: str, expected: int, exc: Exception) -> NoReturn:
        """The incarnation check failed: say why (always raises)."""
        path = self.paths.location(location)
        stat = self.client.call(
            f"read location {location!r}", lambda: self.client.get(self.kazoo.exists_async(path))
        )
        if stat is None:
            raise NotFound(f"unknown location {location!r}")
        if isinstance(exc, NoNodeError):
            raise CorruptRecord(
                location, f"its incarnation node {self.paths.history(location)} is missing"
            )
        raise VersionConflict(
            f"location {location!r} was deleted and created again since version {expected}"
        )

    def delete(self, location: str, expected_version: int) -> None:
        pa, client = self.paths, self.client
        inc, seq = split_version(expected_version)
        if seq < 1:
            raise VersionConflict(
                f"location {location!r}: {expected_version} is not a version of it"
            )
        acks_dir = pa.acks(location)
        for _ in range(_RACES):

            def ack_nodes() -> list[str] | None:
                try:
                    return cast("list[str]", client.get(self.kazoo.get_children_async(acks_dir)))
                except NoNodeError:
                    return None

            children = client.call(f"list acks of {location!r}", ack_nodes)
            txn = client.transaction()
            txn.check("incarnation", pa.history(location), inc + 1)
            txn.delete("location", pa.location(location), seq - 1)
            if children is not None:
                for child in children:
                    txn.delete("acks", f"{acks_dir}/{child}")
                txn.delete("acks", acks_dir)
            try:
                refused = client.commit(f"delete of location {location!r}", txn)
            except AmbiguousCommit:
                refused = self._resolve_delete(location, expected_version)
            match refused:
                case None:
                    break
                case Refusal("acks" | "retry"):
                    continue  # a worker acked meanwhile, or ours did not land: list again
                case Refusal("location", NoNodeError()):
                    raise NotFound(f"unknown location {location!r}")
                case Refusal("location", BadVersionError()):
                    raise VersionConflict(
                        f"location {location!r} changed since version {expected_version}"
                    )
                case Refusal("incarnation", NoNodeError() | BadVersionError() as exc):
                    self._explain_incarnation(location, expected_version, exc)
                case Refusal(label, exc):
                    raise client.unavailable(f"delete location {location!r} ({label})", exc)
        else:
            raise BackendUnavailable(f"delete of location {location!r} kept racing; try again")
        # The record and its acks are gone atomically; its history is keyed by incarnation, so
        # what an interrupted clean-up leaves behind is never read again.
        try:
            client.call(
                "clean up history", lambda: client.delete_tree(pa.incarnation(location, inc))
            )
        except LocstatusError as exc:
            log.warning("location %s: history clean-up left for later: %s", location, exc)

    def _resolve_delete(self, location: str, expected: int) -> Refusal | None:
        """After an ambiguous delete: None when the record is gone (ours, or an equal purge,
        landed), ``retry`` when it is still at ``expected``, a version conflict else."""
        try:
            current = self.read(location)
        except NotFound:
            return None
        except CorruptRecord:
            return Refusal("location", BadVersionError())
        if current.version == expected:
            return Refusal("retry", BadVersionError())
        return Refusal("location", BadVersionError())

    # -- history -----------------------------------------------------------------------------

    def history(
        self, location: str, *, limit: int = 50, before_version: int | None = None
    ) -> list[HistoryEntry]:
        pa, client = self.paths, self.client
        loc_path, parent = pa.location(location), pa.history(location)

        def stats() -> tuple[ZnodeStat | None, ZnodeStat | None]:
            a, b = self.kazoo.exists_async(loc_path), self.kazoo.exists_async(parent)
            return client.get(a), client.get(b)

        loc_stat, parent_stat = client.call(f"read history of {location!r}", stats)
        if loc_stat is None or parent_stat is None or parent_stat.version < 1:
            return []
        inc = parent_stat.version - 1
        upper: int | None = None
        if before_version is not None:
            b_inc, b_seq = split_version(before_version)
            if b_inc < inc:
                return []
            if b_inc == inc:
                upper = b_seq
        want = max(1, limit)
        seqs = client.call(
            f"read history of {location!r}", lambda: self._history_seqs(location, inc, upper, want)
        )
        if not seqs:
            return []
        versions = {pa.entry(location, inc, s): join_version(inc, s) for s in seqs}
        nodes: list[tuple[str, Any]] = client.call(
            f"read history of {location!r}",
            lambda: client.bulk(list(versions), lambda p: self.kazoo.get_async(p)),
        )
        page = HistoryPage(location, limit)
        page.take((versions[path], raw) for path, (raw, _stat) in nodes)
        return page.entries

    def history_write(self, location: str, version: int) -> list[HistoryEntry]:
        """One read of the write's node ``history/<loc>/<inc>/b<bucket>/<seq>``, when
        ``version`` belongs to the record's current life (the incarnation counter's)."""
        pa, client = self.paths, self.client
        inc, seq = split_version(version)
        if seq < 1:
            return []
        loc_path, parent = pa.location(location), pa.history(location)
        node = pa.entry(location, inc, seq)

        def get() -> tuple[ZnodeStat | None, ZnodeStat | None, bytes | None]:
            a = self.kazoo.exists_async(loc_path)
            b = self.kazoo.exists_async(parent)
            c = self.kazoo.get_async(node)
            try:
                raw: bytes | None = client.get(c)[0]
            except NoNodeError:
                raw = None
            return client.get(a), client.get(b), raw

        loc_stat, parent_stat, raw = client.call(f"read history of {location!r}", get)
        if loc_stat is None or parent_stat is None or parent_stat.version - 1 != inc:
            return []  # no record, or not its current life (leftovers of a purge)
        if raw is None:
            return []
        return list(reversed(codec.decode_history(location, raw, version)))

    def _history_seqs(self, location: str, inc: int, upper: int | None, want: int) -> list[int]:
        """Write numbers below ``upper`` (all if None), newest first, at least ``want`` of
        them when there are that many."""
        pa, client = self.paths, self.client
        try:
            buckets = client.get(self.kazoo.get_children_async(pa.incarnation(location, inc)))
        except NoNodeError:
            return []
        numbers: list[int] = []
        for name in buckets:
            if not (name.startswith("b") and name[1:].isdigit()):
                raise CorruptRecord(location, f"unexpected history node {name!r}")
            numbers.append(int(name[1:]))
        seqs: list[int] = []
        for b in sorted(numbers, reverse=True):
            if upper is not None and b * BUCKET >= upper:
                continue
            try:
                kids = client.get(
                    self.kazoo.get_children_async(pa.bucket(location, inc, b * BUCKET))
                )
            except NoNodeError:
                continue
            found: list[int] = []
            for name in kids:
                if not name.isdigit():
                    raise CorruptRecord(location, f"unexpected history node {name!r}")
                s = int(name)
                if upper is None or s < upper:
                    found.append(s)
            seqs.extend(sorted(found, reverse=True))
            if len(seqs) >= want:
                break
        return seqs[:want]
