"""The MongoDB client, the collections locstatus keeps, and the one edge where pymongo's errors
become locstatus errors (:meth:`Store.io`).

Why it is shaped so (httpx's ``map_httpcore_exceptions``, and ZooKeeper's ``ZkClient``): what a
driver error means depends on what was sent, and deciding it in every call drifts. Here, once:
nothing sent (no server selected, a document the driver refuses to encode) is
:class:`BackendUnavailable` or :class:`InvalidInput`; a single write whose answer was lost
(``write=True``) is :class:`AmbiguousCommit`, resolved by the manager (docs/design.md §3.2);
any other failure is :class:`BackendUnavailable` naming the server and the operation.

The collections, all named after ``collection`` (docs/mongodb.md): the records, ``_history``
(one document per write), ``_workers`` (heartbeat documents under a TTL index), ``_acks`` and
``_incarnations`` (creation counters and purge floors).

One deadline per backend call (:meth:`Store.deadline`, the URL's ``timeoutMS``): the driver's
retries, server selection and connection set-up of every operation the call sends share it
(``pymongo.timeout``, nested blocks only shorten it), so a call against a server frozen by
SIGSTOP fails within it; each command's ``maxTimeMS`` is then what is left of it (docs/mongodb.md,
"Timeouts"). Indexes are created at start,
idempotently (same name and options: a no-op); a changed ``worker_ttl`` is applied with
``collMod``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import pymongo
from bson.errors import InvalidDocument
from pymongo import ASCENDING, IndexModel, MongoClient
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import (
    AutoReconnect,
    ConfigurationError,
    DocumentTooLarge,
    ExecutionTimeout,
    InvalidOperation,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
    WriteConcernError,
    WTimeoutError,
)
from pymongo.monitoring import (
    ServerHeartbeatFailedEvent,
    ServerHeartbeatListener,
    ServerHeartbeatStartedEvent,
    ServerHeartbeatSucceededEvent,
)

from locstatus.backends.base import DOWN_GRACE
from locstatus.backends.mongo.url import MongoSettings
from locstatus.backends.urls import redact_url
from locstatus.errors import AmbiguousCommit, BackendUnavailable, InvalidInput

Doc = dict[str, Any]

_INDEX_OPTIONS_CONFLICT = {85, 86}
CLOSE_TIMEOUT = 0.5
"""Seconds the driver may spend ending its server sessions when the backend closes."""
_CALL_ENDS: ContextVar[float | None] = ContextVar("locstatus_mongo_call_ends", default=None)
"""Monotonic time the current backend call's deadline ends (:meth:`Store.deadline`), if any."""


class _Heartbeats(ServerHeartbeatListener):
    """Whether the driver's last check of some server failed (its monitor's heartbeat), as
    opposed to a request's connection that broke: what makes the backend "known down"."""

    def __init__(self) -> None:
        self._failed: set[tuple[str, int | None]] = set()

    @property
    def failing(self) -> bool:
        return bool(self._failed)

    def started(self, event: ServerHeartbeatStartedEvent) -> None:
        pass

    def succeeded(self, event: ServerHeartbeatSucceededEvent) -> None:
        self._failed.discard(event.connection_id)

    def failed(self, event: ServerHeartbeatFailedEvent) -> None:
        self._failed.add(event.connection_id)


