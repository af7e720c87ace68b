"""Worker registrations and acknowledgements on ZooKeeper: ephemeral nodes held by this
backend's session (docs/zookeeper.md, "Workers and acknowledgements").

Why it is shaped so:

- **The lease is the session.** A registration is an ephemeral node: it goes when the session
  does (``session_leases``). Every creation also bumps the data version of ``workers``: a znode
  created again restarts at version 0, so only that counter tells a conditional removal
  (``remove_worker(if_expires=)``) that the registration it judged was replaced.
- **A standing registration** (docs/agent.md "Standing registrations") is a persistent node,
  so it outlives its holder's session; its holder is present while the ephemeral child
  ``holder`` its session created exists (:data:`HOLDER`). A new holder (another session, the
  same worker restarted) takes the child over in the same multi-op that rewrites the
  registration; one found without it is listed ``away``. Its acknowledgements stay ephemeral:
  when the holder's session goes they go, and a transition waits until the holder is back and
  acknowledges again (conservative). Only a retirement ends it: an ordinary registration or
  removal of its id judges the node in a multi-op that checks the count of registrations
  created (read before the node), so a standing node created in between, at version 0 like
  any new node, is neither rewritten nor deleted by it; one found is refused or kept.
- **A new session re-registers** the workers this backend wrote (:meth:`Workers.restore`, run by
  the watcher), but not their acknowledgements: written back from here they would race the
  agent's own, so the ``resync`` of a new session says ``session_lost`` and agents acknowledge
  again, each against the record as it is then.
- **An acknowledgement is one read and one multi-op**: the record is read and the generation
  judged on it (contract invariant 13: never ahead of the record); the multi-op checks the
  record's whole version (incarnation and znode version: it is still the record judged),
  writes the worker's node under ``acks/<loc>`` at the version this backend last left it (no
  read of it in the usual case) and touches ``acks/<loc>`` (the one node a watcher watches per
  location). A record that changed in between fails the multi-op and is judged again.
- **``workers()``** is served from a copy kept as fresh as the records
  (:mod:`~locstatus.backends.zookeeper.freshness`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import WatchedEvent, ZnodeStat

from locstatus.backends import codec
from locstatus.backends.base import (
    AckItem,
    AckMap,
    AckResult,
    ReadResult,
    ack_each,
    check_ack,
    stale_ack,
)
from locstatus.backends.zookeeper.client import ZkClient
from locstatus.backends.zookeeper.freshness import WorkersCopy
from locstatus.backends.zookeeper.layout import (
    ACKS_HINT,
    Layout,
    decode_acks,
    encode_acks,
    split_version,
)
from locstatus.backends.zookeeper.txn import Refusal, Transaction, refusal
from locstatus.errors import AmbiguousCommit, BackendUnavailable, LocstatusError
from locstatus.models import LocationStatus, WorkerInfo

log = logging.getLogger(__name__)

Watch = Callable[[WatchedEvent], None]
Decode = Callable[[str, bytes, ZnodeStat], LocationStatus]
"""A record from its node's data and stat (:meth:`Records.decode`)."""

HOLDER = "holder"
"""The ephemeral child of a standing registration's node held by its holder's session."""


