"""``mongodb://host[:port][,host...]/?database=NAME&collection=NAME``: MongoDB via pymongo.

docs/design.md §4, issue 4. Why it is shaped so:

- **One document per location**, ``{_id: location, version, born, services, deleted_at,
  recent_history, history_copied}``. Compare-and-set is one ``findAndModify``:
  ``find_one_and_update({_id, version: v}, {$set, $inc: {version: 1}, $push: {recent_history:
  {$each: [write], $slice: -N}}})``. The state and the write's history entries change in that
  one single-document write, atomic on every MongoDB (docs/design.md §2). A ``None`` result is told
  apart (conflict, missing, or our own write already applied by a driver retry) by a re-read. There
  is never an upsert with a version filter (it would create a second record on a conflict); creation
  is ``insert_one``, a ``DuplicateKeyError`` is :class:`AlreadyExists`.
- **Full history in its own collection** (``<collection>_history``), one document per write
  ``{location, version, entries}`` under a unique ``(location, version)`` index, inserted after
  the ``findAndModify``. The embedded ``recent_history`` (the last ``recent_history=N`` writes,
  default 100) is authoritative; the collection serves older pages, and :meth:`history` merges
  both. A writer can die between its two writes, so nothing may leave the embedded copy before
  the collection holds it: the record's ``history_copied`` says up to which version the
  collection is known whole, and the ``findAndModify`` matches only when every write its
  ``$slice`` may drop is at or below it. A writer raises it every ``N // 2`` writes
  (:meth:`MongoBackend._catch_up`: copy what the collection lacks from the embedded copy, then
  ``$max``); a write that finds it lagging catches up first. :meth:`MongoBackend.history_gaps`
  verifies the collection's version chain for the check job, which repairs it with
  :meth:`MongoBackend.restore_history` (docs/mongodb.md, "Compare-and-set, history, versions").
- **Versions strictly increase across delete and recreate**: ``<collection>_incarnations``
  keeps, per location, a creation counter ``n`` and a ``floor`` raised before each purge. A new
  life starts at ``max((n-1) << 20 | 1, floor)`` (the SQLite scheme, plus the floor), above every
  version of an earlier life; ``born`` keeps the first version of the life, so leftovers of an
  interrupted purge are never read as this life's history.
- **Workers** are heartbeat documents ``{_id: worker_id, info, expires_at}`` with a TTL index on
  ``expires_at`` (``expireAfterSeconds=worker_ttl``, default 3600 s after the lease ran out).
  TTL deletion is lazy (MongoDB sweeps once a minute), so nothing trusts a document's presence:
  readers test ``lease_expires_at`` explicitly (:meth:`WorkerInfo.alive`), and an expired worker
  stays listed with its past lease until the sweep, which lets the check job report it.
  Acknowledgements live in ``<collection>_acks``, ``_id = "location/worker/service"``, each
  stamped with the life of the record it acknowledges (its ``born``): reads count only those of
  the record's current life, so an earlier life's never counts and ``create`` deletes them only
  once its own record is stored (a losing creator once deleted the winner's).
- **Change hints**: a change stream on the database (resume token kept across reconnects,
  ``$project`` keeps events small) when the server is a replica set or mongos; polling of
  ``{_id, version}`` snapshots every ``poll_interval`` seconds otherwise. After any reconnect or
  lost stream a ``resync`` hint asks for a full re-read (docs/design.md §3.4).
- **Durability and timeouts**: ``w=majority&journal=true`` (``wTimeoutMS=10000``) and
  ``readConcernLevel=majority`` unless the URL says otherwise; ``serverSelectionTimeoutMS=5000``,
  ``connectTimeoutMS=5000``, ``socketTimeoutMS=30000``; every read and ``findAndModify``
  carries ``maxTimeMS`` (default 10000), plain writes are bounded by ``wTimeoutMS`` and the
  socket timeout. A server that does not answer is :class:`BackendUnavailable` naming it; a
  write whose outcome is unknown is :class:`AmbiguousCommit`, resolved by the manager
  (docs/design.md §3.2).
- **Indexes are created at start**, idempotently (same name and options: a no-op); a changed
  ``worker_ttl`` is applied with ``collMod``. Database and collection names are validated.

URL options of locstatus (removed before the URL reaches pymongo; every other option is
pymongo's): ``database`` (default: the URL path, else ``locstatus``), ``collection`` (default
``locations``), ``recent_history`` (writes embedded, 1-1000), ``maxTimeMS``, ``poll_interval``
(seconds, 0.05-60, default 1), ``hints`` (``auto`` | ``changestream`` | ``poll``), ``worker_ttl``
(seconds).
"""

from __future__ import annotations

import collections.abc as cabc
import contextlib
import logging
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import pymongo
from bson.errors import InvalidDocument
from pydantic import TypeAdapter, ValidationError
from pymongo import ASCENDING, IndexModel, MongoClient, ReturnDocument
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import (
    AutoReconnect,
    BulkWriteError,
    ConfigurationError,
    DocumentTooLarge,
    DuplicateKeyError,
    ExecutionTimeout,
    InvalidOperation,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
    WriteConcernError,
    WTimeoutError,
)

from locstatus.backends import codec
from locstatus.backends.base import (
    DOWN_GRACE,
    GAPS_LISTED,
    AckMap,
    Backend,
    HintCallback,
    HistoryGaps,
    Unsubscribe,
    stale_ack,
)
from locstatus.backends.urls import Number, split_url
from locstatus.errors import (
    AlreadyExists,
    AmbiguousCommit,
    BackendUnavailable,
    CorruptRecord,
    InvalidInput,
    LocstatusError,
    NotFound,
    VersionConflict,
)
from locstatus.models import Hint, HistoryEntry, LocationStatus, WorkerInfo

log = logging.getLogger(__name__)

Doc = dict[str, Any]

