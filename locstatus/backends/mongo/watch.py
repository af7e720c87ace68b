"""Change hints from MongoDB: a change stream where the server has one, polling otherwise
(docs/mongodb.md, "Change hints").

Why it is shaped so: a change stream on the database (resume token kept across reconnects,
``$project`` keeps events small) needs a replica set or mongos; a standalone server (and
SecantusDB) is polled instead, by ``{_id, version}`` snapshots every ``poll_interval`` seconds.
``hints=auto`` asks the server which (``hello``), ``changestream`` or ``poll`` force one. After
any reconnect or lost stream a ``resync`` hint asks for a full re-read (docs/design.md §3.4).
One thread per backend, started by the first subscriber, retried with a bounded backoff on any
failure; delivery goes through :class:`~locstatus.backends.hints.Subscribers` (a subscriber
that raises is logged, never the thread's end), and nothing is delivered once closed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from pymongo.errors import OperationFailure, PyMongoError

from locstatus.backends.base import HintCallback, Unsubscribe
from locstatus.backends.hints import Subscribers
from locstatus.backends.mongo.store import Doc, Store, short
from locstatus.models import Hint

log = logging.getLogger(__name__)

_STREAM_LOST_CODES = {136, 260, 280, 286}  # capped position lost, bad token, fatal, history lost
_NO_CHANGE_STREAMS_CODES = {40573}  # "$changeStream stage is only supported on replica sets"


class Watcher:
    """The hint thread of one :class:`~locstatus.backends.mongo.store.Store` and its
    subscribers. ``mode`` is ``changestream`` or ``poll`` once hints are armed."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.subscribers = Subscribers(store.where)
        self.mode: str | None = None
        self.armed = threading.Event()
        """Set once the stream is open or the first snapshot taken."""
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def subscribe(self, callback: HintCallback) -> Unsubscribe:
        """Deliver every hint to ``callback``; start the thread with the first subscriber.
        Returns once hints are armed, so a write right after it is seen (bounded: with the
        server down the thread keeps trying and a resync follows the reconnect)."""
        unsubscribe = self.subscribers.add(callback)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="locstatus-mongo-hints", daemon=True
                )
                self._thread.start()
        self.armed.wait(timeout=min(2.0, self.store.settings.server_selection_timeout))
        return unsubscribe

    def stop(self) -> None:
        """Deliver nothing more. Not waited for: the thread ends at its next step (a change
        stream's getMore returns within its maxAwaitTimeMS of 0.5 s, a server selection within
        0.5 s of the client's close, a request to a frozen server at the socket timeout)."""
        self._stop.set()
        self.subscribers.close()

    def _emit(self, hint: Hint) -> None:
        self.subscribers.emit(hint)

    def _use_change_streams(self) -> bool:
        if self.store.settings.hints != "auto":
            return self.store.settings.hints == "changestream"
        hello = self.store.client.admin.command("hello", maxTimeMS=self.store.mt)
        return "setName" in hello or hello.get("msg") == "isdbgrid"

    def _run(self) -> None:
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
                self.mode = "changestream" if stream_mode else "poll"
                if stream_mode:
                    token = self._stream(token, failed)
                else:
                    self._poll(failed)
                failed = False
            except OperationFailure as exc:
                if exc.code in _NO_CHANGE_STREAMS_CODES and self.store.settings.hints == "auto":
                    stream_mode = False
                elif exc.code in _STREAM_LOST_CODES:
                    token = None  # the resume point is gone: start afresh, after a resync
                    failed = True
                else:
                    failed = True
                    log.warning("MongoDB hints: %s; retrying", short(exc))
            except PyMongoError as exc:
                failed = True
                log.info("MongoDB hints interrupted (%s); reconnecting", short(exc, 120))
            if failed:
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            else:
                backoff = 0.1

    def _stream(self, token: Mapping[str, Any] | None, failed: bool) -> Mapping[str, Any] | None:
        colls = [self.store.records.name, self.store.acks.name, self.store.workers.name]
        pipeline: list[Doc] = [
            {"$match": {"$or": [
                {"ns.coll": {"$in": colls}},
                {"operationType": {"$in": ["dropDatabase", "invalidate"]}},
            ]}},
            {"$project": {"operationType": 1, "ns": 1, "documentKey": 1}},
        ]
        with self.store.db.watch(pipeline, resume_after=token, max_await_time_ms=500) as stream:
            self.armed.set()
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
        if coll == self.store.records.name:
            return Hint(kind="location", location=key)
        if coll == self.store.acks.name:
            return Hint(kind="acks", location=key.split("/", 1)[0])
        return Hint(kind="workers")

    def _snapshot(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        mt = self.store.mt
        locs = {d["_id"]: d.get("version")
                for d in self.store.records.find({}, {"version": 1}, max_time_ms=mt)}
        workers = {d["_id"]: d.get("info") for d in self.store.workers.find({}, max_time_ms=mt)}
        acks = {d["_id"]: d.get("generation")
                for d in self.store.acks.find({}, {"generation": 1}, max_time_ms=mt)}
        return locs, workers, acks

    def _poll(self, failed: bool) -> None:
        before = self._snapshot()
        self.armed.set()
        if failed:
            self._emit(Hint(kind="resync"))
        while not self._stop.wait(self.store.settings.poll_interval):
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