class Workers:
    """The worker and acknowledgement operations of :class:`ZooKeeperBackend` (contract
    invariant 6), over one :class:`ZkClient`; ``watch`` is set on the worker list it reads,
    ``copy`` keeps that list."""

    def __init__(self, client: ZkClient, paths: Layout, copy: WorkersCopy, watch: Watch) -> None:
        self.client = client
        self.paths = paths
        self.copy = copy
        self.kazoo = client.kazoo
        self._watch = watch
        self._lock = threading.Lock()
        self._mine: dict[str, WorkerInfo] = {}  # registrations to restore on a new session
        self._my_acks: dict[tuple[str, str], dict[str, int]] = {}
        # (location, worker_id) -> (session id, znode version) of the ack node this backend
        # last wrote, so the next ack is one multi-op (set at that version) without a read.
        self._ack_nodes: dict[tuple[str, str], tuple[int, int]] = {}

    # -- registrations -----------------------------------------------------------------------

    def has(self, worker_id: str) -> bool:
        """True while the registration's node exists (one ``exists`` read, never the copy)."""
        path = self.paths.worker(worker_id)
        kazoo = self.kazoo
        return self.client.call(
            f"read worker {worker_id!r}",
            lambda: self.client.get(kazoo.exists_async(path)) is not None,
        )

    def put(self, info: WorkerInfo) -> None:
        """Register (ephemeral node, held by this session) or update a worker. A registration
        held by another session (a restarted worker whose old session has not expired yet) is
        taken over. ``lease_expires_at`` is stored as given: the worker counts as alive while
        its node exists and its lease (if any) holds."""
        path = self.paths.worker(info.worker_id)
        data = self._bytes(info)
        with self._lock:
            self._mine[info.worker_id] = info
        try:
            self.client.call(
                f"register worker {info.worker_id!r}",
                lambda: self._put_node(path, data, standing=info.standing, wid=info.worker_id),
            )
        finally:
            self.copy.forget()

    def _bytes(self, info: WorkerInfo) -> bytes:
        """The registration's node data, bounded as on every backend
        (:func:`codec.bounded_worker`), and by this ensemble's ``max_bytes`` when lower."""
        limit = min(self.client.params.max_bytes, codec.MAX_REGISTRATION_BYTES)
        return codec.encode_worker(info, limit).encode()

    def _put_node(
        self, path: str, data: bytes, *, wid: str, standing: bool = False
    ) -> None:
        if standing:
            self._put_standing(path, data)
            return
        client, kazoo = self.client, self.kazoo
        for _ in range(10):
            txn = Transaction(kazoo)
            txn.create("worker", path, data, ephemeral=True)
            txn.set_data("registrations", self.paths.workers, b"")  # counts creations
            refused = refusal(client.get(txn.tx.commit_async()), txn.labels)
            if refused is None:
                return
            if not isinstance(refused.error, NodeExistsError):
                raise refused.error
            # the count of registrations created, read before the node: the multi-op below
            # checks it, so a node deleted and created again meanwhile (a standing one, whose
            # version starts at 0 too) is never rewritten nor deleted by this ordinary write
            created = client.get(kazoo.exists_async(self.paths.workers))
            try:
                stored, stat = client.get(kazoo.get_async(path))
            except NoNodeError:
                continue
            if created is None:
                continue
            session = client.session_id
            if session is None:
                raise ConnectionLoss()  # retried by the caller once connected again
            txn = Transaction(kazoo)
            txn.check("registrations", self.paths.workers, created.version)
            if stat.ephemeralOwner == 0:  # persistent: a standing registration, or a hand edit
                if codec.decode_worker(wid, stored).standing:
                    raise codec.standing_refusal(wid, registering=True)
                log.warning("replacing persistent worker node %s (not a standing "
                            "registration) by an ordinary registration", path)
                if stat.numChildren:
                    txn.delete("holder", f"{path}/{HOLDER}")
                txn.delete("worker", path, stat.version)
            elif stat.ephemeralOwner == session:
                txn.set_data("worker", path, data, stat.version)
            else:
                log.warning("taking over worker registration %s from session 0x%x", path,
                            stat.ephemeralOwner)
                txn.delete("worker", path, stat.version)
            refused = refusal(client.get(txn.tx.commit_async()), txn.labels)
            if refused is None and stat.ephemeralOwner == session:
                return
            if refused is not None and not isinstance(
                refused.error, BadVersionError | NoNodeError | NotEmptyError
            ):
                raise refused.error
        raise BackendUnavailable(f"could not register {path}: it kept changing")

    def _put_standing(self, path: str, data: bytes) -> None:
        """Write a standing registration: a persistent node and its ephemeral ``holder`` child,
        created together (counted as a creation, as :meth:`_put_node` does), or, when the node
        exists, rewritten at the version read with the holder taken over by this session in
        the same multi-op. An ordinary registration of the same id is replaced."""
        client, kazoo = self.client, self.kazoo
        holder = f"{path}/{HOLDER}"
        for _ in range(10):
            session = client.session_id
            if session is None:
                raise ConnectionLoss()  # retried by the caller once connected again
            stat = client.get(kazoo.exists_async(path))
            txn = Transaction(kazoo)
            if stat is None:
                txn.create("worker", path, data)
                txn.create("holder", holder, b"", ephemeral=True)
                txn.set_data("registrations", self.paths.workers, b"")  # counts creations
            elif stat.ephemeralOwner != 0:  # an ordinary registration of this id
                with contextlib.suppress(BadVersionError, NoNodeError):
                    client.get(kazoo.delete_async(path, stat.version))
                continue
            else:
                held = client.get(kazoo.exists_async(holder))
                txn.set_data("worker", path, data, stat.version)
                if held is None:
                    txn.create("holder", holder, b"", ephemeral=True)
                elif held.ephemeralOwner != session:
                    log.info("taking over standing worker registration %s from session 0x%x",
                             path, held.ephemeralOwner)
                    txn.delete("holder", holder, held.version)
                    txn.create("holder", holder, b"", ephemeral=True)
            refused = refusal(client.get(txn.tx.commit_async()), txn.labels)
            if refused is None:
                return
            if not isinstance(refused.error, NodeExistsError | BadVersionError | NoNodeError):
                raise refused.error
        raise BackendUnavailable(f"could not register {path}: it kept changing")

    def _drop_standing(self, path: str, stat: ZnodeStat) -> bool:
        """Delete the standing registration at ``path`` (at the version ``stat`` read) with its
        holder child, in one multi-op; False when it changed or went meanwhile."""
        client, kazoo = self.client, self.kazoo
        txn = Transaction(kazoo)
        if stat.numChildren:
            txn.delete("holder", f"{path}/{HOLDER}")
        txn.delete("worker", path, stat.version)
        return refusal(client.get(txn.tx.commit_async()), txn.labels) is None

    def _drop_standing_now(self, path: str) -> bool | None:
        """Delete the standing registration at ``path`` whatever its version (retirement);
        False when it was gone already, None when another session holds it (its ``holder``
        child: the holder is present, judged in the delete's multi-op at the version read, so
        a holder taking it over in between, which rewrites the node, keeps it)."""
        for _ in range(10):
            stat = self.client.get(self.kazoo.exists_async(path))
            if stat is None:
                return False
            if stat.numChildren:
                held = self.client.get(self.kazoo.exists_async(f"{path}/{HOLDER}"))
                if held is not None and held.ephemeralOwner != self.client.session_id:
                    return None
            if self._drop_standing(path, stat):
                return True
        raise BackendUnavailable(f"could not remove {path}: it kept changing")

    def restore(self) -> bool:
        """A new session: put back the worker registrations this backend wrote (not their
        acknowledgements, see the module docstring). False when that failed (logged; the
        watcher tries again on its next round)."""
        with self._lock:
            workers = list(self._mine.values())
        try:
            for info in workers:
                self._put_node(self.paths.worker(info.worker_id), self._bytes(info),
                               standing=info.standing, wid=info.worker_id)
        except (LocstatusError, KazooException, KazooTimeoutError) as exc:
            log.warning("zookeeper backend %s: re-registration after session loss failed, "
                        "will retry: %s", self.paths.root, exc)
            return False
        log.info("zookeeper backend %s: new session, re-registered %d worker(s)",
                 self.paths.root, len(workers))
        self.copy.forget()
        return True

    def remove(
        self, worker_id: str, *, if_expires: datetime | None = None, retire: bool = False
    ) -> bool:
        """See :meth:`Backend.remove_worker`. With ``if_expires``: one multi-op deleting the
        registration at the znode version whose data was judged (a renewal changes it), checked
        against the count of registrations created (the data version of ``workers``: a
        registration replaced by another session's starts at version 0 again), and every
        acknowledgement node of the worker listed just before; an acknowledgement that
        vanished meanwhile makes it list again."""
        if if_expires is None:
            removed = self._remove_now(worker_id, retire=retire)
            if removed or retire:
                self._forget_mine(worker_id)  # not restored on a new session from now on
            return removed
        try:
            removed = self._remove_if(worker_id, if_expires)
        finally:
            self.copy.forget()
        if removed:
            self._forget_mine(worker_id)
        return removed

    def _forget_mine(self, worker_id: str) -> None:
        """Stop restoring the worker's registration and acknowledgements on a new session."""
        with self._lock:
            self._mine.pop(worker_id, None)
            for key in [k for k in self._my_acks if k[1] == worker_id]:
                del self._my_acks[key]

    def _acks_of(self, worker_id: str) -> list[str]:
        """Paths of the worker's acknowledgement nodes (one request per location)."""
        pa, client = self.paths, self.client
        locations = client.get(self.kazoo.get_children_async(pa.acks_root))
        found = client.bulk(
            [f"{pa.acks_root}/{loc}/{worker_id}" for loc in locations],
            lambda p: self.kazoo.exists_async(p),
        )
        return [p for p, stat in found if stat is not None]

    def _remove_now(self, worker_id: str, *, retire: bool) -> bool:
        """An unconditional removal: a retirement (``retire``) ends a standing registration
        too, unless another session holds it (its holder is present: kept, False); an
        ordinary one keeps it (persistent node: ``ephemeralOwner`` 0), with its
        acknowledgements, deleting only an ordinary node at the version read."""
        path = self.paths.worker(worker_id)
        pa, client, kazoo = self.paths, self.client, self.kazoo

        def ordinary() -> bool | None:
            """Delete the ordinary registration at ``path``: True done, False none there,
            None a standing one there (kept)."""
            for _ in range(10):
                # checked against the count of registrations created (read first), so a
                # standing node created meanwhile at the same version is never deleted
                created = client.get(kazoo.exists_async(pa.workers))
                try:
                    stored, stat = client.get(kazoo.get_async(path))
                except NoNodeError:
                    return False
                if created is None:
                    return False
                if stat.ephemeralOwner == 0 and codec.decode_worker(worker_id, stored).standing:
                    return None
                txn = Transaction(kazoo)
                txn.check("registrations", pa.workers, created.version)
                if stat.numChildren:  # a persistent node (a hand edit) with a holder child
                    txn.delete("holder", f"{path}/{HOLDER}")
                txn.delete("worker", path, stat.version)
                refused = refusal(client.get(txn.tx.commit_async()), txn.labels)
                if refused is None:
                    return True
                if not isinstance(refused.error, BadVersionError | NoNodeError | NotEmptyError):
                    raise refused.error
            raise BackendUnavailable(f"could not remove {path}: it kept changing")

        def remove() -> bool:
            if not retire:
                found = ordinary()
                if found is None:
                    return False  # standing: only a retirement ends it (acks kept)
                gone = found
            else:
                try:
                    client.get(kazoo.delete_async(path))
                    gone = True
                except NoNodeError:
                    gone = False
                except NotEmptyError:  # a standing registration: its holder child goes with it
                    dropped = self._drop_standing_now(path)
                    if dropped is None:
                        return False  # held by another session: present, kept with its acks
                    gone = dropped
            locations = client.get(self.kazoo.get_children_async(pa.acks_root))
            client.bulk(  # one delete per location, those never acknowledged left out
                [f"{pa.acks_root}/{loc}/{worker_id}" for loc in locations],
                lambda p: self.kazoo.delete_async(p),
            )
            return gone

        try:
            return client.call(f"unregister worker {worker_id!r}", remove)
        finally:
            self.copy.forget()

    def _remove_if(self, worker_id: str, if_expires: datetime) -> bool:
        pa, client = self.paths, self.client
        path = pa.worker(worker_id)
        what = f"unregister expired worker {worker_id!r}"
        for _ in range(20):

            def look() -> tuple[int, bytes, ZnodeStat, list[str]] | None:
                created = client.get(self.kazoo.exists_async(pa.workers)).version
                try:
                    raw, stat = client.get(self.kazoo.get_async(path))
                except NoNodeError:
                    return None
                return created, raw, stat, self._acks_of(worker_id)

            found = client.call(f"read worker {worker_id!r}", look)
            if found is None or not codec.is_registration(worker_id, found[1], if_expires):
                return False
            created, _raw, stat, acks = found
            txn = client.transaction()
            txn.check("registrations", pa.workers, created)  # none created again since
            txn.delete("worker", path, stat.version)
            for ack in acks:
                txn.delete("acks", ack)
            try:
                refused = client.commit(what, txn)
            except AmbiguousCommit:
                continue  # looked at again: gone (False from here on) or still there
            match refused:
                case None:
                    return True
                case Refusal(
                    "registrations" | "worker" | "acks", NoNodeError() | BadVersionError()
                ):
                    continue  # renewed, replaced, or an acknowledgement went: judge it again
                case Refusal(label, exc):
                    raise client.unavailable(f"{what} ({label})", exc)
        raise BackendUnavailable(f"{what}: its registration kept changing; try again")

    def listed(self) -> list[WorkerInfo]:
        """Registered workers, sorted by id, at least as fresh as every answer this backend
        returned before the call (a record read or written, on this session); an unreadable
        registration node as its stand-in (:func:`codec.corrupt_worker`: alive while listed,
        unless what is left of it still carries a lease). From the copy when it may be served
        (:class:`WorkersCopy`), else read with watches set again, and kept."""
        self.client.check_open()
        copy = self.copy.fresh()
        if copy is not None:
            return copy
        epoch = self.copy.epoch
        pa, client = self.paths, self.client

        def get_all() -> list[tuple[str, Any]]:
            names = sorted(
                client.get(self.kazoo.get_children_async(pa.workers, watch=self._watch))
            )
            return client.bulk(
                names, lambda n: self.kazoo.get_async(f"{pa.workers}/{n}", watch=self._watch)
            )

        def holders(listed: list[WorkerInfo]) -> set[str]:
            """The standing ones whose holder node is gone (a watch set on each)."""
            standing = [w.worker_id for w in listed if w.standing]
            found = dict(client.bulk(
                standing,
                lambda n: self.kazoo.exists_async(f"{pa.workers}/{n}/{HOLDER}", watch=self._watch),
            ))
            return {n for n in standing if found.get(n) is None}

        # An unreadable node is listed as the live worker it may be (codec.corrupt_worker),
        # never left out: leaving it out would let a transition settle without that worker.
        out = [codec.decode_worker(name, raw) for name, (raw, _stat) in
               client.call("list workers", get_all)]
        if any(w.standing for w in out):
            away = client.call("read standing registrations' holders", lambda: holders(out))
            out = [w.model_copy(update={"away": True}) if w.worker_id in away else w
                   for w in out]
        self.copy.keep(epoch, out)
        return out

    # -- acknowledgements --------------------------------------------------------------------

    def ack(
        self, worker_id: str, location: str, service: str, generation: int,
        *, if_version: int | None = None, decode: Decode,
    ) -> None:
        """Record an acknowledgement (ephemeral, held by this session), judged against the
        record as the multi-op finds it (contract invariant 13): the record is read, the
        generation judged on it (:func:`check_ack`), and the multi-op checks that the record is
        still that one, its znode version and its incarnation (a record created again and
        written as many times has the same znode version), so a record that changed between
        the read and the write fails the write, and the record is read and judged again. With
        ``if_version`` a record at another version is a :class:`VersionConflict` at once.
        ``decode`` reads a record's node (:meth:`Records.decode`). Raises
        :class:`VersionConflict` (nothing written: no record, not at ``if_version``, a
        generation it does not have), :class:`CorruptRecord`, :class:`BackendUnavailable`."""
        self.paths.ack(location, worker_id)  # validate both names before any I/O

        def judge(record: LocationStatus | None) -> tuple[int, int]:
            if if_version is not None and (record is None or record.version != if_version):
                raise stale_ack(location, if_version)
            check_ack(location, record, service, generation, if_version)
            assert record is not None  # check_ack refuses a missing record
            return split_version(record.version)

        self._write_ack(location, worker_id, {service: generation}, judge, decode)

    def ack_many(
        self, worker_id: str, items: Sequence[AckItem], records: Mapping[str, ReadResult],
        *, decode: Decode,
    ) -> list[AckResult]:
        """Every acknowledgement whose node this client wrote last (its version and content
        known, as :meth:`_write_ack`'s fast path) judged against its record as read just
        before (``records``, pipelined by the caller: :func:`_ack_refusal`), then written in
        its own multi-op that checks the record is still the one judged (incarnation and
        znode version), all pipelined on the session (:meth:`ZkClient.commit_many`). The
        others, those whose record moved in between or does not read, any the server refused
        for another reason (a node changed by someone else) and any whose answer was lost go
        one at a time through :meth:`ack`. A refusal at one item never fails another."""
        pa, client = self.paths, self.client
        out: list[AckResult] = [None] * len(items)
        alone: list[int] = []
        sent: list[tuple[int, tuple[str, str], int, dict[str, int]]] = []
        txns: list[Transaction] = []
        session = client.session_id
        seen: set[str] = set()
        for n, item in enumerate(items):
            loc = item.location
            try:
                node, parent = pa.ack(loc, worker_id), pa.acks(loc)
            except LocstatusError as exc:
                out[n] = exc
                continue
            record = records.get(loc)
            if not isinstance(record, LocationStatus) or loc in seen:
                alone.append(n)  # ack() decides (or a second service of one node)
                seen.add(loc)
                continue
            seen.add(loc)
            if (refused := _ack_refusal(item, record)) is not None:
                out[n] = refused
                continue
            key = (loc, worker_id)
            with self._lock:
                known = self._ack_nodes.get(key)
                if known is None or session is None or known[0] != session:
                    alone.append(n)  # the node must be read
                    continue
                del self._ack_nodes[key]  # in flight: a concurrent ack reads the node
                content = {**self._my_acks.get(key, {}), item.service: item.generation}
            txn = client.transaction()
            inc, seq = split_version(record.version)
            txn.check("location", pa.history(loc), inc + 1)
            txn.check("location", pa.location(loc), seq - 1)
            txn.set_data("ack", node, encode_acks(content), known[1])
            txn.set_data("parent", parent, ACKS_HINT)
            txns.append(txn)
            sent.append((n, key, known[1] + 1, content))
        outcomes = client.commit_many(
            lambda k: f"ack of {worker_id}/{items[sent[k][0]].location}", txns
        )
        for (n, key, version, content), outcome in zip(sent, outcomes, strict=True):
            item = items[n]
            match outcome:
                case None:
                    if session is not None:  # it is: only then was it sent
                        with self._lock:
                            self._ack_nodes[key] = (session, version)
                            self._my_acks[key] = content
                case Refusal("location") if item.if_version is not None:
                    out[n] = stale_ack(item.location, item.if_version)
                case _:  # the record or the node moved, or the answer was lost: alone
                    alone.append(n)
        ack_each(
            lambda item: self.ack(worker_id, item.location, item.service, item.generation,
                                  if_version=item.if_version, decode=decode),
            items, sorted(alone), out,
        )
        return out

    def _write_ack(
        self, location: str, worker_id: str, update: dict[str, int],
        judge: Callable[[LocationStatus | None], tuple[int, int]], decode: Decode,
    ) -> None:
        """Write this worker's ack node while the record is the one ``judge`` accepted (it
        raises to refuse, else returns the record's ``(incarnation, seq)``,
        :func:`split_version`). A record that changed between its read and the write fails
        the multi-op (nothing written): it is read and judged again."""
        pa, client = self.paths, self.client
        node, parent = pa.ack(location, worker_id), pa.acks(location)
        loc_path = pa.location(location)

        def record() -> LocationStatus | None:
            try:
                raw, stat = client.get(self.kazoo.get_async(loc_path))
            except NoNodeError:
                return None
            return decode(location, raw, stat)

        def attempt() -> bool:
            """One read, judgement and write; False: the record changed in between."""
            key = (location, worker_id)
            for _ in range(20):
                at = judge(record())
                txn = client.transaction()
                txn.check("location", pa.history(location), at[0] + 1)  # the incarnation
                txn.check("location", loc_path, at[1] - 1)
                session = client.session_id
                with self._lock:
                    known = self._ack_nodes.pop(key, None)
                    mine = dict(self._my_acks.get(key, {}))
                if known is not None and session is not None and known[0] == session:
                    # Our own node, at the version our last write left it, holding ``mine``:
                    # no read needed. Anything else (another session took it over, it was
                    # removed with the record) fails the version, and the next pass reads it.
                    new_version, content = known[1] + 1, {**mine, **update}
                    txn.set_data("ack", node, encode_acks(content), known[1])
                else:
                    new_version, session, content = self._read_ack_op(txn, node, update)
                txn.set_data("parent", parent, ACKS_HINT)
                refused = client.commit(f"ack of {worker_id}/{location}", txn)
                match refused:
                    case None:
                        owner = client.session_id
                        with self._lock:
                            if owner is not None and session is not None and owner == session:
                                self._ack_nodes[key] = (owner, new_version)
                                self._my_acks[key] = content  # what the node holds now
                            else:
                                self._my_acks.pop(key, None)
                        return True
                    case Refusal("location"):
                        return False
                    case Refusal("parent") | Refusal("ack", NoNodeError()):
                        with contextlib.suppress(NodeExistsError):  # a record without acks dir
                            client.get(self.kazoo.create_async(parent, b""))
            raise BackendUnavailable(f"ack of {worker_id}/{location} kept conflicting")

        def until_judged() -> bool:
            for _ in range(20):  # the record changed between its read and the write: again
                if attempt():
                    return True
            raise BackendUnavailable(f"ack of {worker_id}/{location}: the record kept changing")

        try:
            client.call(f"ack {worker_id}/{location}", until_judged)
        except AmbiguousCommit:  # acks are idempotent: judge and write it again
            client.call(f"ack {worker_id}/{location}", until_judged)

    def _read_ack_op(
        self, txn: Transaction, node: str, update: dict[str, int]
    ) -> tuple[int, int | None, dict[str, int]]:
        """Read ack node ``node`` and add its write to ``txn``: create it, merge ``update`` into
        it, or take it over from another session. Returns (the node's version after the write,
        this client's session id, what the node will hold)."""
        client = self.client
        try:
            raw, stat = client.get(self.kazoo.get_async(node))
        except NoNodeError:
            txn.create("ack", node, encode_acks(update), ephemeral=True)
            return 0, client.session_id, dict(update)
        content = {**(decode_acks(raw) or {}), **update}
        merged = encode_acks(content)
        session = client.session_id
        if session is None:
            raise ConnectionLoss()  # retried once connected again
        if stat.ephemeralOwner == session:
            txn.set_data("ack", node, merged, stat.version)
            return stat.version + 1, session, content
        # Held by another session (this worker before a restart): take it over, or the ack
        # would vanish when that session expires.
        txn.delete("ack", node, stat.version)
        txn.create("ack", node, merged, ephemeral=True)
        return 0, session, content

    def acks(self, location: str) -> AckMap:
        parent = self.paths.acks(location)
        client = self.client

        def get_all() -> list[tuple[str, Any]]:
            try:
                names = sorted(client.get(self.kazoo.get_children_async(parent)))
            except NoNodeError:
                return []
            return client.bulk(names, lambda n: self.kazoo.get_async(f"{parent}/{n}"))

        out: AckMap = {}
        for worker, (raw, _stat) in client.call(f"read acks of {location!r}", get_all):
            acked = decode_acks(raw)
            if acked is not None:
                out[worker] = acked
        return out

    def all_acks(self) -> dict[str, AckMap]:
        root = self.paths.acks_root
        client = self.client

        def get_all() -> list[tuple[str, Any]]:
            locations = sorted(client.get(self.kazoo.get_children_async(root)))
            listed = client.bulk(
                locations, lambda n: self.kazoo.get_children_async(f"{root}/{n}")
            )
            keys = [f"{loc}/{w}" for loc, workers in listed for w in workers]
            return client.bulk(keys, lambda k: self.kazoo.get_async(f"{root}/{k}"))

        out: dict[str, AckMap] = {}
        for key, (raw, _stat) in client.call("read every ack", get_all):
            loc, _, worker = key.partition("/")
            acked = decode_acks(raw)
            if acked is not None:
                out.setdefault(loc, {})[worker] = acked
        return out


def _ack_refusal(item: AckItem, record: LocationStatus) -> LocstatusError | None:
    """Why :meth:`Workers.ack` would refuse ``item`` against ``record`` (read just before the
    multi-op that checks it is still that record); None: it is written."""
    if item.if_version is not None and record.version != item.if_version:
        return stale_ack(item.location, item.if_version)
    try:
        check_ack(item.location, record, item.service, item.generation, item.if_version)
    except LocstatusError as exc:
        return exc
    return None
