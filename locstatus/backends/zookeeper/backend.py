"""The ZooKeeper backend: :class:`ZooKeeperBackend`, the contract of
:class:`~locstatus.backends.base.Backend` over one kazoo session.

Why it is shaped so: kazoo keeps its protocol, its client and its recipes apart, and so does
this package; the class here is thin, each public method one call into the part that does it
(:class:`~.records.Records`, :class:`~.workers.Workers`, :class:`~.watcher.Watcher`), all of
them over one :class:`~.client.ZkClient`, the single edge where kazoo's errors become locstatus
errors. What is left here is the lifecycle: connect, create the tree, start the watcher, tell
the time, close.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Sequence
from datetime import UTC, datetime

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import Callback

from locstatus.backends.base import (
    AckItem,
    AckMap,
    AckResult,
    Backend,
    CasItem,
    CasResult,
    CreateItem,
    HintCallback,
    ReadResult,
    Unsubscribe,
)
from locstatus.backends.zookeeper.client import ZkClient
from locstatus.backends.zookeeper.freshness import WorkersCopy
from locstatus.backends.zookeeper.layout import Layout
from locstatus.backends.zookeeper.records import Records
from locstatus.backends.zookeeper.url import parse_zk_url
from locstatus.backends.zookeeper.watcher import Watcher
from locstatus.backends.zookeeper.workers import Workers
from locstatus.errors import BackendUnavailable, CorruptRecord, InvalidInput, LocstatusError
from locstatus.models import HistoryEntry, LocationStatus, WorkerInfo


class ZooKeeperBackend(Backend):
    """ZooKeeper backend: one kazoo session per instance, safe for many threads.

    Worker registrations are ephemeral nodes: the lease is the session (``session_leases``).

    Usage::

        backend = ZooKeeperBackend("zk://zk1:2181,zk2:2181,zk3:2181/locstatus?timeout=5")
        rec = backend.read("us-east-1")
        backend.compare_and_set(new_rec, rec.version, [entry])  # VersionConflict if raced

    Raises :class:`InvalidInput` for a bad URL and :class:`BackendUnavailable` (naming the
    hosts) when no server answers within ``timeout`` seconds.
    """

    session_leases = True

    def __init__(self, url: str) -> None:
        self.url = url
        self.params = parse_zk_url(url)
        self.session_timeout = self.params.session_timeout
        self.paths = Layout(self.params.chroot)
        self._client = client = ZkClient(self.params, url)
        kazoo = client.kazoo
        copy = WorkersCopy(
            dispatch=lambda fn: kazoo.handler.dispatch_callback(
                Callback("locstatus-marker", fn, ())
            ),
            live=client.live.is_set,
        )
        self._records = Records(client, self.paths)
        self._watcher = Watcher(
            client, self.paths, copy,
            decode=self._records.decode,
            restore=lambda: self._workers.restore(),
        )
        self._workers = Workers(client, self.paths, copy, self._watcher.on_watch)
        client.start(self._watcher.on_state)
        self._watcher.start()
        try:
            self._ensure_tree()
        except BaseException:
            self.close()
            raise

    def _ensure_tree(self) -> None:
        pa, client = self.paths, self._client

        def ensure() -> None:
            wanted = [pa.root, pa.locations, pa.histories, pa.workers, pa.acks_root]
            stats = [client.kazoo.exists_async(path) for path in wanted]
            missing = [p for p, a in zip(wanted, stats, strict=True) if client.get(a) is None]
            client.ensure(missing)

        client.call(f"create the locstatus tree {pa.root}", ensure)

    # -- records (records.py) ----------------------------------------------------------------

    def create(self, record: LocationStatus, history: Sequence[HistoryEntry]) -> LocationStatus:
        return self._records.create(record, history)

    def read(self, location: str) -> LocationStatus:
        return self._records.read(location)

    def read_many(self, locations: Sequence[str]) -> list[ReadResult]:
        """See :meth:`Records.read_many` (pipelined gets)."""
        return self._records.read_many(locations)

    def read_all(self) -> list[LocationStatus | CorruptRecord]:
        return self._records.read_all()

    def compare_and_set(
        self, record: LocationStatus, expected_version: int, history: Sequence[HistoryEntry]
    ) -> LocationStatus:
        return self._records.compare_and_set(record, expected_version, history)

    batch_size = 2000
    """Locations per bulk write, pipelined on the session (bounded in flight: 40 multi-ops of
    fifty locations, a few tens of KiB each; one wait for the answers per batch)."""

    def compare_and_set_many(self, items: Sequence[CasItem]) -> list[CasResult]:
        return self._records.compare_and_set_many(items)

    def create_many(
        self, items: Sequence[CreateItem], *, texts: Sequence[tuple[str, str]] | None = None
    ) -> list[CasResult]:
        return self._records.create_many(items, texts=texts)

    def delete(self, location: str, expected_version: int) -> None:
        self._records.delete(location, expected_version)

    def history(
        self, location: str, *, limit: int = 50, before_version: int | None = None
    ) -> list[HistoryEntry]:
        return self._records.history(location, limit=limit, before_version=before_version)

    def history_write(self, location: str, version: int) -> list[HistoryEntry]:
        """One read of the write's node ``history/<loc>/<inc>/b<bucket>/<seq>``, when
        ``version`` belongs to the record's current life (the incarnation counter's)."""
        return self._records.history_write(location, version)

    # -- workers and acknowledgements (workers.py) -------------------------------------------

    def put_worker(self, info: WorkerInfo) -> None:
        """Register (ephemeral node, held by this session) or update a worker; one held by
        another session (a restarted worker's) is taken over (see :meth:`Workers.put`)."""
        self._workers.put(info)

    def remove_worker(
        self, worker_id: str, *, if_expires: datetime | None = None, retire: bool = False
    ) -> bool:
        """See :meth:`Backend.remove_worker` and :meth:`Workers.remove` (one versioned multi-op
        with the acknowledgements)."""
        return self._workers.remove(worker_id, if_expires=if_expires, retire=retire)

    def has_worker(self, worker_id: str) -> bool:
        """One read of the registration's node (see :meth:`Workers.has`)."""
        return self._workers.has(worker_id)

    def workers(self) -> list[WorkerInfo]:
        """Registered workers, sorted by id, at least as fresh as every answer this backend
        returned before the call; served from a copy when that is safe
        (:mod:`~locstatus.backends.zookeeper.freshness`)."""
        return self._workers.listed()

    def ack(
        self,
        worker_id: str,
        location: str,
        service: str,
        generation: int,
        *,
        if_version: int | None = None,
    ) -> None:
        """Record an acknowledgement (ephemeral, held by this session), judged against the
        record in its multi-op (invariant 13); see :meth:`Workers.ack`."""
        self._workers.ack(
            worker_id, location, service, generation, if_version=if_version,
            decode=self._records.decode,
        )

    def ack_many(self, worker_id: str, items: Sequence[AckItem]) -> list[AckResult]:
        """The records read with pipelined gets, then :meth:`Workers.ack_many` (pipelined
        multi-ops, each checking its record is still the one read)."""
        locations = list(dict.fromkeys(i.location for i in items))
        try:
            records = dict(zip(locations, self._records.read_many(locations), strict=True))
        except InvalidInput:  # a name no record can have: each item alone says which
            records = {}
        except LocstatusError as exc:
            return [exc] * len(items)
        return self._workers.ack_many(worker_id, items, records, decode=self._records.decode)

    def acks(self, location: str) -> AckMap:
        return self._workers.acks(location)

    def all_acks(self) -> dict[str, AckMap]:
        return self._workers.all_acks()

    # -- hints (watcher.py, session.py) ------------------------------------------------------

    def subscribe(
        self, callback: HintCallback, *, kinds: Collection[str] | None = None
    ) -> Unsubscribe:
        """Deliver hints to ``callback`` on the backend's thread. Returns once the watches are
        armed (at most ``timeout`` seconds), so any change after that is hinted. The
        acknowledgement nodes are watched only while a subscriber wants ``acks`` hints."""
        self._client.check_open()
        return self._watcher.subscribe(callback, kinds)

    # -- lifecycle ---------------------------------------------------------------------------

    def probe_time(self) -> datetime:
        """The ensemble's time: the ``mtime`` the leader stamps on a write of ``<chroot>/clock``
        (milliseconds, the leader's clock when it proposed the write; docs/time.md). Fails at
        once, with :class:`BackendUnavailable`, while not connected: a time source keeps its
        last estimate meanwhile rather than wait."""
        client = self._client
        client.check_open()
        if not client.live.is_set():
            raise BackendUnavailable(
                f"not connected to ZooKeeper {self.params.hosts} (connection "
                f"{client.kazoo.state}): cannot read its time"
            )
        path = self.paths.clock

        def stamp() -> int:
            try:
                stat = client.get(client.kazoo.set_async(path, b"", -1))
            except NoNodeError:
                with contextlib.suppress(NodeExistsError):
                    client.get(client.kazoo.create_async(path, b""))
                stat = client.get(client.kazoo.set_async(path, b"", -1))
            return int(stat.mtime)

        ms = client.call("read the server's time", stamp)
        return datetime.fromtimestamp(ms / 1000, UTC)

    def ping(self) -> None:
        client = self._client
        client.check_open()
        if not client.live.is_set():
            raise BackendUnavailable(
                f"not connected to ZooKeeper {self.params.hosts} (connection {client.kazoo.state})"
            )
        try:
            client.get(client.kazoo.exists_async(self.paths.root))
        except (KazooException, KazooTimeoutError) as exc:
            raise client.unavailable("ping", exc) from exc

    def close(self) -> None:
        """Close the session (its ephemeral registrations and acks go with it). Idempotent."""
        client = self._client
        if client.closed:
            return
        client.closed = True
        self._watcher.stop()
        client.stop(self._watcher.on_state)