_DB_RE = re.compile(r"[A-Za-z0-9_-]{1,63}")
_COLL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,47}")
_INCARNATION_SHIFT = 20
_META = ("_id", "version", "born", "recent_history", "history_copied")
_DEFAULT_CLIENT_OPTIONS: dict[str, Any] = {
    "serverSelectionTimeoutMS": 5000,
    "connectTimeoutMS": 5000,
    "socketTimeoutMS": 30000,
    "w": "majority",
    "journal": True,
    "wTimeoutMS": 10000,
    "readConcernLevel": "majority",
    "appname": "locstatus",
}
_HINT_MODES = ("auto", "changestream", "poll")
_CLOSE_TIMEOUT = 0.5
"""Seconds the driver may spend ending its server sessions when the backend closes."""
_CLOSE_WAIT = 0.2
"""Seconds :meth:`MongoBackend.close` waits for the driver's own close (one round trip to a
server that answers) before leaving it to finish in the background."""
_STREAM_LOST_CODES = {136, 260, 280, 286}  # capped position lost, bad token, fatal, history lost
_NO_CHANGE_STREAMS_CODES = {40573}  # "$changeStream stage is only supported on replica sets"
_INDEX_OPTIONS_CONFLICT = {85, 86}
_CATCH_UP_ATTEMPTS = 3
"""compare-and-set rounds when the history copy lags (catch up, then write)."""
_ENTRIES = TypeAdapter(list[HistoryEntry])


@dataclass(frozen=True)
class MongoSettings:
    """What a ``mongodb://`` URL asks for. ``client_url`` is the URL without locstatus' own
    options; ``client_options`` are the defaults the URL did not override."""

    client_url: str
    where: str
    """Hosts, without credentials, for error messages."""
    database: str
    collection: str
    recent_history: int = 100
    max_time_ms: int = 10_000
    poll_interval: float = 1.0
    hints: str = "auto"
    worker_ttl: int = 3600
    server_selection_timeout: float = 5.0
    client_options: dict[str, Any] = field(default_factory=dict)


RECENT_HISTORY = Number("recent_history", 100, 1, 1000, unit="writes", integer=True)
"""Writes kept embedded in each record."""
MAX_TIME_MS = Number("maxTimeMS", 10_000, 1, 3_600_000, unit="ms", integer=True)
"""Server-side time budget of every read and findAndModify."""
POLL_INTERVAL = Number("poll_interval", 1.0, 0.05, 60)
"""Seconds between polls when change streams are not available."""
WORKER_TTL = Number("worker_ttl", 3600, 0, 366 * 86400, integer=True)
"""Seconds after a lease ran out before the TTL monitor deletes a worker's document."""
SERVER_SELECTION_TIMEOUT_MS = Number(
    "serverSelectionTimeoutMS", 5000, 0, 999_999_999, unit="ms", low_open=True
)
"""pymongo's: how long to wait for a server to answer (pymongo's own bounds)."""


def parse_mongo_url(url: str) -> MongoSettings:
    """Split a ``mongodb://`` / ``mongodb+srv://`` URL into locstatus' options and the URL
    pymongo gets. Raises :class:`InvalidInput` naming the bad option or name."""
    parts = split_url(url, "MongoDB", "mongodb://host[:port]/database", where=_redact(str(url)))
    if parts.scheme not in ("mongodb", "mongodb+srv") or not parts.netloc:
        raise InvalidInput(f"invalid MongoDB URL {url!r}: expected mongodb://host[:port]/...")
    mine: dict[str, str] = {}
    kept: list[str] = []
    present: set[str] = set()
    own = {"database", "collection", "recent_history", "maxtimems", "poll_interval", "hints",
           "worker_ttl"}
    for segment in (s for s in parts.query.split("&") if s):
        key = unquote(segment.split("=", 1)[0])
        value = unquote(segment.split("=", 1)[1]) if "=" in segment else ""
        if key.lower() in own:
            mine[key.lower()] = value
        else:
            kept.append(segment)
            present.add(key.lower())
    path_db = unquote(parts.path.lstrip("/"))
    database = mine.get("database") or path_db or "locstatus"
    collection = mine.get("collection") or "locations"
    if not _DB_RE.fullmatch(database):
        raise InvalidInput(
            f"invalid MongoDB database name {database!r} in {_redact(url)}: expected 1-63 "
            "characters of A-Z a-z 0-9 _ -"
        )
    if not _COLL_RE.fullmatch(collection) or collection.lower().startswith("system"):
        raise InvalidInput(
            f"invalid MongoDB collection name {collection!r} in {_redact(url)}: expected 1-48 "
            "characters of A-Z a-z 0-9 _ -, starting with a letter or _, not system*"
        )
    hints = mine.get("hints", "auto").lower()
    if hints not in _HINT_MODES:
        raise InvalidInput(f"invalid hints={hints!r} in {_redact(url)}: auto|changestream|poll")
    where = _redact(url)
    recent = int(RECENT_HISTORY.parse(mine.get("recent_history"), "MongoDB", where))
    max_time_ms = int(MAX_TIME_MS.parse(mine.get("maxtimems"), "MongoDB", where))
    poll = POLL_INTERVAL.parse(mine.get("poll_interval"), "MongoDB", where)
    worker_ttl = int(WORKER_TTL.parse(mine.get("worker_ttl"), "MongoDB", where))
    options = {k: v for k, v in _DEFAULT_CLIENT_OPTIONS.items() if k.lower() not in present}
    sst = 5.0
    for segment in kept:
        key, _, value = segment.partition("=")
        if unquote(key).lower() == "serverselectiontimeoutms":
            # pymongo's own option, read here for messages and waits: pymongo ignores a bad
            # value with a warning (and waits 30 s), so it is refused here instead
            sst = SERVER_SELECTION_TIMEOUT_MS.parse(unquote(value), "MongoDB", where) / 1000
    client_url = urlunsplit((parts.scheme, parts.netloc, parts.path, "&".join(kept), ""))
    return MongoSettings(
        client_url=client_url,
        where=parts.netloc.rpartition("@")[2],
        database=database,
        collection=collection,
        recent_history=recent,
        max_time_ms=max_time_ms,
        poll_interval=poll,
        hints=hints,
        worker_ttl=worker_ttl,
        server_selection_timeout=sst,
        client_options=options,
    )


