"""``sqlite:///path/to/file.db``: the embedded default, safe across processes on one host.

Why it is shaped so:

- WAL journal, one connection per thread, ``BEGIN IMMEDIATE`` for every write (the write lock is
  taken up front, so two writers never deadlock upgrading a read lock), a busy timeout.
- Compare-and-set is ``UPDATE locations SET ... WHERE location = ? AND version = ?`` plus the
  history ``INSERT`` in the same transaction: the state and its history commit together or not
  at all (docs/design.md §2). ``synchronous=FULL`` by default (``?synchronous=normal`` trades
  durability on power loss for speed).
- Versions of a recreated location start above every version it ever had (``incarnations``
  table), so a stale version never matches a new record (contract invariant 1).
- A failed write is rolled back only while SQLite has not done it itself (it does on
  ``SQLITE_FULL`` and I/O errors: a second ``ROLLBACK`` would fail and hide the real error),
  and surfaces as :class:`BackendUnavailable`, :class:`BackendFull` for a full disk: nothing
  was written, and the same connection writes again once space is freed.
- Change hints: every write appends to a small ``changes`` log in the same transaction; one
  poller thread per backend reads it every ``poll_interval`` seconds (default 0.05) and falls
  back to a ``resync`` hint when it has fallen behind the pruned log. A subscriber that raises
  is logged and skipped (:class:`~locstatus.backends.hints.Subscribers`), never the poller's end.

- Time (docs/time.md): the store's clock is the kernel's, as it stamps a file beside the
  database (``<db>-clock``): :meth:`SQLiteBackend.probe_time` writes one byte to it and reads
  the modification time back. Every process of the host shares that clock, whatever its own
  view of the time (libfaketime fakes a process's ``clock_gettime`` and ``utimensat``, not the
  kernel stamping a write), so this file is where the processes of one SQLite store agree.

URL forms follow SQLAlchemy: ``sqlite:///relative.db``, ``sqlite:////abs/path.db``, query
parameters ``timeout`` (seconds, busy timeout, more than 0 and at most 3600), ``synchronous``
(full|normal|extra), ``poll_interval`` (seconds, 0.01..60), checked by
:mod:`locstatus.backends.urls`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from locstatus.backends import codec
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
    ScanItem,
    Unsubscribe,
    check_ack,
    distinct_locations,
    stale_ack,
    stale_version,
)
from locstatus.backends.hints import HintBatch, Subscribers
from locstatus.backends.history import HistoryPage
from locstatus.backends.urls import Number, query_params, split_url
from locstatus.backends.versions import LIVES
from locstatus.backends.walwatch import RETRY_DELAYS, WATCHED_POLL, WalWatch, open_wal_watch
from locstatus.errors import (
    AlreadyExists,
    BackendFull,
    BackendUnavailable,
    CorruptRecord,
    InvalidInput,
    LocstatusError,
    NotFound,
    VersionConflict,
)
from locstatus.models import Hint, HistoryEntry, LocationStatus, WorkerInfo, copy_with, with_version

_SCHEMA = """
CREATE TABLE IF NOT EXISTS locations (
    location TEXT PRIMARY KEY, version INTEGER NOT NULL, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS history (
    location TEXT NOT NULL, version INTEGER NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (location, version));
CREATE TABLE IF NOT EXISTS incarnations (
    location TEXT PRIMARY KEY, last INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS workers (
    worker_id TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS acks (
    location TEXT NOT NULL, worker_id TEXT NOT NULL, service TEXT NOT NULL,
    generation INTEGER NOT NULL, PRIMARY KEY (location, worker_id, service));
CREATE INDEX IF NOT EXISTS acks_by_worker ON acks (worker_id);
CREATE TABLE IF NOT EXISTS changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, location TEXT);
-- The change log is written by triggers inside each write's own transaction: a hint can never
-- be recorded for a write that rolled back, nor missed for one that committed.
CREATE TRIGGER IF NOT EXISTS locations_ins AFTER INSERT ON locations
    BEGIN INSERT INTO changes (kind, location) VALUES ('location', NEW.location); END;
CREATE TRIGGER IF NOT EXISTS locations_upd AFTER UPDATE ON locations
    BEGIN INSERT INTO changes (kind, location) VALUES ('location', NEW.location); END;
CREATE TRIGGER IF NOT EXISTS locations_del AFTER DELETE ON locations
    BEGIN INSERT INTO changes (kind, location) VALUES ('location', OLD.location); END;
CREATE TRIGGER IF NOT EXISTS acks_ins AFTER INSERT ON acks
    BEGIN INSERT INTO changes (kind, location) VALUES ('acks', NEW.location); END;
CREATE TRIGGER IF NOT EXISTS workers_ins AFTER INSERT ON workers
    BEGIN INSERT INTO changes (kind, location) VALUES ('workers', NULL); END;
CREATE TRIGGER IF NOT EXISTS workers_del AFTER DELETE ON workers
    BEGIN INSERT INTO changes (kind, location) VALUES ('workers', NULL); END;
-- The log keeps the last 200 000 changes (it kept 10 000, under the trigger named changes_prune:
-- a pause of 10 000 locations and its 16 workers' acknowledgements overflowed it, and every
-- agent's poller fell back to a full re-read, docs/agent.md "Bursts").
DROP TRIGGER IF EXISTS changes_prune;
CREATE TRIGGER IF NOT EXISTS changes_prune_keep_200000 AFTER INSERT ON changes
    WHEN NEW.seq % 1000 = 0
    BEGIN DELETE FROM changes WHERE seq < NEW.seq - 200000; END;
"""
_KEEP_CHANGES = 10_000
"""At most this many rows of the change log per read of the poller."""
_HINT_KINDS = ("location", "acks", "workers")
"""The kinds of rows in the change log (``resync`` is the poller's own)."""
_JSONABLE = "(typeof(l.data) = 'text' AND typeof(l.version) != 'blob')"
"""Rows whose columns a JSON value can carry (a blob cannot: :meth:`SQLiteBackend.read_many`
reads the others row by row)."""


LEASE_POLL = 0.001
"""Seconds between two asks for the write lock of a lease renewal (:meth:`SQLiteBackend.
_begin_polling`)."""
WRITE_POLL = 0.005
"""Seconds between two asks for the write lock of any other write (the bulk write's batches,
acknowledgements, settles): all at the same pace, so none waits behind the others for long."""
TIMEOUT = Number("timeout", 30.0, 0, 3600, low_open=True)
"""Busy timeout: how long a write waits for another process's transaction, in seconds."""
POLL_INTERVAL = Number("poll_interval", 0.05, 0.01, 60)
"""Seconds between two reads of the change log (hints); 0 would busy-loop a core."""
_URL_PARAMS = frozenset({"timeout", "synchronous", "poll_interval"})


def parse_sqlite_url(url: str) -> tuple[str, dict[str, str]]:
    """Return ``(path, params)`` for a ``sqlite:///...`` URL, its parameters checked (names
    and values, :data:`TIMEOUT`, :data:`POLL_INTERVAL`). Raises :class:`InvalidInput`."""
    parts = split_url(url, "SQLite", "sqlite:///path/to/file.db")
    if parts.scheme != "sqlite" or parts.netloc:
        raise InvalidInput(f"invalid sqlite URL {url!r}: expected sqlite:///path/to/file.db")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path:
        raise InvalidInput(f"invalid sqlite URL {url!r}: no database path")
    params = query_params(parts.query, known=_URL_PARAMS, kind="SQLite", where=url)
    for number in (TIMEOUT, POLL_INTERVAL):
        number.parse(params.get(number.name), "SQLite", url)
    sync = params.get("synchronous", "full").lower()
    if sync not in ("full", "normal", "extra"):
        raise InvalidInput(f"invalid synchronous={sync!r} in {url!r}: full|normal|extra")
    return path, params


class SQLiteBackend(Backend):
    """SQLite backend. Safe for many threads and processes on one host.

    Usage::

        backend = SQLiteBackend("sqlite:///./locstatus.db")
    """

    clock_resolution = 0.01
    """A write's stamp is the kernel's coarse clock: at most one tick (10 ms at HZ=100) old."""
    local_reads = True
    """A reader in WAL mode never waits for a writer, and the file is on this host."""

    @classmethod
    def missing_store(cls, url: str) -> str | None:
        """The absolute path of the database file ``url`` names when it does not exist (opening
        it would create an empty store there). Raises :class:`InvalidInput` for a bad URL."""
        path, _ = parse_sqlite_url(url)
        return None if os.path.exists(path) else os.path.realpath(path)

    def __init__(self, url: str = "sqlite:///./locstatus.db") -> None:
        self.url = url
        self.path, params = parse_sqlite_url(url)  # names and values checked there
        self._timeout = TIMEOUT.parse(params.get("timeout"), "SQLite", url)
        self._poll = POLL_INTERVAL.parse(params.get("poll_interval"), "SQLite", url)
        self._synchronous = params.get("synchronous", "full").upper()
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._in_use: dict[sqlite3.Connection, int] = {}  # its own thread's uses (_using)
        self._closed = False
        self._subscribers = Subscribers(url)
        self._sub_lock = threading.Lock()  # starts the poller once
        self._poller: threading.Thread | None = None
        self._watch: WalWatch | None = None
        self._stop = threading.Event()
        parent = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(parent):
            raise BackendUnavailable(
                f"cannot open {url}: directory {parent} does not exist"
                + (" (for an absolute path use four slashes: sqlite:////path/to/file.db)"
                   if not os.path.isabs(self.path) else "")
            )
        try:
            with self._using() as db:
                db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"cannot initialise {url}: {exc}") from exc

    # -- connections ---------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise BackendUnavailable(f"backend {self.url} is closed")
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            try:
                db = sqlite3.connect(
                    self.path, timeout=self._timeout, isolation_level=None, check_same_thread=False
                )
                db.execute("PRAGMA journal_mode=WAL")
                db.execute(f"PRAGMA synchronous={self._synchronous}")
                db.execute(f"PRAGMA busy_timeout={int(self._timeout * 1000)}")
            except sqlite3.Error as exc:
                raise BackendUnavailable(f"cannot open {self.url}: {exc}") from exc
            with self._conns_lock:
                closed = self._closed
                if not closed:
                    self._conns.append(db)
            if closed:  # closed while this one opened: no one else would close it
                db.close()
                raise BackendUnavailable(f"backend {self.url} is closed")
            self._local.db = db
        return db

    @contextmanager
    def _using(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection, marked in use while the caller runs its statements.
        :meth:`close` closes at once only the connections no thread is using; one in use is
        closed by its own thread as it leaves. Closing a connection from another thread while
        a statement runs on it crashed the whole process (a segmentation fault in the sqlite3
        module: an agent's lease renewal against a backend closed under it). Raises
        :class:`BackendUnavailable` once the backend is closed. Uses nest (a count per
        connection): the connection is free only once the outermost one left."""
        db = self._conn()
        with self._conns_lock:
            if self._closed:
                raise BackendUnavailable(f"backend {self.url} is closed")
            self._in_use[db] = self._in_use.get(db, 0) + 1
        try:
            yield db
        finally:
            with self._conns_lock:
                left = self._in_use.pop(db) - 1
                if left:
                    self._in_use[db] = left
                orphaned = self._closed and not left
            if orphaned:
                self._drop(db)

    @contextmanager
    def _write(self, *, poll: float = WRITE_POLL) -> Iterator[sqlite3.Connection]:
        """One write transaction: ``BEGIN IMMEDIATE``, the caller's statements, ``COMMIT``.
        The write lock is asked for every ``poll`` seconds (:meth:`_begin_polling`), not on
        SQLite's own backoff, so that every writer gets its turn between the others' (a lease
        renewal asks more often: docs/agent.md "Bursts").

        Any failure rolls it back, and an SQLite error becomes :class:`BackendUnavailable`
        (:class:`BackendFull` for a full disk): nothing was written. SQLite rolls a
        transaction back by itself on some errors (``SQLITE_FULL``, ``SQLITE_IOERR``, ...), so
        the rollback here runs only while one is still open: a second ``ROLLBACK`` would fail
        with "no transaction is active" and hide the real error. A connection that cannot be
        rolled back is closed and replaced, so no thread is left inside a transaction."""
        with self._using() as db:
            try:
                self._begin_polling(db, poll)
            except sqlite3.Error as exc:
                raise self._failure("cannot start a write on", exc) from exc
            try:
                yield db
                db.execute("COMMIT")
            except BaseException as exc:
                self._rollback(db)
                if isinstance(exc, sqlite3.Error):
                    raise self._failure("cannot write", exc) from exc
                raise
        self.store_full = None  # this write went through: the store takes writes again

    def _begin_polling(self, db: sqlite3.Connection, every: float) -> None:
        """``BEGIN IMMEDIATE``, asking for the write lock every ``every`` seconds until the
        busy timeout has passed. SQLite's own busy handler sleeps longer and longer between
        its tries (100 ms apart after the first few), so under a stream of short transactions
        from many processes a writer that has waited a while almost never finds the lock
        free when it looks, while newcomers find it at once: lease renewals and whole batches
        of acknowledgements ran into their busy timeout while the lock was free most of the
        time. Asking at a steady pace keeps the waiters' chances even, and a shorter pace
        (:data:`LEASE_POLL`) gives renewals the better ones. Raises the last
        ``sqlite3.Error`` (still busy at the timeout, or any other error)."""
        deadline = time.monotonic() + self._timeout
        db.execute("PRAGMA busy_timeout=0")
        try:
            while True:
                try:
                    db.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    code = getattr(exc, "sqlite_errorcode", sqlite3.SQLITE_BUSY)
                    if code & 0xFF != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                        raise
                time.sleep(every)
        finally:
            db.execute(f"PRAGMA busy_timeout={int(self._timeout * 1000)}")

    def _failure(self, what: str, exc: sqlite3.Error) -> BackendUnavailable:
        """The locstatus error for the SQLite error of a write (nothing was written)."""
        code = getattr(exc, "sqlite_errorcode", None)  # absent on the module's own errors
        if code is not None and code & 0xFF == sqlite3.SQLITE_FULL:
            self.store_full = full = BackendFull(
                f"{what} {self.url}: the filesystem holding the database is full (SQLite: "
                f"{exc}); nothing was written: free space there and retry"
            )
            return full
        return BackendUnavailable(f"{what} {self.url}: {exc}; nothing was written")

    def _rollback(self, db: sqlite3.Connection) -> None:
        """End the failed transaction of ``db`` if SQLite did not already; a connection whose
        rollback fails is dropped (closing it rolls back) so the next call opens a new one."""
        if not db.in_transaction:
            return
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error:
            self._drop(db)

    def _drop(self, db: sqlite3.Connection) -> None:
        if getattr(self._local, "db", None) is db:
            del self._local.db
        with self._conns_lock:
            if db in self._conns:
                self._conns.remove(db)
        with contextlib.suppress(sqlite3.Error):
            db.close()

    def _query(self, sql: str, args: Sequence[object] = ()) -> list[tuple[object, ...]]:
        try:
            with self._using() as db:
                return db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"read failed on {self.url}: {exc}") from exc

    # -- records -------------------------------------------------------------------------

    def create(self, record: LocationStatus, history: Sequence[HistoryEntry]) -> LocationStatus:
        with self._write() as db:
            return _create_in(db, record, history)

    def read(self, location: str) -> LocationStatus:
        rows = self._query("SELECT version, data FROM locations WHERE location = ?", (location,))
        if not rows:
            raise NotFound(f"unknown location {location!r}")
        version, data = rows[0]
        return _decode_row(location, version, data)

    def read_many(self, locations: Sequence[str]) -> list[ReadResult]:
        """One query for the batch, its rows gathered into one JSON value by SQLite itself
        (``json_each`` in, ``json_group_array`` out): a row at a time, each step released and
        took the interpreter lock again, and with many threads waiting for that lock a batch
        read took seconds (docs/agent.md "Bursts")."""
        if not locations:
            return []
        asked = (json.dumps(list(locations)),)
        rows = self._query(
            "SELECT json_group_array(json_array(l.location, l.version, l.data)) FROM locations l "
            f"WHERE l.location IN (SELECT value FROM json_each(?)) AND {_JSONABLE}",
            asked,
        )
        found: dict[str, ReadResult] = {}
        for loc, version, data in json.loads(str(rows[0][0])):
            found[str(loc)] = _decode_row_or_error(str(loc), version, data)
        for loc, version, data in self._query(  # a hand edit stored bytes: row by row
            "SELECT location, version, data FROM locations l "
            f"WHERE l.location IN (SELECT value FROM json_each(?)) AND NOT {_JSONABLE}",
            asked,
        ):
            found[str(loc)] = _decode_row_or_error(str(loc), version, data)
        return [
            found[loc] if loc in found else NotFound(f"unknown location {loc!r}")
            for loc in locations
        ]

    def read_all(self) -> list[LocationStatus | CorruptRecord]:
        return codec.decode_rows(
            self._query("SELECT location, version, data FROM locations ORDER BY location"),
            _decode_row_or_error,
        )

    def scan_with_history(self) -> _ChunkedScan:
        return _ChunkedScan(self)

    def compare_and_set(
        self, record: LocationStatus, expected_version: int, history: Sequence[HistoryEntry]
    ) -> LocationStatus:
        loc = record.location
        version = expected_version + 1
        with self._write() as db:
            cur = db.execute(
                "UPDATE locations SET version = ?, data = ? WHERE location = ? AND version = ?",
                (version, codec.encode_record(record), loc, expected_version),
            )
            if cur.rowcount != 1:
                row = db.execute(
                    "SELECT version, data FROM locations WHERE location = ?", (loc,)
                ).fetchone()
                if row is None:
                    raise NotFound(f"unknown location {loc!r}")
                raise stale_version(  # the record as read in the same transaction
                    f"location {loc!r} is at version {row[0]}, expected {expected_version}",
                    _decode_row_or_error(loc, row[0], row[1]),
                )
            if history:
                _insert_history(db, loc, version, history)
        return with_version(record, version)

    batch_size = 1000
    """Locations per bulk write (:meth:`compare_and_set_many`, one transaction and one fsync):
    large enough that the fsync is a small part of it, small enough that the write lock is
    held for a few tens of milliseconds, so other writers (agents' acknowledgements) wait
    little."""

    def compare_and_set_many(self, items: Sequence[CasItem]) -> list[CasResult]:
        """Every item in one ``BEGIN IMMEDIATE`` transaction (one fsync). Each item's history
        row goes in first, only where none is (``ON CONFLICT DO NOTHING``), then its
        ``UPDATE ... WHERE version = ?``; an item whose update matched no row (a conflict, a
        record gone) deletes the history row it just inserted, and one whose history row was
        already there (a hand edit, as :func:`_insert_history` refuses it) updates nothing:
        either way nothing of that item stays, and the others commit. A transaction that
        fails as a whole (a full disk, the lock not obtained within ``timeout``) wrote
        nothing: every item gets its :class:`BackendUnavailable`."""
        distinct_locations(item.record.location for item in items)
        if not items:
            return []
        rows = [  # encoded before the write lock is taken (or given, CasItem.texts)
            item.texts if item.texts is not None and item.history else (
                codec.encode_record(item.record),
                codec.encode_history(codec.stamp(item.history, item.expected_version + 1))
                if item.history else None,
            )
            for item in items
        ]
        try:
            with self._write() as db:
                return [
                    _cas_one(db, item, data, history)
                    for item, (data, history) in zip(items, rows, strict=True)
                ]
        except BackendUnavailable as exc:
            return [exc] * len(items)

    def create_many(
        self, items: Sequence[CreateItem], *, texts: Sequence[tuple[str, str]] | None = None
    ) -> list[CasResult]:
        """Every create in one transaction (one fsync), each as :meth:`create` does it; one
        already stored is :class:`AlreadyExists` and left as it is, one whose history row is
        already there (a hand edit) :class:`CorruptRecord`, nothing of it written. A
        transaction that fails as a whole wrote nothing: every item gets its
        :class:`BackendUnavailable`.

        The batch is three queries and three ``executemany`` statements, not five statements
        per item: what is stored already (records, earlier lives, history rows at the versions
        the creates would make) is read for the whole batch first, in the same transaction,
        then the records, their history rows and lives are inserted together (a sync of
        100 000 locations ran 500 000 statements, docs/benchmarks.md "Bulk operations"). The
        texts are encoded before the write lock is taken (or given: ``texts``), for a first
        life (a recreated location's history is encoded again at its version)."""
        distinct_locations(record.location for record, _ in items)
        if not items:
            return []
        first = LIVES.first(0)
        encoded = list(texts) if texts is not None else [
            (codec.encode_record(record), codec.encode_history(codec.stamp(history, first)))
            for record, history in items
        ]
        asked = json.dumps([record.location for record, _ in items])
        try:
            with self._write() as db:
                return _create_batch(db, items, encoded, asked)
        except BackendUnavailable as exc:
            return [exc] * len(items)

    def delete(self, location: str, expected_version: int) -> None:
        with self._write() as db:
            cur = db.execute(
                "DELETE FROM locations WHERE location = ? AND version = ?",
                (location, expected_version),
            )
            if cur.rowcount != 1:
                row = db.execute(
                    "SELECT version FROM locations WHERE location = ?", (location,)
                ).fetchone()
                if row is None:
                    raise NotFound(f"unknown location {location!r}")
                raise VersionConflict(
                    f"location {location!r} is at version {row[0]}, expected {expected_version}"
                )
            db.execute("DELETE FROM history WHERE location = ?", (location,))
            db.execute("DELETE FROM acks WHERE location = ?", (location,))

    def history(
        self, location: str, *, limit: int = 50, before_version: int | None = None
    ) -> list[HistoryEntry]:
        page = HistoryPage(location, limit)
        upper = before_version if before_version is not None else 2**62
        want = max(1, limit)
        # Each row is one write (a record created without history has an empty one): fetch rows
        # until ``limit`` entries are gathered. A version a hand edit made text sorts above
        # every number, so it comes first and is reported, not skipped.
        while True:
            rows = self._query(
                "SELECT version, data FROM history WHERE location = ? AND (version < ? OR "
                "typeof(version) NOT IN ('integer', 'real')) ORDER BY version DESC LIMIT ?",
                (location, upper, want),
            )
            # a column declared INTEGER may hold anything (a hand edit): each key checked as read
            if page.take((codec.write_version(location, key), data) for key, data in rows):
                return page.entries
            if len(rows) < want:  # no older write
                return page.entries
            upper = codec.write_version(location, rows[-1][0])

    def history_write(self, location: str, version: int) -> list[HistoryEntry]:
        rows = self._query(
            "SELECT data FROM history WHERE location = ? AND version = ?", (location, version)
        )
        if not rows:
            return []
        return list(reversed(codec.decode_history(location, rows[0][0], version)))

    # -- workers -------------------------------------------------------------------------

    def put_worker(self, info: WorkerInfo) -> None:
        data = codec.encode_worker(info)  # bounded (InvalidInput) before the transaction
        with self._write(poll=LEASE_POLL) as db:  # judged and written in one transaction
            row = db.execute(
                "SELECT data FROM workers WHERE worker_id = ?", (info.worker_id,)
            ).fetchone()
            if row is not None and codec.refuses_put(info.worker_id, row[0], info):
                raise codec.standing_refusal(info.worker_id, registering=True)
            db.execute(
                "INSERT OR REPLACE INTO workers (worker_id, data) VALUES (?, ?)",
                (info.worker_id, data),
            )

    def remove_worker(
        self, worker_id: str, *, if_expires: datetime | None = None, retire: bool = False
    ) -> bool:
        with self._write() as db:
            row = db.execute(
                "SELECT data FROM workers WHERE worker_id = ?", (worker_id,)
            ).fetchone()
            if row is None or not codec.is_registration(worker_id, row[0], if_expires,
                                                        retire=retire):
                return False
            db.execute("DELETE FROM workers WHERE worker_id = ?", (worker_id,))
            db.execute("DELETE FROM acks WHERE worker_id = ?", (worker_id,))
        return True

    def has_worker(self, worker_id: str) -> bool:
        return bool(self._query("SELECT 1 FROM workers WHERE worker_id = ?", (worker_id,)))

    def workers(self) -> list[WorkerInfo]:
        rows = self._query("SELECT worker_id, data FROM workers ORDER BY worker_id")
        return [codec.decode_worker(str(wid), data) for wid, data in rows]

    def ack(
        self,
        worker_id: str,
        location: str,
        service: str,
        generation: int,
        *,
        if_version: int | None = None,
    ) -> None:
        with self._write() as db:  # judged in the write's transaction (invariant 13)
            row = db.execute(
                "SELECT version, data FROM locations WHERE location = ?", (location,)
            ).fetchone()
            if if_version is not None and (row is None or row[0] != if_version):
                raise stale_ack(location, if_version)
            record = None if row is None else _decode_row(location, row[0], row[1])
            check_ack(location, record, service, generation, if_version)
            db.execute(
                "INSERT OR REPLACE INTO acks (location, worker_id, service, generation) "
                "VALUES (?, ?, ?, ?)",
                (location, worker_id, service, generation),
            )

    def ack_many(self, worker_id: str, items: Sequence[AckItem]) -> list[AckResult]:
        """The batch judged before the write lock is taken, written under it by one statement.

        The records of the batch are read (one query, outside any write transaction: a WAL
        reader never waits) and each item judged against its record as :meth:`ack` judges it
        (:func:`_ack_refusal`); then one ``BEGIN IMMEDIATE`` transaction writes every
        acknowledgement so judged *on the condition that its record is still at the version
        judged* (``INSERT ... SELECT ... JOIN locations ON version``), so each is still judged
        against its record as it is at the write (invariant 13): one whose record moved in
        between (rare) is judged again inside the transaction. The rows are passed as one
        JSON value (``json_each``).

        Why the judging is outside the lock: decoding a thousand records held the database's
        write lock for the whole decode, and with sixteen workers acknowledging a pause of
        every location on a loaded host the lock was held nearly all the time: the bulk
        write and the workers' lease renewals waited behind it until their busy timeout, and
        workers fenced themselves (docs/agent.md "Bursts"). A failed transaction leaves every
        item it would have written its error (nothing written)."""
        out: list[AckResult] = [None] * len(items)
        if not items:
            return out
        try:
            current = self._ack_rows(sorted({i.location for i in items}))
        except BackendUnavailable as exc:
            return [exc] * len(items)
        judged: dict[int, int] = {}  # item -> the version it was judged at
        for n, item in enumerate(items):
            row = current.get(item.location)
            out[n] = _ack_refusal(item, row)
            if out[n] is None:
                assert row is not None and type(row[0]) is int  # else refused
                judged[n] = row[0]
        if not judged:
            return out
        rows = json.dumps([
            (items[n].location, items[n].service, items[n].generation, version)
            for n, version in judged.items()
        ])
        try:
            with self._write() as db:
                cur = db.execute(
                    "INSERT OR REPLACE INTO acks (location, worker_id, service, generation) "
                    "SELECT j.loc, ?, j.svc, j.gen FROM (SELECT json_extract(value, '$[0]') loc, "
                    "json_extract(value, '$[1]') svc, json_extract(value, '$[2]') gen, "
                    "json_extract(value, '$[3]') ver FROM json_each(?)) j "
                    "JOIN locations l ON l.location = j.loc AND l.version = j.ver",
                    (worker_id, rows),
                )
                if cur.rowcount != len(judged):  # some record moved since it was read
                    self._ack_moved(db, worker_id, items, judged, out)
        except BackendUnavailable as exc:
            for n in judged:
                out[n] = exc
        return out

    def _ack_rows(self, locations: Sequence[str]) -> dict[str, list[object]]:
        """``location -> [version, data]`` of the stored records among ``locations``, read in
        one query (the rows a hand edit stored as bytes by a second one)."""
        asked = (json.dumps(list(locations)),)
        got = self._query(  # an aggregate: one row, '{}' when none matched
            "SELECT json_group_object(l.location, json_array(l.version, l.data)) "
            f"FROM locations l WHERE l.location IN (SELECT value FROM json_each(?)) "
            f"AND {_JSONABLE}",
            asked,
        )[0][0]
        current: dict[str, list[object]] = json.loads(str(got))
        for loc, version, data in self._query(  # a hand edit stored bytes
            "SELECT location, version, data FROM locations l WHERE l.location IN "
            f"(SELECT value FROM json_each(?)) AND NOT {_JSONABLE}",
            asked,
        ):
            current[str(loc)] = [version, data]
        return current

    @staticmethod
    def _ack_moved(
        db: sqlite3.Connection,
        worker_id: str,
        items: Sequence[AckItem],
        judged: dict[int, int],
        out: list[AckResult],
    ) -> None:
        """Inside :meth:`ack_many`'s transaction: the items whose record is no longer at the
        version they were judged at (their conditional insert wrote nothing) judged again
        against the record as it is now, and written where that allows."""
        (got,) = db.execute(
            "SELECT json_group_object(location, version) FROM locations "
            "WHERE location IN (SELECT value FROM json_each(?))",
            (json.dumps(sorted({items[n].location for n in judged})),),
        ).fetchone()
        now: dict[str, object] = json.loads(got)
        for n, version in judged.items():
            item = items[n]
            if now.get(item.location) == version:
                continue  # written by the batch's statement
            row = db.execute(
                "SELECT version, data FROM locations WHERE location = ?", (item.location,)
            ).fetchone()
            out[n] = _ack_refusal(item, None if row is None else list(row))
            if out[n] is None:
                db.execute(
                    "INSERT OR REPLACE INTO acks (location, worker_id, service, generation) "
                    "VALUES (?, ?, ?, ?)",
                    (item.location, worker_id, item.service, item.generation),
                )

    def acks(self, location: str) -> AckMap:
        out: AckMap = {}
        for worker, service, raw in self._query(
            "SELECT worker_id, service, generation FROM acks WHERE location = ?", (location,)
        ):
            if (gen := codec.ack_generation(raw)) is not None:  # unreadable: acknowledges nothing
                out.setdefault(str(worker), {})[str(service)] = gen
        return out

    def acks_many(self, locations: Sequence[str]) -> dict[str, AckMap]:
        """One query for the batch (``json_each`` in, as :meth:`read_many`)."""
        out: dict[str, AckMap] = {loc: {} for loc in locations}
        if not out:
            return out
        for loc, worker, service, raw in self._query(
            "SELECT location, worker_id, service, generation FROM acks "
            "WHERE location IN (SELECT value FROM json_each(?))",
            (json.dumps(list(out)),),
        ):
            if (gen := codec.ack_generation(raw)) is not None:  # unreadable: acknowledges nothing
                out[str(loc)].setdefault(str(worker), {})[str(service)] = gen
        return out

    def all_acks(self) -> dict[str, AckMap]:
        out: dict[str, AckMap] = {}
        for loc, worker, service, raw in self._query(
            "SELECT location, worker_id, service, generation FROM acks"
        ):
            if (gen := codec.ack_generation(raw)) is not None:  # unreadable: acknowledges nothing
                out.setdefault(str(loc), {}).setdefault(str(worker), {})[str(service)] = gen
        return out

    # -- hints ---------------------------------------------------------------------------

    def subscribe(
        self, callback: HintCallback, *, kinds: Collection[str] | None = None
    ) -> Unsubscribe:
        """``kinds`` is honoured: the poller reads from the log only the kinds some subscriber
        asked for (and ``resync``). An agent asks for no ``acks`` hints, and a burst's
        acknowledgements by 16 workers are 16 rows of the log per location that each agent's
        poller read and hinted, more than the pause's own rows (docs/agent.md "Bursts")."""
        unsubscribe = self._subscribers.add(callback, kinds)
        with self._sub_lock:
            if self._poller is None:
                # Start from the log's current end now, so a write right after subscribe()
                # is hinted (not swallowed by the poller's first tick).
                start = int(self._query("SELECT COALESCE(MAX(seq), 0) FROM changes")[0][0])  # type: ignore[call-overload]
                self._watch = open_wal_watch(self.path)
                self._poller = threading.Thread(
                    target=self._poll_changes,
                    args=(start, self._watch),
                    name="locstatus-sqlite-hints",
                    daemon=True,
                )
                self._poller.start()
        return unsubscribe

    def _emit(self, hint: Hint) -> None:
        self._subscribers.emit(hint)

    def _poll_changes(self, start: int | None = None, watch: WalWatch | None = None) -> None:
        """The poller: read the change log as soon as the WAL file was written, where inotify
        reports it (:mod:`locstatus.backends.walwatch`; a reported write that shows nothing
        new yet is looked at again shortly), and every ``poll_interval`` seconds otherwise
        (every ``WATCHED_POLL`` seconds at least while the watch works)."""
        last: int | None = start
        pending: list[float] = []  # looks still due after a reported write found nothing
        try:
            while not self._stop.is_set():
                watching = watch is not None and watch.alive
                poll = max(self._poll, WATCHED_POLL) if watching else self._poll
                timeout = min(pending[0], poll) if pending else poll
                if watch is not None and watching:
                    written = watch.wait(timeout)
                    if self._stop.is_set():
                        return
                else:
                    written = False
                    if self._stop.wait(timeout):
                        return
                last, found = self._read_changes(last)
                if found:
                    pending = []
                elif written:
                    pending = list(RETRY_DELAYS)
                elif pending:
                    pending.pop(0)
        finally:
            if watch is not None:
                watch.close()

    def _read_changes(self, last: int | None) -> tuple[int | None, bool]:
        """Hint the changes logged after ``last`` of the kinds some subscriber wants; return
        the new ``last`` and whether anything was logged after ``last`` (wanted or not). When
        the log was pruned past ``last`` (this poller fell behind), a ``resync`` instead."""
        try:
            end = int(self._query("SELECT COALESCE(MAX(seq), 0) FROM changes")[0][0])  # type: ignore[call-overload]
            if last is None:
                return end, False
            if end <= last:
                return last, False
            kinds = [k for k in _HINT_KINDS if self._subscribers.wanted(k)]
            rows = self._query(
                "SELECT seq, kind, location FROM changes WHERE seq > ? AND seq <= ? AND kind IN "
                "(SELECT value FROM json_each(?)) ORDER BY seq LIMIT ?",
                (last, end, json.dumps(kinds), _KEEP_CHANGES),
            )
            oldest = int(self._query("SELECT COALESCE(MIN(seq), 0) FROM changes")[0][0])  # type: ignore[call-overload]
            if oldest > last + 1:  # rows after ``last`` were pruned unread
                self._emit(Hint(kind="resync"))
            else:
                batch = HintBatch()  # one hint per kind and location, in log order
                for _, kind, loc in rows:
                    batch.add(Hint(kind=str(kind), location=None if loc is None else str(loc)))
                self._subscribers.deliver(batch.take())
            return (end if len(rows) < _KEEP_CHANGES else int(rows[-1][0])), True  # type: ignore[call-overload]
        except BackendUnavailable:
            # keep ``last``: missed changes are hinted after recovery (or a resync fires
            # when they were pruned meanwhile)
            self._emit(Hint(kind="resync"))
            return last, False

    # -- lifecycle -----------------------------------------------------------------------

    def probe_time(self) -> datetime:
        """The kernel's time, as it stamps a write to ``<db>-clock`` (one byte rewritten in
        place: no block is allocated, so it works on a full disk once the file exists).
        A write, not ``os.utime``: libfaketime rewrites the time a process passes to
        ``utimensat``, never the kernel's own stamp of a write."""
        if self._closed:
            raise BackendUnavailable(f"backend {self.url} is closed")
        path = self.path + "-clock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                os.pwrite(fd, b"t", 0)
                ns = os.fstat(fd).st_mtime_ns
            finally:
                os.close(fd)
        except OSError as exc:
            raise BackendUnavailable(
                f"cannot read the time of {self.url}: writing {path} failed: "
                f"{exc.strerror or exc}"
            ) from exc
        if ns % 1_000_000_000 == 0:
            self.clock_resolution = 1.0  # a file system that stamps whole seconds
        seconds, rest = divmod(ns, 1_000_000_000)
        return datetime.fromtimestamp(seconds, UTC) + timedelta(microseconds=rest // 1000)

    def ping(self) -> None:
        self._query("SELECT 1")

    def close(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.interrupt()
        if self._poller is not None and self._poller is not threading.current_thread():
            self._poller.join(timeout=2)
        with self._conns_lock:  # a connection in use is closed by its thread (_using)
            self._closed = True
            conns, self._conns = self._conns, []
            idle = [db for db in conns if db not in self._in_use]
        for db in idle:
            with contextlib.suppress(sqlite3.Error):
                db.close()

    # -- test hooks ----------------------------------------------------------------------

    def write_raw(self, location: str, payload: str) -> None:
        """Store ``payload`` verbatim as the record of ``location`` (corruption tests)."""
        with self._write() as db:
            db.execute(
                "INSERT INTO locations (location, version, data) VALUES (?, 1, ?) "
                "ON CONFLICT(location) DO UPDATE SET data = excluded.data, version = version + 1",
                (location, payload),
            )


class _ChunkedScan:
    """:meth:`SQLiteBackend.scan_with_history`: records in location order, ``batch`` at a time
    (keyset pagination), each with its newest history rows read by the same statement, so a
    record and its history always come from one snapshot. No read transaction stays open
    between batches (a long one would stop WAL checkpoints), and only one batch is held in
    memory.

    Each row brings the newest history write and, for a record written since it was created
    (the low bits of its version above 1, see :data:`~locstatus.backends.versions.LIVES`), up to
    four older ones
    (a pause no worker watches is two writes, the pausing one and its settle: a paused service
    with a resume scheduled and a service added since is four writes past its create),
    each as ``version US data``, joined by RS (ASCII unit and record separators: characters
    valid JSON never holds); decoded only as far as the record's services need
    (:func:`codec.decode_newest_writes`)."""

    _OLDER = 4
    _HEAD = (  # the newest row as "version US data", or '' (not NULL) when it is not that:
        # split once, at the first US, so its data may hold anything (history() reads the same)
        "CASE WHEN typeof(h.version) = 'integer' AND typeof(h.data) IN ('text', 'blob') "
        "THEN h.version || char(31) || h.data ELSE '' END"
    )
    _ROW = (  # an older row likewise, joined by RS: its data must hold neither separator
        "CASE WHEN typeof(h.version) = 'integer' AND typeof(h.data) IN ('text', 'blob') "
        "AND instr(h.data, char(30)) = 0 AND instr(h.data, char(31)) = 0 "
        "THEN h.version || char(31) || h.data ELSE '' END"
    )
    _SQL = (
        f"SELECT l.location, l.version, l.data, (SELECT {_HEAD} "
        "FROM history h WHERE h.location = l.location ORDER BY h.version DESC LIMIT 1), "
        f"CASE WHEN (l.version & {LIVES.seq_mask}) > 1 THEN "
        f"(SELECT group_concat(o.r, char(30)) FROM (SELECT {_ROW} r FROM history h "
        f"WHERE h.location = l.location ORDER BY h.version DESC LIMIT {_OLDER} OFFSET 1) o) END "
        "FROM locations l WHERE l.location > ? ORDER BY l.location LIMIT ?"
    )

    def __init__(self, backend: SQLiteBackend, batch: int = 2000) -> None:
        self.backend = backend
        self.batch = batch

    def __len__(self) -> int:
        rows = self.backend._query("SELECT COUNT(*) FROM locations")
        return int(rows[0][0])  # type: ignore[call-overload,no-any-return]

    def __iter__(self) -> Iterator[ScanItem]:
        after = ""
        while True:
            rows = self.backend._query(self._SQL, (after, self.batch))
            for loc, version, data, newest, older in rows:
                location = str(loc)
                rec = _decode_row_or_error(location, version, data)
                writes = _writes(newest, older)
                yield rec, (
                    None if writes is None else codec.decode_newest_writes(location, rec, writes)
                )
            if len(rows) < self.batch:
                return
            after = str(rows[-1][0])


def _create_in(
    db: sqlite3.Connection, record: LocationStatus, history: Sequence[HistoryEntry]
) -> LocationStatus:
    """Create ``record`` in the caller's transaction (its first version above every version of
    an earlier life). Raises :class:`AlreadyExists`, :class:`CorruptRecord` (see
    :func:`_insert_history`), having written nothing."""
    loc = record.location
    if db.execute("SELECT 1 FROM locations WHERE location = ?", (loc,)).fetchone():
        raise AlreadyExists(f"location {loc!r} already exists")
    row = db.execute("SELECT last FROM incarnations WHERE location = ?", (loc,)).fetchone()
    incarnation = (row[0] if row else 0) + 1
    version = LIVES.first(incarnation - 1)
    _insert_history(db, loc, version, history)  # first: refused, it leaves nothing behind
    db.execute(
        "INSERT OR REPLACE INTO incarnations (location, last) VALUES (?, ?)", (loc, incarnation)
    )
    db.execute(
        "INSERT INTO locations (location, version, data) VALUES (?, ?, ?)",
        (loc, version, codec.encode_record(record)),
    )
    return copy_with(record, {"version": version})


def _create_batch(
    db: sqlite3.Connection, items: Sequence[CreateItem], encoded: list[tuple[str, str]],
    asked: str,
) -> list[CasResult]:
    """:meth:`SQLiteBackend.create_many` in the caller's transaction: ``encoded`` holds each
    item's record text and its history text at a first life's version, ``asked`` the JSON
    list of the items' locations. Each item as :func:`_create_in` would do it, what is stored
    of them read in one query (records, earlier lives, and history rows, which a location not
    stored has none of unless a hand edit left some)."""
    present: set[str] = set()
    lasts: dict[str, object] = {}
    histories: set[tuple[str, object]] = set()
    for table, loc, value in db.execute(_STORED_OF_BATCH, (asked,)):
        if table == 0:
            present.add(loc)
        elif table == 1:
            lasts[loc] = value
        else:
            histories.add((loc, value))
    out: list[CasResult] = []
    rows: list[tuple[str, int, str, str, object]] = []  # location, version, texts, life
    first = LIVES.first(0)
    for (record, history), (data, entries) in zip(items, encoded, strict=True):
        loc = record.location
        if loc in present:
            out.append(AlreadyExists(f"location {loc!r} already exists"))
            continue
        incarnation = lasts.get(loc, 0) + 1  # type: ignore[operator]
        version = LIVES.first(incarnation - 1)
        if histories and (loc, version) in histories:  # a hand edit put history ahead
            out.append(CorruptRecord(
                loc, f"the history already holds a write at version {version}, which this "
                "write would make: nothing written (see 'locstatus check')"
            ))
            continue
        if version != first:
            entries = codec.encode_history(codec.stamp(history, version))
        out.append(with_version(record, version))
        rows.append((loc, version, data, entries, incarnation))
    if rows:
        db.executemany("INSERT INTO history (location, version, data) VALUES (?, ?, ?)",
                       [(r[0], r[1], r[3]) for r in rows])
        db.executemany("INSERT OR REPLACE INTO incarnations (location, last) VALUES (?, ?)",
                       [(r[0], r[4]) for r in rows])
        db.executemany("INSERT INTO locations (location, version, data) VALUES (?, ?, ?)",
                       [(r[0], r[1], r[2]) for r in rows])
    return out


_STORED_OF_BATCH = """
SELECT 0, location, NULL FROM locations WHERE location IN (SELECT value FROM json_each(?1))
UNION ALL
SELECT 1, location, last FROM incarnations WHERE location IN (SELECT value FROM json_each(?1))
UNION ALL
SELECT 2, location, version FROM history WHERE location IN (SELECT value FROM json_each(?1))
"""
"""What :func:`_create_batch` needs to know of the locations of a batch (a JSON list):
``(0, location, NULL)`` per stored record, ``(1, location, last life)`` per earlier life,
``(2, location, version)`` per history row."""


def _cas_one(
    db: sqlite3.Connection, item: CasItem, data: str, history: str | None
) -> CasResult:
    """One item of :meth:`SQLiteBackend.compare_and_set_many` in the caller's transaction:
    its stored record, or its error with nothing of it written."""
    loc = item.record.location
    version = item.expected_version + 1
    if history is not None:
        cur = db.execute(
            "INSERT INTO history (location, version, data) VALUES (?, ?, ?) "
            "ON CONFLICT DO NOTHING",
            (loc, version, history),
        )
        if cur.rowcount != 1:
            refused = _stored_version(db, loc, item.expected_version)
            return refused or CorruptRecord(
                loc, f"the history already holds a write at version {version}, which this "
                "write would make: nothing written (see 'locstatus check')"
            )
    cur = db.execute(
        "UPDATE locations SET version = ?, data = ? WHERE location = ? AND version = ?",
        (version, data, loc, item.expected_version),
    )
    if cur.rowcount == 1:
        return with_version(item.record, version)
    if history is not None:  # ours: inserted just above, where none was
        db.execute("DELETE FROM history WHERE location = ? AND version = ?", (loc, version))
    refused = _stored_version(db, loc, item.expected_version)
    assert refused is not None, "an UPDATE matching no row means another version or none"
    return refused


def _stored_version(
    db: sqlite3.Connection, location: str, expected: int
) -> VersionConflict | NotFound | None:
    """Why a compare-and-set at ``expected`` is refused (the record is at another version, or
    gone), or None when the record is at ``expected``."""
    row = db.execute("SELECT version FROM locations WHERE location = ?", (location,)).fetchone()
    if row is None:
        return NotFound(f"unknown location {location!r}")
    if row[0] != expected:
        return VersionConflict(f"location {location!r} is at version {row[0]}, expected {expected}")
    return None


def _insert_history(
    db: sqlite3.Connection, location: str, version: int, history: Sequence[HistoryEntry]
) -> None:
    """The history row of the write making ``version``, in the caller's transaction. A row
    already there (a hand edit put the history ahead of the record) refuses the write, which
    the caller's transaction rolls back: :class:`CorruptRecord`, nothing written."""
    try:
        db.execute(
            "INSERT INTO history (location, version, data) VALUES (?, ?, ?)",
            (location, version, codec.encode_history(codec.stamp(history, version))),
        )
    except sqlite3.IntegrityError:
        raise CorruptRecord(
            location, f"the history already holds a write at version {version}, which this "
            "write would make: nothing written (see 'locstatus check')"
        ) from None


def _ack_refusal(item: AckItem, row: list[object] | None) -> LocstatusError | None:
    """Why :meth:`SQLiteBackend.ack` would refuse ``item`` against its record's row
    (``[version, data]``, None: no record), read in the acknowledgement's transaction; None:
    it is written."""
    if item.if_version is not None and (row is None or row[0] != item.if_version):
        return stale_ack(item.location, item.if_version)
    try:
        record = None if row is None else _decode_row(item.location, row[0], row[1])
        check_ack(item.location, record, item.service, item.generation, item.if_version)
    except LocstatusError as exc:  # corrupt, or a generation the record does not have
        return exc
    return None


def _decode_row(location: str, version: object, data: object) -> LocationStatus:
    """A record from its row; the columns are typed only by declaration, so a hand edit may
    have stored anything there. Raises :class:`CorruptRecord`."""
    if type(version) is not int:
        raise CorruptRecord(location, f"version {version!r} is not an integer")
    if not isinstance(data, str | bytes):
        raise CorruptRecord(location, f"expected JSON text, got {type(data).__name__}")
    return codec.decode_record(location, version, data)


def _decode_row_or_error(
    location: str, version: object, data: object
) -> LocationStatus | CorruptRecord:
    """:func:`_decode_row`, with the error in place of the record (whole scans)."""
    try:
        return _decode_row(location, version, data)
    except CorruptRecord as exc:
        return exc


def _writes(newest: object, older: object) -> list[codec.Write] | None:
    """The ``(version, data)`` of the history rows the scan joined (see :class:`_ChunkedScan`),
    newest first, up to the first that is not ``version US text`` with an integer version.
    None when the newest row is not: the caller then pages through :meth:`SQLiteBackend.history`,
    which names what is wrong with it."""
    if newest is None:
        return []
    head = _write_of(str(newest))
    if head is None:
        return None
    if older is None:  # the usual row: a record not written since it was created
        return [head]
    out = [head]
    for part in str(older).split("\x1e"):
        write = _write_of(part)
        if write is None:
            break
        out.append(write)
    return out


def _write_of(part: str) -> codec.Write | None:
    """``(version, data)`` of one joined ``version US data`` row, or None when it is not that."""
    version, sep, data = part.partition("\x1f")
    if not sep or not (version.isascii() and version.isdigit()):
        return None
    return int(version), data