def short(exc: BaseException, limit: int = 300) -> str:
    """A driver error's message without pymongo's appended details, at most ``limit`` chars."""
    text = str(exc).split(", full error:")[0].split(", Timeout:")[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Store:
    """One pymongo client and the collections of one ``mongodb://`` URL.

    Usage::

        store = Store(parse_mongo_url(url), url)
        with store.io(f"read of {loc!r}"):
            doc = store.records.find_one({"_id": loc}, max_time_ms=store.mt)

    Raises :class:`InvalidInput` when pymongo refuses the URL's options.
    """

    def __init__(self, settings: MongoSettings, url: str) -> None:
        self.settings = s = settings
        self.heartbeats = _Heartbeats()
        try:
            self.client: MongoClient[Doc] = MongoClient(
                s.client_url, tz_aware=True, connect=False,
                event_listeners=[self.heartbeats], **s.client_options,
            )
        except (ConfigurationError, ValueError, TypeError) as exc:
            raise InvalidInput(f"invalid MongoDB URL {redact_url(url)}: {short(exc)}") from None
        self.closed = False
        self.reached = False
        """A server answered once (the indexes were created): losing it is "known down"."""
        self._down_seen: tuple[float, str] | None = None  # (monotonic, why) of a failed ping
        self.db: Database[Doc] = self.client[s.database]
        self.records: Collection[Doc] = self.db[s.collection]
        self.history: Collection[Doc] = self.db[f"{s.collection}_history"]
        self.workers: Collection[Doc] = self.db[f"{s.collection}_workers"]
        self.acks: Collection[Doc] = self.db[f"{s.collection}_acks"]
        self.incarnations: Collection[Doc] = self.db[f"{s.collection}_incarnations"]

    @property
    def mt(self) -> int:
        """``maxTimeMS`` of every read and ``findAndModify``."""
        return self.settings.max_time_ms

    @contextmanager
    def deadline(self) -> Iterator[None]:
        """The one deadline of a backend call: :attr:`MongoSettings.call_timeout` seconds from
        now for everything sent inside the block (``pymongo.timeout``; inside an enclosing
        block, the earlier of the two deadlines). Usage::

            with store.deadline():
                ...  # every store.io(...) of one backend call
        """
        ends = time.monotonic() + self.settings.call_timeout
        outer = _CALL_ENDS.get()
        token = _CALL_ENDS.set(ends if outer is None else min(outer, ends))
        try:
            with pymongo.timeout(self.settings.call_timeout):
                yield
        finally:
            _CALL_ENDS.reset(token)

    def _ran_out(self, exc: PyMongoError) -> str:
        """``"; the call's deadline of 2s (timeoutMS) ran out"`` when ``exc`` is the driver
        giving up at the deadline of :meth:`deadline`, else ``""`` (for messages)."""
        ends = _CALL_ENDS.get()
        if exc.timeout and ends is not None and time.monotonic() >= ends:
            return f"; the call's deadline of {self.settings.call_timeout:g}s (timeoutMS) ran out"
        return ""

    @property
    def where(self) -> str:
        """The hosts, without credentials, for messages."""
        return self.settings.where

    @contextmanager
    def io(self, what: str, *, write: bool = False) -> Iterator[None]:
        """Turn pymongo errors into locstatus errors. ``write=True``: the operation is a
        single write whose outcome is unknown after a network error (:class:`AmbiguousCommit`).
        A document the driver refuses to encode (``DocumentTooLarge``, ``InvalidDocument``, an
        integer beyond BSON's 8 bytes) was never sent: :class:`InvalidInput` naming ``what``."""
        if self.closed:
            raise BackendUnavailable(f"MongoDB backend {self.settings.where} is closed")
        self.fail_fast(what)
        try:
            yield
        except DocumentTooLarge as exc:  # refused by the driver: nothing was sent
            raise InvalidInput(
                f"{what}: the document is too large for MongoDB ({short(exc)}; a document "
                "holds at most 16 MB); nothing was written"
            ) from exc
        except (InvalidDocument, OverflowError) as exc:  # BSON cannot encode it: nothing sent
            raise InvalidInput(
                f"{what}: MongoDB cannot store the document ({type(exc).__name__}: "
                f"{short(exc)}); nothing was written"
            ) from exc
        except ServerSelectionTimeoutError as exc:  # nothing was sent
            within = min(self.settings.server_selection_timeout, self.settings.call_timeout)
            raise BackendUnavailable(
                f"MongoDB at {self.settings.where} is unreachable ({what}): no server answered "
                f"within {within:g}s (serverSelectionTimeoutMS, timeoutMS); is mongod running? "
                f"[{short(exc, 200)}]"
            ) from exc
        except ExecutionTimeout as exc:
            budget = f"maxTimeMS={self.mt}{self._ran_out(exc)}"
            if write:
                raise AmbiguousCommit(
                    f"MongoDB at {self.settings.where}: {what} exceeded {budget}; outcome unknown"
                ) from exc
            raise BackendUnavailable(
                f"MongoDB at {self.settings.where}: {what} exceeded {budget} "
                f"(ExecutionTimeout: {short(exc)})"
            ) from exc
        except (AutoReconnect, WriteConcernError, WTimeoutError) as exc:
            if write:
                raise AmbiguousCommit(
                    f"MongoDB at {self.settings.where}: outcome of {what} unknown "
                    f"({type(exc).__name__}: {short(exc)}{self._ran_out(exc)})"
                ) from exc
            raise BackendUnavailable(
                f"MongoDB at {self.settings.where} failed during {what} "
                f"({type(exc).__name__}: {short(exc)}{self._ran_out(exc)})"
            ) from exc
        except InvalidOperation as exc:
            raise BackendUnavailable(
                f"MongoDB backend {self.settings.where} is closed ({what}): {short(exc)}"
            ) from exc
        except OperationFailure as exc:
            raise BackendUnavailable(
                f"MongoDB at {self.settings.where} refused {what}: {short(exc)} "
                f"(code {exc.code})"
            ) from exc
        except PyMongoError as exc:
            raise BackendUnavailable(
                f"MongoDB at {self.settings.where} failed during {what} "
                f"({type(exc).__name__}: {short(exc)})"
            ) from exc


    def ensure_indexes(self) -> None:
        """Create the indexes (idempotent: same name and options is a no-op). Index builds
        get at least 60 s whatever ``maxTimeMS`` says."""
        ttl = self.settings.worker_ttl
        mt = max(self.mt, 60_000)
        with self.io("creating indexes"):
            self.history.create_indexes(
                [IndexModel([("location", ASCENDING), ("version", ASCENDING)],
                            name="location_version", unique=True)],
                maxTimeMS=mt,
            )
            self.acks.create_indexes(
                [IndexModel([("location", ASCENDING)], name="location"),
                 IndexModel([("worker_id", ASCENDING)], name="worker_id")],
                maxTimeMS=mt,
            )
            try:
                self.workers.create_indexes(
                    [IndexModel([("expires_at", ASCENDING)], name="expires_at_ttl",
                                expireAfterSeconds=ttl)],
                    maxTimeMS=mt,
                )
            except OperationFailure as exc:
                if exc.code not in _INDEX_OPTIONS_CONFLICT:
                    raise
                self.db.command(
                    "collMod", self.workers.name,
                    index={"name": "expires_at_ttl", "expireAfterSeconds": ttl},
                    maxTimeMS=mt,
                )
        self.reached = True  # from now on, no selectable server means "known down"

    def fail_fast(self, what: str) -> None:
        """While the backend is known down (once a server was reached, the driver's own check
        of a server failed since its last success, and it knows no selectable server: a server
        that went down, a replica set without a primary), make sure one answers within
        :data:`DOWN_GRACE` seconds before the operation waits out ``serverSelectionTimeoutMS``;
        the ping's server selection asks the driver to check every server now, so the first
        call after the server is back finds it. A second call within the grace of a failed
        ping fails without one. A request whose connection broke (a lost answer) is no
        outage until the driver's check fails too: the op_id lookup after an ambiguous write
        still waits for the server as before (docs/design.md §3.2). Raises
        :class:`BackendUnavailable`, nothing sent (docs/reliability.md, "Failing fast while
        the backend is down")."""
        if not self.reached or not self.heartbeats.failing:
            return
        if self.client.topology_description.has_writable_server():
            return
        failed = self._down_seen
        if failed is not None and time.monotonic() - failed[0] < DOWN_GRACE:
            raise BackendUnavailable(self._down_message(what, failed[1]))  # asked just now
        try:
            # the driver's server selection waits in steps of 0.5 s whatever its budget: half
            # the grace still asks for one check of every server, and answers within it
            with pymongo.timeout(DOWN_GRACE / 2):
                self.client.admin.command("ping")
        except PyMongoError as exc:
            self._down_seen = (time.monotonic(), short(exc, 200))
            raise BackendUnavailable(self._down_message(what, self._down_seen[1])) from exc
        self._down_seen = None

    def _down_message(self, what: str, why: str) -> str:
        return (
            f"MongoDB at {self.settings.where} is unreachable ({what}): no server selectable, "
            f"none answered within {DOWN_GRACE:g}s; is mongod running? [{why}]"
        )

    def close_client(self) -> None:
        """Close the driver's client (bounded by :data:`CLOSE_TIMEOUT`; errors ignored)."""
        with contextlib.suppress(PyMongoError), pymongo.timeout(CLOSE_TIMEOUT):
            self.client.close()
