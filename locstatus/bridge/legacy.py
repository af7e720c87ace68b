"""The Backbeat side of the bridge: the processors' Redis channels, their ZooKeeper state nodes,
and lifecycle's ``__locationStatusStore`` documents (docs/backbeat.md, "2. The bridge").

Why it is shaped so: Backbeat's processors are fire-and-forget listeners (a message published
while one is down or disconnected is lost) and its state stores are written without versions
(a read, then an unversioned write). So nothing here trusts a message to arrive or a cache to
be current: the publisher only reports whether a publish reached Redis (and how many
subscribers), the state nodes are watched (hints) and read again on demand and after every
reconnection, and the lifecycle write is guarded by a filter on the value it replaces, never a
``$set`` of the whole document (Backbeat's own API server writes the whole document; a blind
write from here would undo its other services).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from locstatus.backbeat_state import (
    DOCUMENT_KEYS,
    STATUS_COLLECTION,
    LegacyState,
    parse_node,
    parse_state,
    redact_url,
)
from locstatus.errors import BackendUnavailable, InvalidInput
from locstatus.importers.backbeat import mongo_reason

log = logging.getLogger("locstatus.bridge")

QUICK_TIMEOUT = 1.0
"""Seconds MongoDB may take to answer the ping before a read of the lifecycle documents once
the previous read failed."""

PAUSE = "pauseService"
RESUME = "resumeService"
CANCEL = "deleteScheduledResumeService"


@dataclass(frozen=True)
class NodeState:
    """What a state node holds: its state, or why none (``missing``: no node yet, ``error``:
    it does not parse), and which write of the node it is: ``version`` (ZooKeeper's data
    version, one more per write) and ``mzxid`` (the transaction of its last write), -1 for a
    missing node. The bridge counts the writes made after it published an order
    (docs/backbeat.md, "2. The bridge")."""

    state: LegacyState | None = None
    missing: bool = False
    error: str | None = None
    version: int = -1
    mzxid: int = -1

    def describe(self) -> str:
        if self.missing:
            return "its state node does not exist (the processor never started?)"
        if self.error is not None:
            return f"its state node does not parse: {self.error}"
        assert self.state is not None
        at = self.state.scheduled_resume
        return (f"its state node says paused: {str(self.state.paused).lower()}"
                + (f", scheduledResume: {at.isoformat()}" if at is not None else ""))


def agrees(node: NodeState | None, paused: bool) -> bool:
    """True when the node says the processor applied ``paused``: paused with no timer of its
    own armed (it would resume by itself), or running. No node at all agrees with running: a
    processor that starts without one creates it as ``{"paused": false}`` and runs."""
    if node is not None and node.missing:
        return not paused
    if node is None or node.state is None:
        return False
    if paused:
        return node.state.paused and node.state.scheduled_resume is None
    return not node.state.paused


def action_for(node: NodeState | None, paused: bool) -> str:
    """The message that moves the processor toward ``paused`` from what ``node`` says."""
    if paused:
        if node is not None and node.state is not None and node.state.paused:
            return CANCEL  # paused, but its own timer is armed: disarm it
        return PAUSE
    return RESUME


def message(action: str) -> str:
    """A message as Backbeat's API publishes it, never with a ``date``: a scheduled resume is
    locstatus data and is published as a plain resume when due (a date would arm the
    processor's own in-process timer)."""
    return json.dumps({"action": action})


@dataclass(frozen=True)
class Delivery:
    """What one ``PUBLISH`` did: ``count`` subscribers received the message (Redis's answer),
    and ``connections`` lists every subscriber connection open at that instant (``id@addr``),
    among them the ones that received it. A message Redis handed to a connection is only lost
    if that connection closes before its reader read it (docs/backbeat.md "What the bridge
    guarantees"): while each of them is still open, it was not lost."""

    count: int
    connections: frozenset[str]


def _connections(listing: Any) -> frozenset[str]:
    """``id@addr`` of each subscriber connection of a parsed ``CLIENT LIST`` (an id alone
    repeats after a Redis restart; with its address it does not, in practice)."""
    return frozenset(f"{c.get('id')}@{c.get('addr')}" for c in listing
                     if isinstance(c, dict))


def _redis_error(exc: BaseException) -> str:
    """What a failed exchange with Redis says, with a refused AUTH named as such: redis-py
    reports a missing password as HELLO's own words, and a wrong one as ``WRONGPASS``."""
    text = str(exc) or type(exc).__name__
    if "WRONGPASS" in text or "invalid password" in text or "invalid username-password" in text:
        return f"it refused the password (WRONGPASS: check redis.password): {text}"
    if "NOAUTH" in text or "already authenticated" in text or "Authentication required" in text:
        return f"it requires a password (NOAUTH: give redis.password): {text}"
    return text


class Publisher:
    """Publishes on Backbeat's Redis (redis-py). ``publish`` returns its :class:`Delivery` (the
    subscribers that received the message, the subscriber connections open then), or None when
    Redis could not be reached; ``healthy`` says
    whether the last exchange worked; :meth:`probe` pings and returns True on the transition
    back to healthy (the caller resyncs everything then)."""

    def __init__(self, url: str, timeout: float = 2.0, password: str | None = None) -> None:
        import redis

        try:
            self._redis = redis.Redis.from_url(
                url, socket_timeout=timeout, socket_connect_timeout=timeout,
                **({"password": password} if password else {}),
            )
        except ValueError as exc:  # a port out of range, a scheme redis-py does not know
            raise InvalidInput(f"Backbeat's Redis {redact_url(url)!r}: {exc}") from None
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self.url = redact_url(url)
        self.healthy = False
        self.error: str | None = None
        """Why the last exchange with Redis failed (``Connection refused``, ``NOAUTH ...``,
        ``WRONGPASS ...``), None while it answers: what the start message and a lag reason
        say (docs/backbeat.md "2. The bridge")."""

    def _failed(self, exc: BaseException) -> None:
        self.error = _redis_error(exc)
        if self.healthy:
            log.warning("Redis at %s: %s", self.url, self.error)
        self.healthy = False

    def publish(self, channel: str, action: str) -> Delivery | None:
        """Publish ``action`` on ``channel``: how many subscribers received it, and which
        subscriber connections may have (:class:`Delivery`), or None when Redis could not be
        reached. The connections are listed in the same transaction as the publish
        (``MULTI``: ``CLIENT LIST TYPE pubsub``, ``PUBLISH``), so no connection opens or
        closes between the two. Thread-safe without a lock of its own: redis-py gives each
        concurrent caller a connection of its pool, so the handlers of several processors
        publish at once instead of queueing behind one round trip each (bench/bridge.py)."""
        try:
            pipe = self._redis.pipeline(transaction=True)
            pipe.client_list(_type="pubsub")
            pipe.publish(channel, message(action))
            listing, count = pipe.execute()
        except self._errors as exc:
            self._failed(exc)
            return None
        self.healthy, self.error = True, None
        return Delivery(int(count), _connections(listing))

    def listeners(self) -> frozenset[str] | None:
        """The subscriber connections open now (``CLIENT LIST TYPE pubsub``: ``id@addr``
        each), None when Redis cannot be reached."""
        try:
            return _connections(self._redis.client_list(_type="pubsub"))
        except self._errors:
            return None

    def subscribers(self, channel: str) -> int | None:
        """How many connections subscribe to ``channel`` now (``PUBSUB NUMSUB``), None when
        Redis cannot be reached. 0 says a processor's connection is gone, and with it the
        messages still queued on it."""
        try:
            reply = self._redis.pubsub_numsub(channel)
        except self._errors:
            return None
        return int(reply[0][1]) if reply else 0

    def probe(self) -> bool:
        """Ping; True when Redis answers again after a failure (or for the first time)."""
        was = self.healthy
        try:
            self._redis.ping()
        except self._errors as exc:
            self._failed(exc)
            return False
        if not was and self.error is not None:
            log.warning("Redis at %s answers again", self.url)
        self.healthy, self.error = True, None
        return not was

    def close(self) -> None:
        self._redis.close()


class StateNodes:
    """The processors' ZooKeeper state nodes, watched (kazoo ``DataWatch``) and cached.
    ``on_change(path)`` is called (from kazoo's thread: it must only record and return) after
    each change of a watched node has been cached, with its path, and with None on every
    reconnection (every node may have changed); :meth:`read` reads a node afresh."""

    def __init__(
        self, hosts: str, on_change: Callable[[str | None], None], timeout: float = 10.0
    ) -> None:
        from kazoo.client import KazooClient, KazooState
        from kazoo.handlers.threading import KazooTimeoutError

        try:
            self._client = KazooClient(hosts=hosts, timeout=timeout)
        except ValueError as exc:  # a port out of range, a chroot with .. in it
            raise InvalidInput(f"Backbeat's ZooKeeper {hosts!r}: {exc}") from None
        self._cache: dict[str, NodeState] = {}
        self._lock = threading.Lock()
        self._on_change = on_change
        self.reconnected = threading.Event()
        self.hosts = hosts

        def listener(state: Any) -> None:
            if state == KazooState.CONNECTED:
                self.reconnected.set()
                on_change(None)

        self._client.add_listener(listener)
        try:
            self._client.start(timeout=timeout)
        except KazooTimeoutError:
            self._client.close()
            raise BackendUnavailable(
                f"Backbeat's ZooKeeper at {hosts} did not answer within {timeout:g} s"
            ) from None
        self.reconnected.clear()

    @staticmethod
    def _parse(path: str, data: bytes | None, stat: Any) -> NodeState:
        if data is None or stat is None:
            return NodeState(missing=True)
        version, mzxid = int(stat.version), int(stat.mzxid)
        try:
            return NodeState(state=parse_node(data, f"zk:{path}"), version=version, mzxid=mzxid)
        except InvalidInput as exc:
            return NodeState(error=exc.message, version=version, mzxid=mzxid)

    def watch(self, path: str) -> None:
        """Watch ``path`` (which need not exist yet)."""

        def changed(data: bytes | None, stat: Any, _event: Any) -> None:
            node = self._parse(path, data, stat)
            with self._lock:
                # a fresh read (:meth:`read`) may have cached a later write already
                if node.missing or node.mzxid >= self._cache.get(path, node).mzxid:
                    self._cache[path] = node
            self._on_change(path)

        self._client.DataWatch(path, changed)

    def cached(self, path: str) -> NodeState | None:
        with self._lock:
            return self._cache.get(path)

    def read(self, path: str) -> NodeState | None:
        """Read ``path`` now (and refresh the cache); None when ZooKeeper cannot be reached."""
        from kazoo.exceptions import KazooException, NoNodeError

        stat: Any = None
        try:
            data, stat = self._client.get(path)
        except NoNodeError:
            data = None
        except KazooException as exc:
            log.warning("reading %s from Backbeat's ZooKeeper: %r", path, exc)
            return None
        node = self._parse(path, data, stat)
        with self._lock:
            if node.missing or node.mzxid >= self._cache.get(path, node).mzxid:
                self._cache[path] = node
        return node

    def close(self) -> None:
        self._client.stop()
        self._client.close()


class LifecycleDocuments:
    """Lifecycle's ``__locationStatusStore`` documents (pymongo). :meth:`apply` makes one
    say ``paused`` with no scheduled resume, in a write guarded by the value it replaces."""

    def __init__(self, uri: str, database: str, timeout: float = 10.0) -> None:
        import pymongo
        from pymongo.errors import PyMongoError

        ms = int(timeout * 1000)
        self._client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
            uri, serverSelectionTimeoutMS=ms, connectTimeoutMS=ms, socketTimeoutMS=ms
        )
        self._coll = self._client[database][STATUS_COLLECTION]
        self._errors: tuple[type[Exception], ...] = (PyMongoError,)
        self._key = f"value.{DOCUMENT_KEYS['lifecycle']}"
        self._timeout = timeout
        self._down = False

    def read(self) -> dict[str, LegacyState | str | None]:
        """``{location: state | None (lifecycle null) | error text}``. Raises
        :class:`BackendUnavailable`, within :data:`QUICK_TIMEOUT` seconds when the previous
        read failed and MongoDB still does not answer a ping (the bridge's loop reads while it
        is down, and waits on it meanwhile; a read of many documents may take longer)."""
        import pymongo

        try:
            if self._down:
                with pymongo.timeout(QUICK_TIMEOUT):
                    self._client.admin.command("ping")
            docs = list(self._coll.find({}, {self._key: 1}))
        except self._errors as exc:
            self._down = True
            raise BackendUnavailable(
                f"Backbeat's {STATUS_COLLECTION}: {mongo_reason(exc, self._timeout)}"
            ) from None
        self._down = False
        out: dict[str, LegacyState | str | None] = {}
        for doc in docs:
            name = doc.get("_id")
            if not isinstance(name, str):
                continue
            value = doc.get("value")
            entry = value.get("lifecycle") if isinstance(value, dict) else None
            try:
                out[name] = None if entry is None else parse_state(entry, name)
            except InvalidInput as exc:
                out[name] = exc.message
        return out

    def apply(self, location: str, paused: bool) -> bool:
        """Make ``location``'s document say ``paused`` (scheduledResume null); True when a
        write was needed. The write names the value it replaces in its filter (the lifecycle
        entry not already so), so a concurrent writer's other fields are kept; a document
        that does not exist is created as Backbeat creates one. Raises
        :class:`BackendUnavailable`, and :class:`InvalidInput` when the document's lifecycle
        entry is neither an object nor null (nothing written: the pause waits, naming it)."""
        from pymongo.errors import DuplicateKeyError

        target = {"paused": paused, "scheduledResume": None}
        key = self._key
        try:
            res = self._coll.update_one(
                {"_id": location, key: {"$type": "object"},
                 "$or": [{f"{key}.paused": {"$ne": paused}},
                         {f"{key}.scheduledResume": {"$ne": None}}]},
                {"$set": {f"{key}.paused": paused, f"{key}.scheduledResume": None}},
            )
            if res.matched_count:
                return True
            res = self._coll.update_one(  # lifecycle: null, or no lifecycle entry
                {"_id": location, key: None}, {"$set": {key: target}}
            )
            if res.matched_count:
                return True
            doc = self._coll.find_one({"_id": location}, {key: 1})
            if doc is not None:
                entry = doc["value"].get(DOCUMENT_KEYS["lifecycle"]) if isinstance(
                    doc.get("value"), dict) else doc.get("value")
                if (isinstance(entry, dict) and entry.get("paused") is paused
                        and entry.get("scheduledResume") is None):
                    return False  # already so
                # Neither write matched and it is not so: value.lifecycle is no object (a
                # string, a number...), which Backbeat cannot read either. Taking it as "already
                # so" settled a pause on a document never written (a hostile review).
                shown = json.dumps(entry, default=str)[:80]
                raise InvalidInput(
                    f"Backbeat's {STATUS_COLLECTION} document {location!r}: {key} is {shown}, "
                    "not an object or null: nothing written; fix or delete the document"
                )
            try:
                self._coll.insert_one({"_id": location, "value": {
                    "crr": None, "ingestion": None, "lifecycle": target}})
            except DuplicateKeyError:  # created meanwhile: apply to it next time round
                return False
            return True
        except self._errors as exc:
            raise BackendUnavailable(
                f"Backbeat's {STATUS_COLLECTION}: {mongo_reason(exc, self._timeout)}"
            ) from None

    def close(self) -> None:
        self._client.close()