def _redact(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:  # does not split (an unclosed "["): hide whatever precedes an "@"
        return re.sub(r"//[^/]*@", "//***@", url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


def _short(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).split(", full error:")[0].split(", Timeout:")[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


class MongoBackend(Backend):
    """MongoDB backend (docs/design.md §4). Safe for many threads and processes on many hosts.

    Usage::

        backend = MongoBackend("mongodb://db1:27017,db2:27017/?replicaSet=rs0"
                               "&database=locstatus&collection=locations")
        rec = backend.read("us-east-1")
        backend.compare_and_set(new_rec, rec.version, [entry])  # VersionConflict if raced

    Raises :class:`InvalidInput` for a malformed URL or name and :class:`BackendUnavailable`
    (naming the server) when no server answers within ``serverSelectionTimeoutMS``.
    """

    two_history_copies = True  # embedded recent history + the history collection

    def __init__(self, url: str) -> None:
        self.url = url
        self.settings = s = parse_mongo_url(url)
        try:
            self._client: MongoClient[Doc] = MongoClient(
                s.client_url, tz_aware=True, connect=False, **s.client_options
            )
        except (ConfigurationError, ValueError, TypeError) as exc:
            raise InvalidInput(f"invalid MongoDB URL {_redact(url)}: {_short(exc)}") from None
        self._closed = False
        self._db: Database[Doc] = self._client[s.database]
        self._records: Collection[Doc] = self._db[s.collection]
        self._history: Collection[Doc] = self._db[f"{s.collection}_history"]
        self._workers: Collection[Doc] = self._db[f"{s.collection}_workers"]
        self._acks: Collection[Doc] = self._db[f"{s.collection}_acks"]
        self._incarnations: Collection[Doc] = self._db[f"{s.collection}_incarnations"]
        self._subscribers: list[HintCallback] = []
        self._sub_lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()
        self._armed = threading.Event()
        self.hint_mode: str | None = None
        """``changestream`` or ``poll`` once hints are armed (for operators and tests)."""
        self._reached = False
        self._down_seen: tuple[float, str] | None = None  # (monotonic, why) of a failed ping
        try:
            self._ensure_indexes()
        except BaseException:
            self._client.close()
            raise
        self._reached = True  # from now on, no selectable server means "known down"

    # -- plumbing ------------------------------------------------------------------------

    @contextmanager
    def _io(self, what: str, *, write: bool = False) -> Iterator[None]:
        """Turn pymongo errors into locstatus errors. ``write=True``: the operation is a
        single write whose outcome is unknown after a network error (:class:`AmbiguousCommit`).
        A document the driver refuses to encode (``DocumentTooLarge``, ``InvalidDocument``, an
        integer beyond BSON's 8 bytes) was never sent: :class:`InvalidInput` naming ``what``."""
        if self._closed:
            raise BackendUnavailable(f"MongoDB backend {self.settings.where} is closed")
        self._fail_fast(what)
        try:
            yield
        except DocumentTooLarge as exc:  # refused by the driver: nothing was sent
            raise InvalidInput(
                f"{what}: the document is too large for MongoDB ({_short(exc)}; a document "
                "holds at most 16 MB); nothing was written"
            ) from exc
        except (InvalidDocument, OverflowError) as exc:  # BSON cannot encode it: nothing sent
            raise InvalidInput(
                f"{what}: MongoDB cannot store the document ({type(exc).__name__}: "
                f"{_short(exc)}); nothing was written"
            ) from exc
        except ServerSelectionTimeoutError as exc:  # nothing was sent
            raise BackendUnavailable(
                f"MongoDB at {self.settings.where} is unreachable ({what}): no server answered "
                f"within {self.settings.server_selection_timeout:g}s (serverSelectionTimeoutMS); "
                f"is mongod running? [{_short(exc, 200)}]"
            ) from exc
        except ExecutionTimeout as exc:
            if write:
                raise AmbiguousCommit(
                    f"MongoDB at {self.settings.where}: {what} exceeded "
                    f"maxTimeMS={self._mt}; outcome unknown"
                ) from exc
            raise BackendUnavailable(
                f"MongoDB at {self.settings.where}: {what} exceeded maxTimeMS={self._mt} "
                f"(ExecutionTimeout: {_short(exc)})"
            ) from exc
        except (AutoReconnect, WriteConcernError, WTimeoutError) as exc:
            if write:
                raise AmbiguousCommit(
                    f"MongoDB at {self.settings.where}: outcome of {what} unknown "
                    f"({type(exc).__name__}: {_short(exc)})"
                ) from exc
            raise BackendUnavailable(
                f"MongoDB at {self.settings.where} failed during {what} "
                f"({type(exc).__name__}: {_short(exc)})"
            ) from exc
        except InvalidOperation as exc:
            raise BackendUnavailable(
                f"MongoDB backend {self.settings.where} is closed ({what}): {_short(exc)}"
            ) from exc
        except OperationFailure as exc:
            raise BackendUnavailable(
                f"MongoDB at {self.settings.where} refused {what}: {_short(exc)} "
                f"(code {exc.code})"
            ) from exc
        except PyMongoError as exc:
            raise BackendUnavailable(
                f"MongoDB at {self.settings.where} failed during {what} "
                f"({type(exc).__name__}: {_short(exc)})"
            ) from exc

    def _fail_fast(self, what: str) -> None:
        """While the driver knows no selectable server (once one was reached: a server that
        went down, or a replica set without a primary), make sure one answers within
        :data:`DOWN_GRACE` seconds before the operation waits out ``serverSelectionTimeoutMS``;
        the ping's server selection asks the driver to check every server now, so the first
        call after the server is back finds it. Raises :class:`BackendUnavailable`, nothing
        sent (docs/reliability.md, "Failing fast while the backend is down")."""
        if not self._reached:
            return
        if self._client.topology_description.has_writable_server():
            return
        failed = self._down_seen
        if failed is not None and time.monotonic() - failed[0] < DOWN_GRACE:
            raise BackendUnavailable(self._down_message(what, failed[1]))  # asked just now
        try:
            # the driver's server selection waits in steps of 0.5 s whatever its budget: half
            # the grace still asks for one check of every server, and answers within it
            with pymongo.timeout(DOWN_GRACE / 2):
                self._client.admin.command("ping")
        except PyMongoError as exc:
            self._down_seen = (time.monotonic(), _short(exc, 200))
            raise BackendUnavailable(self._down_message(what, self._down_seen[1])) from exc
        self._down_seen = None

    def _down_message(self, what: str, why: str) -> str:
        return (
            f"MongoDB at {self.settings.where} is unreachable ({what}): no server selectable, "
            f"none answered within {DOWN_GRACE:g}s; is mongod running? [{why}]"
        )

    @property
    def _mt(self) -> int:
        return self.settings.max_time_ms

    def _ensure_indexes(self) -> None:
        """Create the indexes (idempotent: same name and options is a no-op). Index builds
        get at least 60 s whatever ``maxTimeMS`` says."""
        ttl = self.settings.worker_ttl
        mt = max(self._mt, 60_000)
        with self._io("creating indexes"):
            self._history.create_indexes(
                [IndexModel([("location", ASCENDING), ("version", ASCENDING)],
                            name="location_version", unique=True)],
                maxTimeMS=mt,
            )
            self._acks.create_indexes(
                [IndexModel([("location", ASCENDING)], name="location"),
                 IndexModel([("worker_id", ASCENDING)], name="worker_id")],
                maxTimeMS=mt,
            )
            try:
                self._workers.create_indexes(
                    [IndexModel([("expires_at", ASCENDING)], name="expires_at_ttl",
                                expireAfterSeconds=ttl)],
                    maxTimeMS=mt,
                )
            except OperationFailure as exc:
                if exc.code not in _INDEX_OPTIONS_CONFLICT:
                    raise
                self._db.command(
                    "collMod", self._workers.name,
                    index={"name": "expires_at_ttl", "expireAfterSeconds": ttl},
                    maxTimeMS=mt,
                )

    def _decode(self, doc: Mapping[str, Any]) -> LocationStatus:
        location = str(doc["_id"])
        version = doc.get("version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise CorruptRecord(location, f"version: expected an integer, got {version!r}")
        payload = {k: v for k, v in doc.items() if k not in _META}
        return codec.decode_record(location, version, payload)

    def _entries(self, location: str, raw: object, version: object) -> list[HistoryEntry]:
        """The entries of the write stored as ``version`` (see :func:`codec.check_write`)."""
        key = codec.write_version(location, version)
        try:
            entries = _ENTRIES.validate_python(raw)
        except ValidationError as exc:
            raise CorruptRecord(
                location, codec.history_error(key, codec._short(exc, "entries"))
            ) from exc
        return codec.check_write(location, entries, key)

    @staticmethod
    def _writes(location: str, raw: object) -> list[tuple[int, object]]:
        """``(version, entries)`` of embedded writes; a malformed list is corrupt."""
        if raw is None:
            return []
        if not isinstance(raw, list):
            raise CorruptRecord(location, "recent_history: expected a list")
        out: list[tuple[int, object]] = []
        for w in raw:
            v = w.get("version") if isinstance(w, dict) else None
            if not isinstance(v, int) or isinstance(v, bool):
                raise CorruptRecord(location, f"recent_history: malformed write {w!r:.80}")
            out.append((v, w.get("entries")))
        return out

    @staticmethod
    def _write_doc(entries: Sequence[HistoryEntry], version: int) -> list[Doc]:
        return [e.model_dump(mode="json") for e in codec.stamp(entries, version)]

    # -- records -------------------------------------------------------------------------

    def create(self, record: LocationStatus, history: Sequence[HistoryEntry]) -> LocationStatus:
        loc = record.location
        with self._io(f"create of {loc!r}"):
            if self._records.find_one({"_id": loc}, {"_id": 1}, max_time_ms=self._mt):
                raise AlreadyExists(f"location {loc!r} already exists")
            inc = self._next_incarnation(loc)
            n = int(inc["n"])
            version = max((n - 1) << _INCARNATION_SHIFT | 1, int(inc.get("floor", 1)))
            if n > 1:
                # Acknowledgements of an earlier life (a purge interrupted, a record deleted by
                # hand) name that life's ``born`` and are never read for this one (:meth:`acks`).
                # Only those of no life (written before acknowledgements carried one) are
                # deleted before the insert: an acknowledgement of a racing creator's record,
                # which carries its life, is never one of them.
                self._acks.delete_many({"location": loc, "born": {"$exists": False}})
        entries = self._write_doc(history, version)
        doc: Doc = {"_id": loc, "version": version, "born": version, **codec.record_payload(record),
                    "recent_history": [{"version": version, "entries": entries}],
                    "history_copied": version - 1}
        try:
            with self._io(f"create of {loc!r}", write=True):
                try:
                    self._records.insert_one(doc)
                except DuplicateKeyError:
                    raise AlreadyExists(f"location {loc!r} already exists") from None
        except AmbiguousCommit as exc:
            # Resolve it here: the version is unique to this attempt (one incarnation each).
            with self._io(f"re-read after create of {loc!r}"):
                found = self._records.find_one({"_id": loc}, {"version": 1, "born": 1},
                                               max_time_ms=self._mt)
            if found is None:
                raise BackendUnavailable(f"create of {loc!r} did not complete: {exc}") from exc
            if found.get("born") != version:
                raise AlreadyExists(f"location {loc!r} already exists") from None
        self._insert_history(loc, version, entries)
        if n > 1:
            # History and acknowledgements of earlier lives (a purge interrupted before its
            # last step; ``born`` already hides them from reads). Only once this life's record
            # is stored: before it, a racing creator's new record could be the one whose history
            # and acknowledgements this deletes. Best effort: the record is created, and the
            # next create of a life tries again.
            try:
                with self._io(f"clean-up of earlier lives of {loc!r}"):
                    self._history.delete_many({"location": loc, "version": {"$lt": version}})
                    self._acks.delete_many({"location": loc, "born": {"$lt": version}})
            except BackendUnavailable as exc:
                log.warning("history of earlier lives of %s left for later: %s", loc, exc)
        return record.model_copy(update={"version": version})

    def _next_incarnation(self, loc: str) -> Doc:
        """Bump and return the creation counter of ``loc`` (``{n, floor?}``).

        An upserting ``findAndModify`` with ``new: true`` always returns the document on
        MongoDB; SecantusDB returns null to the loser of two racing upserts although it
        applied the ``$inc`` (docs/mongodb.md). Bumping again then is harmless (a counter
        value is only ever used once) and gives this caller a value of its own."""
        for _ in range(5):
            inc = self._incarnations.find_one_and_update(
                {"_id": loc}, {"$inc": {"n": 1}}, upsert=True,
                return_document=ReturnDocument.AFTER, maxTimeMS=self._mt,
            )
            if inc is not None:
                return inc
        raise BackendUnavailable(
            f"MongoDB at {self.settings.where}: the creation counter of {loc!r} was not returned"
        )

    def read(self, location: str) -> LocationStatus:
        with self._io(f"read of {location!r}"):
            doc = self._records.find_one(
                {"_id": location}, {"recent_history": 0, "born": 0}, max_time_ms=self._mt
            )
        if doc is None:
            raise NotFound(f"unknown location {location!r}")
        return self._decode(doc)

    def read_all(self) -> list[LocationStatus | CorruptRecord]:
        out: list[LocationStatus | CorruptRecord] = []
        with self._io("read of every location"):
            docs = list(
                self._records.find({}, {"recent_history": 0, "born": 0}, max_time_ms=self._mt)
                .sort("_id", ASCENDING)
            )
        for doc in docs:
            try:
                out.append(self._decode(doc))
            except CorruptRecord as exc:
                out.append(exc)
        return out

    def compare_and_set(
        self, record: LocationStatus, expected_version: int, history: Sequence[HistoryEntry]
    ) -> LocationStatus:
        """One ``findAndModify`` (see the module docstring), which pushes this write into the
        embedded history and lets the oldest embedded write go only if the history collection
        is known to hold it (``history_copied``); then this write's copy to the collection, and
        every ``recent_history // 2`` writes a catch-up (:meth:`_catch_up`)."""
        loc = record.location
        version = expected_version + 1
        window = self.settings.recent_history
        entries = self._write_doc(history, version)
        update: Doc = {
            "$set": codec.record_payload(record),
            "$inc": {"version": 1},
            "$push": {"recent_history": {
                "$each": [{"version": version, "entries": entries}], "$slice": -window,
            }},
        }
        query: Doc = {
            "_id": loc, "version": expected_version,
            # every write the $slice may drop (<= version - window) is in the collection
            "history_copied": {"$gte": version - window},
        }
        for _ in range(_CATCH_UP_ATTEMPTS):
            with self._io(f"compare-and-set of {loc!r} at version {expected_version}", write=True):
                after = self._records.find_one_and_update(
                    query, update, projection={"_id": 0, "version": 1, "history_copied": 1},
                    return_document=ReturnDocument.AFTER, maxTimeMS=self._mt,
                )
            if after is not None:
                break
            landed = self._resolve_miss(loc, expected_version, history)  # or raises
            if landed is not None:
                self._insert_history(loc, version, entries)
                return landed
            # The copy lags (a writer died before copying, or a record written before the
            # watermark existed): copy now, from the embedded writes still there, and retry.
            self._catch_up(loc)
        else:
            raise BackendUnavailable(
                f"MongoDB at {self.settings.where}: the history collection of {loc!r} could not "
                f"catch up with its embedded history; compare-and-set not applied"
            )
        if after.get("version") != version:  # pragma: no cover - would be a server bug
            raise CorruptRecord(loc, f"version {after.get('version')!r} after CAS, not {version}")
        self._insert_history(loc, version, entries)
        copied = after.get("history_copied")
        if not isinstance(copied, int) or version - copied >= max(1, window // 2):
            try:
                self._catch_up(loc)
            except LocstatusError as exc:  # the write is done; a later one catches up
                log.warning("history of %s not caught up yet: %s", loc, exc)
        return record.model_copy(update={"version": version})

    def _resolve_miss(
        self, loc: str, expected: int, history: Sequence[HistoryEntry]
    ) -> LocationStatus | None:
        """The CAS matched nothing: re-read to tell a missing record from a conflict, from our
        own write applied by an earlier attempt (a driver retry: then return it), or from a
        history copy that lags (the record is still at ``expected``: return None)."""
        with self._io(f"re-read of {loc!r} after a failed compare-and-set"):
            doc = self._records.find_one(
                {"_id": loc}, {"born": 0, "recent_history": {"$slice": -1}}, max_time_ms=self._mt
            )
        if doc is None:
            raise NotFound(f"unknown location {loc!r}")
        current = doc.get("version")
        if current == expected:
            return None
        if current == expected + 1 and history:
            last = self._writes(loc, doc.pop("recent_history", None))
            if last and last[-1][0] == current:
                raw = last[-1][1]
                written = raw if isinstance(raw, list) else []
                ops = {e.get("op_id") for e in written if isinstance(e, dict)}
                if ops == {e.op_id for e in history}:
                    return self._decode(doc)
        raise VersionConflict(f"location {loc!r} is at version {current}, expected {expected}")

    def _catch_up(self, location: str) -> list[int]:
        """Copy every embedded write the history collection lacks, then raise the record's
        ``history_copied`` to the version read: every write up to it is then in the collection
        (the embedded ones were just checked, older ones left the embedded history only at or
        below an earlier ``history_copied``). Returns the versions copied. Raises
        :class:`BackendUnavailable`, :class:`CorruptRecord`."""
        with self._io(f"history catch-up of {location!r}"):
            doc = self._records.find_one(
                {"_id": location},
                {"recent_history": 1, "born": 1, "version": 1, "history_copied": 1},
                max_time_ms=self._mt,
            )
        if doc is None:
            return []
        born, version = doc.get("born"), doc.get("version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise CorruptRecord(location, f"version: expected an integer, got {version!r}")
        floor = born if isinstance(born, int) else 0
        writes = [w for w in self._writes(location, doc.get("recent_history")) if w[0] >= floor]
        missing = self._missing(location, writes)
        current = doc.get("history_copied")
        op = "$max" if isinstance(current, int) and not isinstance(current, bool) else "$set"

        def raise_to(copied_to: int) -> None:
            with self._io(f"history catch-up of {location!r}"):
                self._records.update_one(
                    {"_id": location, "born": born}, {op: {"history_copied": copied_to}}
                )

        try:
            copied = self._copy(location, missing)
        except LocstatusError:
            if missing:  # everything below the first missing write is copied: keep that much
                with contextlib.suppress(LocstatusError):
                    raise_to(min(v for v, _ in missing) - 1)
            raise
        raise_to(version)
        return copied

    def _insert_history(self, loc: str, version: int, entries: list[Doc]) -> None:
        """Copy one write to the history collection. Best effort: the embedded copy is
        authoritative, and a later write (or the check's repair) copies what a failure here
        left out, before it can leave the embedded copy (:meth:`_catch_up`)."""
        try:
            with self._io(f"history insert of {loc!r}"), contextlib.suppress(DuplicateKeyError):
                self._history.insert_one({"location": loc, "version": version, "entries": entries})
        except BackendUnavailable as exc:
            log.warning("history of %s v%s not copied yet (a later write copies it): %s",
                        loc, version, exc)

    def delete(self, location: str, expected_version: int) -> None:
        with self._io(f"delete of {location!r}"):
            # Raise the floor first: a crash after it only wastes versions, never reuses one.
            self._incarnations.update_one(
                {"_id": location}, {"$max": {"floor": expected_version + 1}}, upsert=True
            )
            res = self._records.delete_one({"_id": location, "version": expected_version})
            if res.deleted_count != 1:
                doc = self._records.find_one({"_id": location}, {"version": 1},
                                             max_time_ms=self._mt)
                if doc is None:
                    raise NotFound(f"unknown location {location!r}")
                raise VersionConflict(
                    f"location {location!r} is at version {doc.get('version')}, "
                    f"expected {expected_version}"
                )
            self._history.delete_many({"location": location, "version": {"$lte": expected_version}})
            self._acks.delete_many({"location": location})

    def history(
        self, location: str, *, limit: int = 50, before_version: int | None = None
    ) -> list[HistoryEntry]:
        upper = before_version if before_version is not None else 2**62
        with self._io(f"history of {location!r}"):
            doc = self._records.find_one(
                {"_id": location}, {"recent_history": 1, "born": 1}, max_time_ms=self._mt
            )
        if doc is None:
            return []
        born = doc.get("born", 0) if isinstance(doc.get("born"), int) else 0
        writes = [w for w in self._writes(location, doc.get("recent_history")) if w[0] >= born]
        out: list[HistoryEntry] = []
        for v, raw in sorted(writes, key=lambda w: w[0], reverse=True):
            if v < upper:
                out.extend(reversed(self._entries(location, raw, v)))
                if len(out) >= limit:
                    return out
        if any(v == born for v, _ in writes):
            # The embedded list still holds the life's first write, so it holds them all.
            # Never judged by how many it holds: the writers' ``recent_history`` decides that,
            # and it need not be this reader's.
            return out
        below = min([upper, *(v for v, _ in writes)])
        with self._io(f"history of {location!r}"):
            cursor = self._history.find(
                {"location": location, "version": {"$gte": born, "$lt": below}},
                {"_id": 0, "version": 1, "entries": 1}, max_time_ms=self._mt,
            ).sort("version", -1).batch_size(max(2, min(limit, 1000)))
            try:
                for hdoc in cursor:
                    out.extend(reversed(
                        self._entries(location, hdoc.get("entries"), hdoc.get("version"))
                    ))
                    if len(out) >= limit:
                        break
            finally:
                cursor.close()
        return out

    def history_write(self, location: str, version: int) -> list[HistoryEntry]:
        """The embedded copy when it still holds ``version`` (the authoritative one, and the
        only one after a crash between the two writes), else the history collection."""
        with self._io(f"history of {location!r}"):
            doc = self._records.find_one(
                {"_id": location}, {"recent_history": 1, "born": 1, "version": 1},
                max_time_ms=self._mt,
            )
        if doc is None:
            return []
        born = doc.get("born", 0) if isinstance(doc.get("born"), int) else 0
        current = doc.get("version")
        if version < born or (isinstance(current, int) and version > current):
            return []
        for v, raw in self._writes(location, doc.get("recent_history")):
            if v == version:
                return list(reversed(self._entries(location, raw, v)))
        with self._io(f"history of {location!r}"):
            hdoc = self._history.find_one(
                {"location": location, "version": version}, {"_id": 0, "entries": 1},
                max_time_ms=self._mt,
            )
        if hdoc is None:
            return []
        return list(reversed(self._entries(location, hdoc.get("entries"), version)))

    def history_gaps(self, location: str) -> HistoryGaps:
        """The version chain of the history collection from ``born`` to the record's version,
        counted on the unique index (one count when whole); a version it lacks is
        ``restorable`` while embedded, else ``lost``. A document without ``born`` (not made by
        this backend) has no chain to verify."""
        with self._io(f"history check of {location!r}"):
            doc = self._records.find_one(
                {"_id": location}, {"recent_history.version": 1, "born": 1, "version": 1},
                max_time_ms=self._mt,
            )
        if doc is None:
            return HistoryGaps()
        born, version = doc.get("born"), doc.get("version")
        if type(born) is not int or type(version) is not int:
            return HistoryGaps()
        span = {"location": location, "version": {"$gte": born, "$lte": version}}
        with self._io(f"history check of {location!r}"):
            if self._history.count_documents(span, maxTimeMS=self._mt) == version - born + 1:
                return HistoryGaps()
            present = {
                d.get("version")
                for d in self._history.find(span, {"_id": 0, "version": 1}, max_time_ms=self._mt)
            }
        embedded = {v for v, _ in self._writes(location, doc.get("recent_history"))}
        restorable: list[int] = []
        lost: list[int] = []
        for v in range(born, version + 1):
            if v not in present:
                kind = restorable if v in embedded else lost
                if len(kind) < GAPS_LISTED:
                    kind.append(v)
                elif len(restorable) >= GAPS_LISTED and len(lost) >= GAPS_LISTED:
                    break
        return HistoryGaps(tuple(restorable), tuple(lost))

    def restore_history(self, location: str) -> list[int]:
        return self._catch_up(location)

    def _missing(self, location: str, writes: list[tuple[int, object]]) -> list[tuple[int, object]]:
        if not writes:
            return []
        with self._io(f"history check of {location!r}"):
            have = {
                d["version"] for d in self._history.find(
                    {"location": location, "version": {"$in": [v for v, _ in writes]}},
                    {"_id": 0, "version": 1}, max_time_ms=self._mt,
                )
            }
        return [w for w in writes if w[0] not in have]

    def _copy(self, location: str, writes: list[tuple[int, object]]) -> list[int]:
        """Insert ``writes`` into the history collection (duplicates, copied by another process
        meanwhile, are skipped). Returns the versions this call inserted, sorted."""
        if not writes:
            return []
        docs = [{"location": location, "version": v, "entries": e} for v, e in writes]
        skipped: set[int] = set()
        try:
            with self._io(f"history copy of {location!r}"):
                self._history.insert_many(docs, ordered=False)
        except BackendUnavailable as exc:
            errors = (
                exc.__cause__.details.get("writeErrors", [])
                if isinstance(exc.__cause__, BulkWriteError) else None
            )
            if errors is None or any(e.get("code") != 11000 for e in errors):
                raise
            skipped = {int(e["index"]) for e in errors}
        copied = sorted(w[0] for i, w in enumerate(writes) if i not in skipped)
        if copied:
            log.info("copied %d history writes of %s to the collection", len(copied), location)
        return copied

    # -- workers, leases and acknowledgements ----------------------------------------------

    def put_worker(self, info: WorkerInfo) -> None:
        stored, _ = codec.bounded_worker(info)  # errors trimmed; InvalidInput if too large
        doc: Doc = {
            "_id": info.worker_id,
            "info": stored.model_dump(mode="json", exclude=codec.WORKER_NOT_STORED),
        }
        if info.lease_expires_at is not None:
            doc["expires_at"] = info.lease_expires_at
        with self._io(f"registration of worker {info.worker_id!r}"):
            self._workers.replace_one({"_id": info.worker_id}, doc, upsert=True)

    def remove_worker(self, worker_id: str, *, if_expires: datetime | None = None) -> bool:
        """See :meth:`Backend.remove_worker`. With ``if_expires``: read the registration, and
        delete it only while its whole stored document is still the one read (a renewal or a
        new registration rewrites it); the acknowledgements go in a second request, so a
        worker registering again in between may lose acknowledgements it wrote then: a live
        worker missing an acknowledgement is waited for (safe), never settled without."""
        with self._io(f"removal of worker {worker_id!r}"):
            if if_expires is None:
                removed = self._workers.delete_one({"_id": worker_id}).deleted_count > 0
            else:
                doc = self._workers.find_one({"_id": worker_id}, max_time_ms=self._mt)
                if doc is None or not codec.is_registration(worker_id, doc.get("info"), if_expires):
                    return False
                removed = self._workers.delete_one(
                    {"_id": worker_id, "info": doc.get("info")}
                ).deleted_count > 0
                if not removed:
                    return False  # rewritten since it was read: renewed or registered again
            self._acks.delete_many({"worker_id": worker_id})
        return removed

    def workers(self) -> list[WorkerInfo]:
        with self._io("read of workers"):
            docs = list(self._workers.find({}, max_time_ms=self._mt).sort("_id", ASCENDING))
        # An unreadable document is listed as the live worker it may be, never left out and
        # never an error hiding the others (codec.corrupt_worker).
        return [codec.decode_worker(str(doc.get("_id")), doc.get("info")) for doc in docs]

    def ack(
        self,
        worker_id: str,
        location: str,
        service: str,
        generation: int,
        *,
        if_version: int | None = None,
    ) -> None:
        """Read the record (its version for ``if_version``, and its life), then write the
        acknowledgement stamped with that life (``born``): an acknowledgement read for another
        life of the record never counts (:meth:`acks`). One of a record that does not exist is
        dropped, as on ZooKeeper."""
        with self._io(f"read of {location!r}"):
            doc = self._records.find_one(
                {"_id": location}, {"version": 1, "born": 1}, max_time_ms=self._mt
            )
        if if_version is not None and (doc is None or doc.get("version") != if_version):
            raise stale_ack(location, if_version)
        if doc is None:
            return
        ack: Doc = {"location": location, "worker_id": worker_id, "service": service,
                    "generation": generation}
        if _is_int(doc.get("born")):
            ack["born"] = doc["born"]
        with self._io(f"ack of {location!r}/{service} by {worker_id!r}"):
            self._acks.replace_one(
                {"_id": f"{location}/{worker_id}/{service}"}, ack, upsert=True
            )

    def acks(self, location: str) -> AckMap:
        """The acknowledgements of the record's current life: the record's ``born`` is read
        first, and one stamped with another life is left out (an earlier life's, left by an
        interrupted purge or a record deleted by hand; one written just after a purge by a
        worker that read the record before it). One with no life (written before
        acknowledgements carried one) counts, as it always did."""
        with self._io(f"read of acks of {location!r}"):
            rec = self._records.find_one({"_id": location}, {"born": 1}, max_time_ms=self._mt)
            docs = list(self._acks.find({"location": location}, {"_id": 0},
                                        max_time_ms=self._mt))
        if rec is None:
            return {}
        out: AckMap = {}
        for d in docs:
            key = _ack_key(d, rec.get("born"))
            if key is not None:
                out.setdefault(key[1], {})[key[2]] = key[3]
        return out

    def all_acks(self) -> dict[str, AckMap]:
        """:meth:`acks` of every record (two reads: every record's ``born``, every ack)."""
        with self._io("read of every ack"):
            born = {
                d["_id"]: d.get("born")
                for d in self._records.find({}, {"born": 1}, max_time_ms=self._mt)
            }
            docs = list(self._acks.find({}, {"_id": 0}, max_time_ms=self._mt))
        out: dict[str, AckMap] = {}
        for d in docs:
            location = d.get("location")
            if location not in born:
                continue
            key = _ack_key(d, born[location])
            if key is not None:
                out.setdefault(key[0], {}).setdefault(key[1], {})[key[2]] = key[3]
        return out

    # -- hints -----------------------------------------------------------------------------

    def subscribe(
        self, callback: HintCallback, *, kinds: cabc.Collection[str] | None = None
    ) -> Unsubscribe:
        if self._closed:
            raise BackendUnavailable(f"MongoDB backend {self.settings.where} is closed")
        with self._sub_lock:
            self._subscribers.append(callback)
            if self._watcher is None:
                self._watcher = threading.Thread(
                    target=self._watch, name="locstatus-mongo-hints", daemon=True
                )
                self._watcher.start()
        # Return once hints are armed, so a write right after subscribe() is seen (bounded:
        # with the server down the watcher keeps trying and a resync follows the reconnect).
        self._armed.wait(timeout=min(2.0, self.settings.server_selection_timeout))

        def unsubscribe() -> None:
            with self._sub_lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    def _emit(self, hint: Hint) -> None:
        if self._stop.is_set():
            return  # closed: a watcher still winding down delivers nothing more
        with self._sub_lock:
            subscribers = list(self._subscribers)
        for cb in subscribers:
            try:
                cb(hint)
            except Exception:  # a subscriber's bug must not stop the hints of the others
                log.exception("hint callback failed for %s", hint)

    def _use_change_streams(self) -> bool:
        if self.settings.hints != "auto":
            return self.settings.hints == "changestream"
        hello = self._client.admin.command("hello", maxTimeMS=self._mt)
        return "setName" in hello or hello.get("msg") == "isdbgrid"

    def _watch(self) -> None:
        """The hint thread: a change stream (or a poller) until :meth:`close`. Any failure
        is retried with a bounded backoff; the first success after a failure emits ``resync``."""
        token: Mapping[str, Any] | None = None
        failed = False
        backoff = 0.1
        stream_mode: bool | None = None
        while not self._stop.is_set():
            try:
                if stream_mode is None:
                    stream_mode = self._use_change_streams()
                self.hint_mode = "changestream" if stream_mode else "poll"
                if stream_mode:
                    token = self._stream(token, failed)
                else:
                    self._poll(failed)
                failed = False
            except OperationFailure as exc:
                if exc.code in _NO_CHANGE_STREAMS_CODES and self.settings.hints == "auto":
                    stream_mode = False
                elif exc.code in _STREAM_LOST_CODES:
                    token = None  # the resume point is gone: start afresh, after a resync
                    failed = True
                else:
                    failed = True
                    log.warning("MongoDB hints: %s; retrying", _short(exc))
            except PyMongoError as exc:
                failed = True
                log.info("MongoDB hints interrupted (%s); reconnecting", _short(exc, 120))
            if failed:
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            else:
                backoff = 0.1

    def _stream(self, token: Mapping[str, Any] | None, failed: bool) -> Mapping[str, Any] | None:
        colls = [self._records.name, self._acks.name, self._workers.name]
        pipeline: list[Doc] = [
            {"$match": {"$or": [
                {"ns.coll": {"$in": colls}},
                {"operationType": {"$in": ["dropDatabase", "invalidate"]}},
            ]}},
            {"$project": {"operationType": 1, "ns": 1, "documentKey": 1}},
        ]
        with self._db.watch(pipeline, resume_after=token, max_await_time_ms=500) as stream:
            self._armed.set()
            if failed or token is not None:
                self._emit(Hint(kind="resync"))
            while not self._stop.is_set():
                change = stream.try_next()
                token = stream.resume_token or token
                if change is None:
                    continue
                hint = self._hint_of(change)
                if hint is None:
                    return None  # invalidated (database dropped): reopen afresh
                self._emit(hint)
        return token

    def _hint_of(self, change: Mapping[str, Any]) -> Hint | None:
        op = change.get("operationType")
        if op in ("invalidate", "dropDatabase"):
            self._emit(Hint(kind="resync"))
            return None
        if op in ("drop", "rename"):
            return Hint(kind="resync")
        coll = (change.get("ns") or {}).get("coll")
        key = str((change.get("documentKey") or {}).get("_id", ""))
        if coll == self._records.name:
            return Hint(kind="location", location=key)
        if coll == self._acks.name:
            return Hint(kind="acks", location=key.split("/", 1)[0])
        return Hint(kind="workers")

    def _snapshot(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        mt = self._mt
        locs = {d["_id"]: d.get("version")
                for d in self._records.find({}, {"version": 1}, max_time_ms=mt)}
        workers = {d["_id"]: d.get("info") for d in self._workers.find({}, max_time_ms=mt)}
        acks = {d["_id"]: d.get("generation")
                for d in self._acks.find({}, {"generation": 1}, max_time_ms=mt)}
        return locs, workers, acks

    def _poll(self, failed: bool) -> None:
        before = self._snapshot()
        self._armed.set()
        if failed:
            self._emit(Hint(kind="resync"))
        while not self._stop.wait(self.settings.poll_interval):
            after = self._snapshot()
            old_locs, old_workers, old_acks = before
            new_locs, new_workers, new_acks = after
            for loc in sorted(set(old_locs) | set(new_locs)):
                if old_locs.get(loc) != new_locs.get(loc):
                    self._emit(Hint(kind="location", location=str(loc)))
            if old_workers != new_workers:
                self._emit(Hint(kind="workers"))
            changed = {str(k).split("/", 1)[0] for k in set(old_acks) | set(new_acks)
                       if old_acks.get(k) != new_acks.get(k)}
            for loc in sorted(changed):
                self._emit(Hint(kind="acks", location=loc))
            before = after

    # -- lifecycle -----------------------------------------------------------------------

    def probe_time(self) -> datetime:
        """The server's time: ``localTime`` of its ``hello`` reply (milliseconds; on a replica
        set the primary's clock, the one its TTL monitor expires worker documents by;
        docs/time.md)."""
        with self._io("read of the server's time"):
            hello = self._client.admin.command("hello", maxTimeMS=self._mt)
        at = hello.get("localTime")
        if not isinstance(at, datetime):
            raise BackendUnavailable(
                f"MongoDB at {self.settings.where} answered hello without its localTime "
                f"({type(at).__name__}): cannot read its time"
            )
        # command() decodes with the driver's default codec options: a BSON date, which is
        # always UTC, comes back naive
        return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)

    def ping(self) -> None:
        with self._io("ping"):
            self._client.admin.command("ping", maxTimeMS=self._mt)

    def close(self) -> None:
        """Stop the hints and close the client. Returns within :data:`_CLOSE_WAIT` seconds
        even while the server is down or frozen (a process shutting down during an outage
        must not hang on it): whatever of the driver's close is left then (ending its server
        sessions, which needs the server) goes on in the background, bounded by
        :data:`_CLOSE_TIMEOUT`. Once closed, every call raises :class:`BackendUnavailable`
        and no hint is delivered."""
        if self._closed:
            return
        self._stop.set()
        self._closed = True
        # The driver's close() first sends endSessions, which selects a server: with none
        # reachable that waits out the operation timeout (in the driver's 0.5 s steps, so 0.5
        # to 1 s for _CLOSE_TIMEOUT), and on a frozen server the command waits for a reply.
        # The driver ignores that command's errors anyway; close() does not wait for them.
        closing = threading.Thread(
            target=self._close_client, name="locstatus-mongo-close", daemon=True
        )
        closing.start()
        closing.join(_CLOSE_WAIT)
        # The hint thread is not waited for either: it ends at its next step (a change
        # stream's getMore returns within its maxAwaitTimeMS of 0.5 s, a server selection
        # within 0.5 s of the client's close, a request to a frozen server at the socket
        # timeout), and _emit drops whatever it still sees.

    def _close_client(self) -> None:
        with contextlib.suppress(PyMongoError), pymongo.timeout(_CLOSE_TIMEOUT):
            self._client.close()


__all__ = ["MongoBackend", "MongoSettings", "parse_mongo_url"]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ack_key(doc: Mapping[str, Any], life: object) -> tuple[str, str, str, int] | None:
    """``(location, worker_id, service, generation)`` of an acknowledgement document of the
    record life ``life`` (the record's ``born``), or None: stamped with another life, or a
    field missing or of the wrong type (a hand edit: an unreadable acknowledgement acknowledges
    nothing, contract invariant 6, and never hides the others)."""
    if "born" in doc and _is_int(life) and doc["born"] != life:
        return None  # another life of the record
    location, worker, service = doc.get("location"), doc.get("worker_id"), doc.get("service")
    gen = codec.ack_generation(doc.get("generation"))
    if (
        isinstance(location, str) and isinstance(worker, str) and isinstance(service, str)
        and gen is not None
    ):
        return location, worker, service, gen
    log.warning("ignoring an unreadable acknowledgement: %r", dict(doc))
    return None
