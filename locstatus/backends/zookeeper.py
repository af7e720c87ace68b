"""``zk://[user:pass@]host:port[,host:port...]/chroot``: ZooKeeper through kazoo (docs/design.md
§4).

Why it is shaped so (``docs/zookeeper.md`` has the long version):

- **Layout under the chroot** (every name is a validated location or worker id, so no path
  ever leaves the chroot)::

      locations/<loc>                          record JSON (+ "incarnation"); CAS on its version
      history/<loc>                            incarnation counter: its data version = creates
      history/<loc>/<inc>/b<bucket>/<seq>      one node per write: the JSON entries of that write
      acks/<loc>                               created and deleted with the record; its data is
                                               touched by every ack (one watch per location)
      acks/<loc>/<worker_id>                   ephemeral {service: observed generation}
      workers                                  its data version counts registrations created
      workers/<worker_id>                      ephemeral WorkerInfo JSON (the session bounds the
                                               lease; lease_expires_at is kept as given)
      clock                                    empty; rewritten by every time probe, whose
                                               returned mtime is the leader's clock

- **Versions.** The exposed version is ``incarnation << 32 | (znode version + 1)``: the first
  life of a record counts 1, 2, 3 ... like SQLite, a recreated record starts above every
  version of its earlier lives, and a compare-and-set is exactly ``expected + 1``.
- **Compare-and-set is one multi-op**: ``check(history/<loc>, incarnation + 1)`` +
  ``set_data(locations/<loc>, payload, znode version)`` + ``create(history node)``. The check on
  the incarnation counter is what makes a stale version of a deleted-and-recreated record fail
  *inside* the transaction; ``czxid`` would tell a recreation apart too, but it cannot be
  checked in a multi-op, only read before it (a race) - so the counter replaces it. History
  nodes are named by version, paged by ``b<bucket>`` folders of 1000 (never one growing node, and
  no children list beyond 1000 names).
- **``transaction().commit()`` does not raise**: every result is inspected; the first real
  error decides (:class:`VersionConflict`, :class:`NotFound`, ...).
- **Ambiguity.** A multi-op sent while connected whose answer is lost (ConnectionLoss,
  SessionExpired, timeout) raises :class:`AmbiguousCommit`; the manager re-reads and looks for the
  op_id (docs/design.md §3.2). Writes are only submitted while connected. While the connection
  is known down (SUSPENDED or LOST) every call waits for it at most until
  :data:`~locstatus.backends.base.DOWN_GRACE` seconds after it went down, then fails with
  :class:`BackendUnavailable`, nothing sent: a blip is ridden through, an outage answered at
  once. Reads and idempotent writes (registration, acks) use a bounded
  :class:`~kazoo.retry.KazooRetry` that retries connection errors only, each attempt under the
  same rule.
- **Sessions.** Workers and acks are ephemeral nodes. When the session is lost, the backend
  re-creates the ephemerals it wrote on the new session, re-arms every watch and emits a
  ``resync`` hint. The kazoo state listener only enqueues: all of this runs on the backend's
  own thread, never on kazoo's.
- **Hints** come from watches (children of ``locations`` and ``workers``, data of each
  ``locations/<loc>`` and ``acks/<loc>``), coalesced per batch. The re-arming requests are sent
  before the hints are delivered and awaited after: a session answers in order, so a read made
  after the hint is served after the watch is set again, and the hint does not wait a round
  trip. An ``acks/<loc>`` watch (touched by every acknowledgement) is set again only
  ``_ACKS_COALESCE`` seconds after it fired, followed by one more hint, so a fleet acknowledging
  at once wakes each subscriber twice, not once per worker. kazoo drops every watch when a
  connection breaks, so they are re-armed on every reconnection and followed by ``resync``.
- **``workers()``** is served from a copy invalidated by watches on ``workers`` (children and
  data), by any connection change and by this backend's own registration writes: the manager
  looks at the live workers on every transition, and this keeps a transition at two round
  trips (read, multi-op), the same as the raw kazoo baseline in ``bench/raw_zk.py``. The copy
  is served only once kazoo's callback thread has run the watches of every event received
  before the call, so it is never older than a record the caller read (a settle must see every
  worker registered before the write it settles).
- **ACLs.** With credentials (URL userinfo or ``LOCSTATUS_ZK_AUTH=user:pass``) every node is
  created with a digest ACL giving that user all rights (plus world read unless
  ``world_read=false``), so other tenants of the ensemble cannot write locstatus nodes.
- **Size.** ZooKeeper refuses requests above ``jute.maxbuffer`` (1 MB) by dropping the
  connection; writes are measured first and refused with :class:`InvalidInput` above
  ``max_bytes`` (default 1 000 000).

URL query parameters: ``timeout`` (seconds to connect, and to wait for an answer before
:class:`BackendUnavailable`; default 10; a connection known down fails a call after
:data:`~locstatus.backends.base.DOWN_GRACE` instead), ``session_timeout`` (seconds; default 10),
``world_read`` (true|false, with credentials; default true), ``max_bytes``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache, partial
from typing import Any, TypeVar, cast
from urllib.parse import unquote

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    AuthFailedError,
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
    ZookeeperError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import Callback, EventType, WatchedEvent, ZnodeStat
from kazoo.retry import KazooRetry, RetryFailedError
from kazoo.security import ACL, make_acl, make_digest_acl
from pydantic import TypeAdapter

from locstatus.backends import codec
from locstatus.backends.base import (
    DOWN_GRACE,
    AckMap,
    Backend,
    HintCallback,
    Unsubscribe,
    stale_ack,
)
from locstatus.backends.urls import Number, query_params, split_url
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
from locstatus.names import check_location

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_CHROOT = "/locstatus"
DEFAULT_PORT = 2181
BUCKET = 1000
"""History nodes per ``b<bucket>`` folder."""
_SHIFT = 32
_LOW = (1 << _SHIFT) - 1
DEFAULT_MAX_BYTES = 1_000_000
"""Largest write sent to ZooKeeper: ``jute.maxbuffer`` is 1 048 575 bytes for the whole request."""
_BATCH = 1000
"""Asynchronous requests in flight at once in bulk reads."""
_AUTH_ENV = "LOCSTATUS_ZK_AUTH"
_SEGMENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_HOST_RE = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(\d{1,5}))?")
_ACKS_HINT = b""
_ACKS_COALESCE = 0.015
"""Seconds an ``acks/<loc>`` watch stays unarmed after it fired. Every acknowledgement touches
that node, so a fleet acknowledging a change would otherwise wake every subscribed process once
per worker; instead the first one is hinted at once and the watch is set again this much later,
followed by one more hint that covers whatever changed meanwhile."""
_EVENTS_WAIT = 0.5
"""Seconds :meth:`ZooKeeperBackend.workers` waits for kazoo's callback thread to handle the watch
events received so far before it reads the list from the server instead (a thread that busy is
stuck; the read is as fresh, one round trip dearer)."""
_HISTORY = TypeAdapter(list[HistoryEntry])
_RETRYABLE = KazooRetry.RETRY_EXCEPTIONS + KazooRetry.EXPIRED_EXCEPTIONS


# -- URL ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ZkParams:
    """A parsed ``zk://`` URL. ``hosts`` is kazoo's ``host:port,host:port`` string; ``chroot`` an
    absolute znode path; ``auth`` digest credentials or None; times in seconds."""

    hosts: str
    chroot: str
    auth: tuple[str, str] | None = None
    timeout: float = 10.0
    session_timeout: float = 10.0
    world_read: bool = True
    max_bytes: int = DEFAULT_MAX_BYTES


TIMEOUT = Number("timeout", 10.0, 0, 3600, low_open=True)
"""Seconds to connect, and to wait for an answer (a connection known down is not waited for
longer than :data:`~locstatus.backends.base.DOWN_GRACE`)."""
SESSION_TIMEOUT = Number("session_timeout", 10.0, 0.4, 3600)
"""ZooKeeper session timeout, in seconds (the server bounds it further)."""
MAX_BYTES = Number("max_bytes", DEFAULT_MAX_BYTES, 1024, 1_048_000, unit="bytes", integer=True)
"""Largest record + history write sent (``jute.maxbuffer`` is 1 MB per request)."""
_URL_PARAMS = frozenset({"timeout", "session_timeout", "world_read", "max_bytes"})


def parse_zk_url(url: str) -> ZkParams:
    """Parse ``zk://[user:pass@]host[:port][,host[:port]...][/chroot][?timeout=&session_timeout=
    &world_read=&max_bytes=]``. The chroot defaults to ``/locstatus``; each of its segments
    follows the location-name rules (no ``.``/``..``, nothing under ``/zookeeper``).

    Raises :class:`InvalidInput` naming the bad part.
    """
    parts = split_url(url, "ZooKeeper", "zk://host:port/chroot", where=_redact(str(url)))
    if parts.scheme != "zk":
        raise InvalidInput(f"invalid ZooKeeper URL {url!r}: expected zk://host:port/chroot")
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    hosts: list[str] = []
    for item in hostlist.split(","):
        m = _HOST_RE.fullmatch(item.strip())
        if not m or (m.group(2) is not None and not 0 < int(m.group(2)) < 65536):
            raise InvalidInput(f"invalid ZooKeeper URL {_redact(url)!r}: bad host {item!r}")
        hosts.append(f"{m.group(1)}:{m.group(2) or DEFAULT_PORT}")
    auth: tuple[str, str] | None = None
    if userinfo:
        user, sep, password = userinfo.partition(":")
        if not user or not sep:
            raise InvalidInput(f"invalid ZooKeeper URL {_redact(url)!r}: expected user:password@")
        auth = (unquote(user), unquote(password))
    elif env := os.environ.get(_AUTH_ENV):
        user, sep, password = env.partition(":")
        if not user or not sep:
            raise InvalidInput(f"invalid {_AUTH_ENV}: expected user:password")
        auth = (user, password)
    chroot = parts.path.rstrip("/") or DEFAULT_CHROOT
    segments = chroot.split("/")[1:]
    for seg in segments:
        if not _SEGMENT_RE.fullmatch(seg) or seg in (".", ".."):
            raise InvalidInput(
                f"invalid ZooKeeper chroot {chroot!r} in {_redact(url)!r}: segment {seg!r} must be "
                "1-128 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit"
            )
    if segments[0] == "zookeeper":
        raise InvalidInput(f"invalid ZooKeeper chroot {chroot!r}: /zookeeper is reserved")
    where = _redact(url)
    params = query_params(parts.query, known=_URL_PARAMS, kind="ZooKeeper", where=where)
    timeout = TIMEOUT.parse(params.get("timeout"), "ZooKeeper", where)
    session_timeout = SESSION_TIMEOUT.parse(params.get("session_timeout"), "ZooKeeper", where)
    max_bytes = int(MAX_BYTES.parse(params.get("max_bytes"), "ZooKeeper", where))
    world = params.get("world_read", "true").lower()
    if world not in ("true", "false", "1", "0", "yes", "no"):
        raise InvalidInput(f"invalid world_read={world!r}: true|false")
    return ZkParams(
        hosts=",".join(hosts),
        chroot=chroot,
        auth=auth,
        timeout=timeout,
        session_timeout=session_timeout,
        world_read=world in ("true", "1", "yes"),
        max_bytes=max_bytes,
    )


def _redact(url: str) -> str:
    return re.sub(r"//([^/@]*):[^/@]*@", r"//\1:***@", url)


def split_version(version: int) -> tuple[int, int]:
    """``(incarnation, seq)`` of an exposed version; seq is the znode version + 1."""
    return version >> _SHIFT, version & _LOW


def join_version(incarnation: int, seq: int) -> int:
    """The exposed version of write ``seq`` (1-based) of life ``incarnation`` (0-based)."""
    return incarnation << _SHIFT | seq


# -- paths -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Absolute znode paths under ``root``. Every name goes through the location-name check,
    so nothing built here can leave the chroot (``..``, ``/`` and the like raise
    :class:`InvalidInput`)."""

    root: str

    @property
    def locations(self) -> str:
        return f"{self.root}/locations"

    @property
    def histories(self) -> str:
        return f"{self.root}/history"

    @property
    def workers(self) -> str:
        return f"{self.root}/workers"

    @property
    def acks_root(self) -> str:
        return f"{self.root}/acks"

    @property
    def clock(self) -> str:
        return f"{self.root}/clock"

    def location(self, location: str) -> str:
        return f"{self.locations}/{_name(location)}"

    def history(self, location: str) -> str:
        return f"{self.histories}/{_name(location)}"

    def incarnation(self, location: str, incarnation: int) -> str:
        return f"{self.history(location)}/{incarnation:010d}"

    def bucket(self, location: str, incarnation: int, seq: int) -> str:
        return f"{self.incarnation(location, incarnation)}/b{seq // BUCKET:07d}"

    def entry(self, location: str, incarnation: int, seq: int) -> str:
        return f"{self.bucket(location, incarnation, seq)}/{seq:010d}"

    def worker(self, worker_id: str) -> str:
        return f"{self.workers}/{_worker_name(worker_id)}"

    def acks(self, location: str) -> str:
        return f"{self.acks_root}/{_name(location)}"

    def ack(self, location: str, worker_id: str) -> str:
        return f"{self.acks(location)}/{_worker_name(worker_id)}"


@lru_cache(maxsize=8192)
def _name(location: str) -> str:
    """``check_location`` once per name (a transition builds several paths; invalid names raise
    every time, exceptions are not cached)."""
    return check_location(location)


def _worker_name(worker_id: str) -> str:
    try:
        return _name(worker_id)
    except InvalidInput:
        raise InvalidInput(
            f"invalid worker id {worker_id!r}: same rules as location names"
        ) from None


# -- transactions ------------------------------------------------------------------------------


class _Txn:
    """A kazoo transaction whose operations carry a label, so the first failing one can be
    named (``commit()`` returns exceptions in its result list instead of raising)."""

    def __init__(self, client: KazooClient) -> None:
        self.tx = client.transaction()
        self.labels: list[str] = []

    def check(self, label: str, path: str, version: int) -> None:
        self.tx.check(path, version)
        self.labels.append(label)

    def set_data(self, label: str, path: str, data: bytes, version: int = -1) -> None:
        self.tx.set_data(path, data, version)
        self.labels.append(label)

    def create(self, label: str, path: str, data: bytes = b"", *, ephemeral: bool = False) -> None:
        self.tx.create(path, data, ephemeral=ephemeral)
        self.labels.append(label)

    def delete(self, label: str, path: str, version: int = -1) -> None:
        self.tx.delete(path, version)
        self.labels.append(label)


def _failure(results: Sequence[object], labels: Sequence[str]) -> tuple[str, Exception] | None:
    """The label and error of the operation that failed a committed transaction, or None."""
    for label, result in zip(labels, results, strict=False):
        if isinstance(result, (RolledBackError, RuntimeInconsistency)):
            continue
        if isinstance(result, Exception):
            return label, result
    for result in results:  # every result says "rolled back": report that one
        if isinstance(result, Exception):
            return "transaction", result
    return None


# -- the backend -------------------------------------------------------------------------------


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
        self._location_prefix = self.paths.locations + "/"
        p = self.params
        self._acl: list[ACL] | None = None
        auth_data: list[tuple[str, str]] | None = None
        if p.auth is not None:
            user, password = p.auth
            self._acl = [make_digest_acl(user, password, all=True)]
            if p.world_read:
                self._acl.append(make_acl("world", "anyone", read=True))
            auth_data = [("digest", f"{user}:{password}")]
        self._client = KazooClient(
            hosts=p.hosts,
            timeout=p.session_timeout,
            default_acl=self._acl,
            auth_data=auth_data,
            connection_retry=KazooRetry(
                max_tries=-1, delay=0.05, backoff=2, max_delay=1.0, max_jitter=0.3
            ),
            command_retry=KazooRetry(max_tries=0),
        )
        self._live = threading.Event()
        self._down_since: float | None = None  # monotonic time the connection went down
        self._closed = False
        self._lock = threading.Lock()
        self._subscribers: list[tuple[HintCallback, frozenset[str] | None]] = []
        self._acks_armed = False  # acknowledgement nodes watched (a subscriber wants acks)
        self._events: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self._my_workers: dict[str, WorkerInfo] = {}
        self._my_acks: dict[tuple[str, str], dict[str, int]] = {}
        # (location, worker_id) -> (session id, znode version) of the ack node this backend
        # last wrote, so the next ack is one multi-op (set at that version) without a read.
        self._ack_nodes: dict[tuple[str, str], tuple[int, int]] = {}
        self._session_id: int | None = None
        self._need_restore = False
        self._armed = False
        self._armed_event = threading.Event()
        self._missed = False
        self._watched: set[str] = set()
        self._acks_later: dict[str, float] = {}  # acks/<loc> path -> monotonic time to re-arm
        self._workers_cache: list[WorkerInfo] | None = None
        self._workers_epoch = 0
        self._callback_ident: int | None = None  # kazoo's callback thread, once seen
        self._client.add_listener(self._on_state)
        try:
            self._client.start(timeout=p.timeout)
        except (KazooTimeoutError, KazooException, OSError) as exc:
            self._client.remove_listener(self._on_state)
            with contextlib.suppress(Exception):
                self._client.stop()
                self._client.close()
            raise BackendUnavailable(
                f"cannot connect to ZooKeeper {p.hosts} within {p.timeout:g}s "
                f"({type(exc).__name__}: {exc})"
            ) from exc
        self._thread = threading.Thread(
            target=self._run, name=f"locstatus-zk{p.chroot.replace('/', '-')}", daemon=True
        )
        self._thread.start()
        try:
            self._ensure_tree()
        except BaseException:
            self.close()
            raise

    # -- plumbing --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise BackendUnavailable(f"backend {_redact(self.url)} is closed")

    def _get(self, async_result: Any) -> Any:
        return async_result.get(timeout=self.params.timeout)

    def _unavailable(self, what: str, exc: BaseException) -> BackendUnavailable:
        p = self.params
        if isinstance(exc, (NoAuthError, AuthFailedError)):
            creds = "with the configured credentials" if p.auth else "without credentials"
            return BackendUnavailable(
                f"ZooKeeper {p.hosts} refused to {what} under {p.chroot} {creds} "
                f"({type(exc).__name__}): the chroot is protected by a digest ACL; give its "
                f"credentials as zk://user:password@host/chroot or {_AUTH_ENV}=user:password"
            )
        if isinstance(exc, (RetryFailedError, KazooTimeoutError, ConnectionLoss,
                            SessionExpiredError)):
            return BackendUnavailable(
                f"ZooKeeper {p.hosts} did not answer ({what}) within {p.timeout:g}s "
                f"(connection {self._client.state}; {type(exc).__name__})"
            )
        if isinstance(exc, ConnectionClosedError) or self._closed:
            return BackendUnavailable(f"backend {_redact(self.url)} is closed")
        return BackendUnavailable(
            f"ZooKeeper {p.hosts}: {what} failed: {type(exc).__name__} {exc}".rstrip()
        )

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` (a read, or an idempotent write) retrying connection errors only, for at
        most ``timeout`` seconds; then :class:`BackendUnavailable`."""
        self._check_open()
        self._wait_live(what)

        def attempt() -> T:
            self._wait_live(what)
            return fn()

        try:
            try:
                return fn()  # the common case: no retry machinery
            except _RETRYABLE:
                retry = KazooRetry(
                    max_tries=-1, delay=0.02, backoff=2, max_delay=0.5, max_jitter=0.3,
                    deadline=self.params.timeout, ignore_expire=True,
                )
                return cast(T, retry(attempt))
        except LocstatusError:
            raise
        except (KazooException, KazooTimeoutError, RetryFailedError) as exc:
            raise self._unavailable(what, exc) from exc

    def _wait_connected(self, what: str) -> None:
        """Block until connected (:meth:`_wait_live`): writes are never queued while
        SUSPENDED. Raises :class:`BackendUnavailable` (nothing was sent)."""
        self._check_open()
        self._wait_live(what, written=True)

    def _wait_live(self, what: str, *, written: bool = False) -> None:
        """Return at once while connected; while the connection is known down, wait for it
        until :data:`DOWN_GRACE` seconds after it went down, then raise
        :class:`BackendUnavailable` (nothing was sent)."""
        if self._live.is_set():
            return
        since = self._down_since
        left = DOWN_GRACE if since is None else since + DOWN_GRACE - time.monotonic()
        if left > 0 and self._live.wait(left):
            return
        down = 0.0 if since is None else time.monotonic() - since
        raise BackendUnavailable(
            f"not connected to ZooKeeper {self.params.hosts} (connection {self._client.state} "
            f"for {down:.1f}s); {what}: " + ("nothing was written" if written else "not sent")
        )

    def _commit(self, what: str, txn: _Txn) -> tuple[str, Exception] | None:
        """Send a transaction once. Returns the failing (label, error) or None on success.
        Raises :class:`AmbiguousCommit` when the answer was lost after sending."""
        self._wait_connected(what)
        try:
            results = self._get(txn.tx.commit_async())
        except (ConnectionLoss, SessionExpiredError, KazooTimeoutError) as exc:
            raise AmbiguousCommit(
                f"ZooKeeper {self.params.hosts}: connection lost after {what} was sent "
                f"({type(exc).__name__}); its outcome is unknown"
            ) from exc
        except (NoAuthError, AuthFailedError, ConnectionClosedError) as exc:
            raise self._unavailable(what, exc) from exc
        except ZookeeperError as exc:  # a whole-request error: nothing was applied
            return "transaction", exc
        failure = _failure(results, txn.labels)
        if failure is not None and isinstance(failure[1], (NoAuthError, AuthFailedError)):
            raise self._unavailable(what, failure[1])
        return failure

    def _ensure(self, paths: Iterable[str]) -> None:
        """Create the persistent nodes ``paths`` (and their parents) if missing."""
        for path in paths:
            with contextlib.suppress(NodeExistsError):
                self._get(self._client.create_async(path, b"", makepath=True))

    def _ensure_tree(self) -> None:
        pa = self.paths

        def ensure() -> None:
            wanted = [pa.root, pa.locations, pa.histories, pa.workers, pa.acks_root]
            stats = [self._client.exists_async(path) for path in wanted]
            missing = [p for p, a in zip(wanted, stats, strict=True) if self._get(a) is None]
            self._ensure(missing)

        self._call(f"create the locstatus tree {pa.root}", ensure)

    def _check_size(self, location: str, what: str, *parts: bytes) -> None:
        size = sum(len(x) for x in parts)
        if size > self.params.max_bytes:
            raise InvalidInput(
                f"location {location!r}: {what} of {size} bytes exceeds the ZooKeeper node "
                f"limit of {self.params.max_bytes} bytes (jute.maxbuffer is 1 MB); nothing "
                "was written"
            )

    # -- payloads --------------------------------------------------------------------------

    @staticmethod
    def _record_bytes(record: LocationStatus, incarnation: int) -> bytes:
        text = codec.encode_record(record)
        return (text[:-1] + f',"incarnation":{incarnation}}}').encode()

    def _decode(self, location: str, raw: bytes, stat: ZnodeStat) -> LocationStatus:
        # Fast path: what _record_bytes writes ends with ',"incarnation":N}'; cut it off and
        # let codec.decode_record validate the rest in one pass of pydantic's JSON parser.
        cut = raw.rfind(b',"incarnation":')
        if cut > 0 and raw.endswith(b"}") and raw[cut + 15 : -1].isdigit():
            incarnation = int(raw[cut + 15 : -1])
            version = join_version(incarnation, stat.version + 1)
            return codec.decode_record(location, version, raw[:cut] + b"}")
        data = codec.parse_payload(location, raw)
        incarnation = data.pop("incarnation", None)
        if incarnation is None:
            incarnation = self._incarnation_of(location)
        if not isinstance(incarnation, int) or isinstance(incarnation, bool) or incarnation < 0:
            raise CorruptRecord(
                location, f"incarnation must be an integer >= 0, got {incarnation!r}"
            )
        return codec.decode_record(location, join_version(incarnation, stat.version + 1), data)

    def _incarnation_of(self, location: str) -> int:
        """Fallback for a record without an ``incarnation`` field (written by hand)."""
        path = self.paths.history(location)
        stat = self._call(
            f"read location {location!r}", lambda: self._get(self._client.exists_async(path))
        )
        return max(0, stat.version - 1) if stat is not None else 0

    # -- records ---------------------------------------------------------------------------

    def create(self, record: LocationStatus, history: Sequence[HistoryEntry]) -> LocationStatus:
        loc = record.location
        pa = self.paths
        parent = pa.history(loc)
        for _ in range(20):

            def counter() -> int:
                with contextlib.suppress(NodeExistsError):
                    self._get(self._client.create_async(parent, b""))
                return cast(int, self._get(self._client.exists_async(parent)).version)

            inc = self._call(f"create location {loc!r}", counter)
            version = join_version(inc, 1)
            payload = self._record_bytes(record, inc)
            entries = _HISTORY.dump_json(codec.stamp(history, version))
            self._check_size(loc, "record and history", payload, entries)
            txn = _Txn(self._client)
            txn.check("incarnation", parent, inc)
            txn.set_data("incarnation", parent, b"", inc)
            txn.create("location", pa.location(loc), payload)
            txn.create("acks", pa.acks(loc))
            txn.create("history", pa.incarnation(loc, inc))
            txn.create("history", pa.bucket(loc, inc, 1))
            if history:
                txn.create("history", pa.entry(loc, inc, 1), entries)
            try:
                failure = self._commit(f"create of location {loc!r}", txn)
            except AmbiguousCommit:
                failure = self._resolve_create(loc, payload)
            if failure is None:
                return record.model_copy(update={"version": version})
            label, exc = failure
            if label == "location" and isinstance(exc, NodeExistsError):
                raise AlreadyExists(f"location {loc!r} already exists")
            if label == "incarnation" and isinstance(exc, (BadVersionError, NoNodeError)):
                continue  # a concurrent create or delete: read the counter again
            if label in ("acks", "history") and isinstance(exc, NodeExistsError):
                # Left over by an interrupted purge or an older layout: not part of a live record.
                log.warning("location %s: removing leftover %s nodes before create", loc, label)
                self._call("clean up", partial(self._delete_tree, pa.acks(loc)))
                self._call("clean up", partial(self._delete_tree, pa.incarnation(loc, inc)))
                continue
            raise self._unavailable(f"create location {loc!r} ({label})", exc)
        raise BackendUnavailable(f"create of location {loc!r} kept racing; try again")

    def _resolve_create(self, location: str, payload: bytes) -> tuple[str, Exception] | None:
        """After an ambiguous create: None if our record is there, a failure to act on else."""

        def look() -> tuple[bytes, ZnodeStat] | None:
            try:
                return cast(
                    "tuple[bytes, ZnodeStat]",
                    self._get(self._client.get_async(self.paths.location(location))),
                )
            except NoNodeError:
                return None

        found = self._call(f"read location {location!r}", look)
        if found is None:
            return "incarnation", BadVersionError()  # not there: try again
        if found[0] == payload and found[1].version == 0:
            return None
        return "location", NodeExistsError()

    def read(self, location: str) -> LocationStatus:
        path = self.paths.location(location)

        def get() -> tuple[bytes, ZnodeStat]:
            try:
                return cast("tuple[bytes, ZnodeStat]", self._get(self._client.get_async(path)))
            except NoNodeError:
                raise NotFound(f"unknown location {location!r}") from None

        raw, stat = self._call(f"read location {location!r}", get)
        return self._decode(location, raw, stat)

    def read_all(self) -> list[LocationStatus | CorruptRecord]:
        pa = self.paths

        def get_all() -> list[tuple[str, bytes, ZnodeStat]]:
            names = sorted(self._get(self._client.get_children_async(pa.locations)))
            return [
                (name, raw, stat)
                for name, (raw, stat) in self._bulk(
                    names, lambda n: self._client.get_async(f"{pa.locations}/{n}")
                )
            ]

        out: list[LocationStatus | CorruptRecord] = []
        for name, raw, stat in self._call("read every location", get_all):
            try:
                out.append(self._decode(name, raw, stat))
            except CorruptRecord as exc:
                out.append(exc)
            except LocstatusError as exc:  # an invalid node name, put there by hand
                out.append(CorruptRecord(name, str(exc)))
        return out

    def _bulk(self, keys: Sequence[str], start: Callable[[str], Any]) -> list[tuple[str, Any]]:
        """Pipelined requests: ``start(key)`` for every key, ``_BATCH`` in flight at a time.
        Keys whose node vanished meanwhile (NoNode) are left out."""
        out: list[tuple[str, Any]] = []
        for i in range(0, len(keys), _BATCH):
            chunk = [(k, start(k)) for k in keys[i : i + _BATCH]]
            for key, pending in chunk:
                try:
                    out.append((key, self._get(pending)))
                except NoNodeError:
                    continue
        return out

    def compare_and_set(
        self, record: LocationStatus, expected_version: int, history: Sequence[HistoryEntry]
    ) -> LocationStatus:
        loc = record.location
        pa = self.paths
        inc, seq = split_version(expected_version)
        if seq < 1:
            raise VersionConflict(f"location {loc!r}: {expected_version} is not a version of it")
        version = expected_version + 1
        payload = self._record_bytes(record, inc)
        entries = _HISTORY.dump_json(codec.stamp(history, version)) if history else b""
        self._check_size(loc, "record and history", payload, entries)
        txn = _Txn(self._client)
        txn.check("incarnation", pa.history(loc), inc + 1)
        txn.set_data("location", pa.location(loc), payload, seq - 1)
        if (seq + 1) % BUCKET == 0:
            txn.create("history", pa.bucket(loc, inc, seq + 1))
        if history:
            txn.create("history", pa.entry(loc, inc, seq + 1), entries)
        failure = self._commit(f"compare-and-set of location {loc!r}", txn)
        if failure is None:
            return record.model_copy(update={"version": version})
        label, exc = failure
        if label == "location" and isinstance(exc, NoNodeError):
            raise NotFound(f"unknown location {loc!r}")
        if label == "location" and isinstance(exc, BadVersionError):
            raise VersionConflict(f"location {loc!r} changed since version {expected_version}")
        if label == "incarnation" and isinstance(exc, (NoNodeError, BadVersionError)):
            self._explain_incarnation(loc, expected_version, exc)
        if label == "history":
            raise CorruptRecord(
                loc, f"history of version {version} cannot be written ({type(exc).__name__})"
            )
        raise self._unavailable(f"compare-and-set of location {loc!r} ({label})", exc)

    def _explain_incarnation(self, location: str, expected: int, exc: Exception) -> None:
        """The incarnation check failed: say why (always raises)."""
        path = self.paths.location(location)
        stat = self._call(
            f"read location {location!r}", lambda: self._get(self._client.exists_async(path))
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
        pa = self.paths
        inc, seq = split_version(expected_version)
        if seq < 1:
            raise VersionConflict(
                f"location {location!r}: {expected_version} is not a version of it"
            )
        acks_dir = pa.acks(location)
        for _ in range(20):

            def ack_nodes() -> list[str] | None:
                try:
                    return cast("list[str]", self._get(self._client.get_children_async(acks_dir)))
                except NoNodeError:
                    return None

            children = self._call(f"list acks of {location!r}", ack_nodes)
            txn = _Txn(self._client)
            txn.check("incarnation", pa.history(location), inc + 1)
            txn.delete("location", pa.location(location), seq - 1)
            if children is not None:
                for child in children:
                    txn.delete("acks", f"{acks_dir}/{child}")
                txn.delete("acks", acks_dir)
            try:
                failure = self._commit(f"delete of location {location!r}", txn)
            except AmbiguousCommit:
                failure = self._resolve_delete(location, expected_version)
            if failure is None:
                break
            label, exc = failure
            if label == "acks":
                continue  # a worker acked meanwhile: list again
            if label == "location" and isinstance(exc, NoNodeError):
                raise NotFound(f"unknown location {location!r}")
            if label == "location" and isinstance(exc, BadVersionError):
                raise VersionConflict(
                    f"location {location!r} changed since version {expected_version}"
                )
            if label == "incarnation" and isinstance(exc, (NoNodeError, BadVersionError)):
                self._explain_incarnation(location, expected_version, exc)
            if label == "retry":
                continue
            raise self._unavailable(f"delete location {location!r} ({label})", exc)
        else:
            raise BackendUnavailable(f"delete of location {location!r} kept racing; try again")
        # The record and its acks are gone atomically; its history is keyed by incarnation, so
        # what an interrupted clean-up leaves behind is never read again.
        try:
            self._call("clean up history", lambda: self._delete_tree(pa.incarnation(location, inc)))
        except LocstatusError as exc:
            log.warning("location %s: history clean-up left for later: %s", location, exc)

    def _resolve_delete(self, location: str, expected: int) -> tuple[str, Exception] | None:
        try:
            current = self.read(location)
        except NotFound:
            return None  # gone: ours (or an equal purge) landed
        except CorruptRecord:
            return "location", BadVersionError()
        if current.version == expected:
            return "retry", BadVersionError()
        return "location", BadVersionError()

    def _delete_tree(self, path: str) -> None:
        """Delete ``path`` and everything below it, pipelined level by level. NoNode is fine."""
        levels: list[list[str]] = [[path]]
        while levels[-1]:
            listed = self._bulk(levels[-1], lambda p: self._client.get_children_async(p))
            levels.append([f"{parent}/{c}" for parent, kids in listed for c in kids])
        for level in reversed(levels[:-1]):
            for i in range(0, len(level), _BATCH):
                pending = [self._client.delete_async(p) for p in level[i : i + _BATCH]]
                for item in pending:
                    with contextlib.suppress(NoNodeError, NotEmptyError):
                        self._get(item)

    def history(
        self, location: str, *, limit: int = 50, before_version: int | None = None
    ) -> list[HistoryEntry]:
        pa = self.paths
        loc_path, parent = pa.location(location), pa.history(location)

        def stats() -> tuple[ZnodeStat | None, ZnodeStat | None]:
            a, b = self._client.exists_async(loc_path), self._client.exists_async(parent)
            return self._get(a), self._get(b)

        loc_stat, parent_stat = self._call(f"read history of {location!r}", stats)
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
        seqs = self._call(
            f"read history of {location!r}", lambda: self._history_seqs(location, inc, upper, want)
        )
        if not seqs:
            return []
        versions = {pa.entry(location, inc, s): join_version(inc, s) for s in seqs}
        nodes = self._call(
            f"read history of {location!r}",
            lambda: self._bulk(list(versions), lambda p: self._client.get_async(p)),
        )
        out: list[HistoryEntry] = []
        for path, (raw, _stat) in nodes:
            out.extend(reversed(codec.decode_history(location, raw, versions[path])))
            if len(out) >= limit:
                break
        return out

    def history_write(self, location: str, version: int) -> list[HistoryEntry]:
        """One read of the write's node ``history/<loc>/<inc>/b<bucket>/<seq>``, when
        ``version`` belongs to the record's current life (the incarnation counter's)."""
        pa = self.paths
        inc, seq = split_version(version)
        if seq < 1:
            return []
        loc_path, parent = pa.location(location), pa.history(location)
        node = pa.entry(location, inc, seq)

        def get() -> tuple[ZnodeStat | None, ZnodeStat | None, bytes | None]:
            a = self._client.exists_async(loc_path)
            b = self._client.exists_async(parent)
            c = self._client.get_async(node)
            try:
                raw: bytes | None = self._get(c)[0]
            except NoNodeError:
                raw = None
            return self._get(a), self._get(b), raw

        loc_stat, parent_stat, raw = self._call(f"read history of {location!r}", get)
        if loc_stat is None or parent_stat is None or parent_stat.version - 1 != inc:
            return []  # no record, or not its current life (leftovers of a purge)
        if raw is None:
            return []
        return list(reversed(codec.decode_history(location, raw, version)))

    def _history_seqs(self, location: str, inc: int, upper: int | None, want: int) -> list[int]:
        """Write numbers below ``upper`` (all if None), newest first, at least ``want`` of
        them when there are that many."""
        pa = self.paths
        try:
            buckets = self._get(self._client.get_children_async(pa.incarnation(location, inc)))
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
                kids = self._get(
                    self._client.get_children_async(pa.bucket(location, inc, b * BUCKET))
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

    # -- workers, leases and acknowledgements ---------------------------------------------

    def put_worker(self, info: WorkerInfo) -> None:
        """Register (ephemeral node, held by this session) or update a worker. A registration
        held by another session (a restarted worker whose old session has not expired yet) is
        taken over. ``lease_expires_at`` is stored as given: the worker counts as alive while
        its node exists and its lease (if any) holds."""
        path = self.paths.worker(info.worker_id)
        data = self._worker_bytes(info)
        with self._lock:
            self._my_workers[info.worker_id] = info
        try:
            self._call(
                f"register worker {info.worker_id!r}", lambda: self._put_worker_node(path, data)
            )
        finally:
            self._forget_workers()

    def _worker_bytes(self, info: WorkerInfo) -> bytes:
        """The registration's node data, bounded as on every backend
        (:func:`codec.bounded_worker`), and by this ensemble's ``max_bytes`` when lower."""
        limit = min(self.params.max_bytes, codec.MAX_REGISTRATION_BYTES)
        return codec.encode_worker(info, limit).encode()

    def _put_worker_node(self, path: str, data: bytes) -> None:
        client = self._client
        for _ in range(10):
            # Every creation also bumps the data version of ``workers``: a znode created again
            # restarts at version 0, so only that counter tells a conditional removal
            # (remove_worker(if_expires=)) that the registration it judged was replaced.
            txn = _Txn(client)
            txn.create("worker", path, data, ephemeral=True)
            txn.set_data("registrations", self.paths.workers, b"")
            failure = _failure(self._get(txn.tx.commit_async()), txn.labels)
            if failure is None:
                return
            if not isinstance(failure[1], NodeExistsError):
                raise failure[1]
            stat = self._get(client.exists_async(path))
            if stat is None:
                continue
            session = client.client_id
            if session is None:
                raise ConnectionLoss()  # retried by the caller once connected again
            if stat.ephemeralOwner == session[0]:
                try:
                    self._get(client.set_async(path, data, stat.version))
                    return
                except (BadVersionError, NoNodeError):
                    continue
            log.warning("taking over worker registration %s from session 0x%x", path,
                        stat.ephemeralOwner)
            with contextlib.suppress(BadVersionError, NoNodeError):
                self._get(client.delete_async(path, stat.version))
        raise BackendUnavailable(f"could not register {path}: it kept changing")

    def remove_worker(self, worker_id: str, *, if_expires: datetime | None = None) -> bool:
        """See :meth:`Backend.remove_worker`. With ``if_expires``: one multi-op deleting the
        registration at the znode version whose data was judged (a renewal changes it), checked
        against the count of registrations created (the data version of ``workers``: a
        registration replaced by another session's starts at version 0 again), and every
        acknowledgement node of the worker listed just before; an acknowledgement that
        vanished meanwhile makes it list again."""
        if if_expires is None:
            self._forget_mine(worker_id)  # not restored on a new session from now on
            return self._remove_worker_now(worker_id)
        try:
            removed = self._remove_worker_if(worker_id, if_expires)
        finally:
            self._forget_workers()
        if removed:
            self._forget_mine(worker_id)
        return removed

    def _forget_mine(self, worker_id: str) -> None:
        """Stop restoring the worker's registration and acknowledgements on a new session."""
        with self._lock:
            self._my_workers.pop(worker_id, None)
            for key in [k for k in self._my_acks if k[1] == worker_id]:
                del self._my_acks[key]

    def _worker_acks(self, worker_id: str) -> list[str]:
        """Paths of the worker's acknowledgement nodes (one request per location)."""
        pa = self.paths
        locations = self._get(self._client.get_children_async(pa.acks_root))
        found = self._bulk(
            [f"{pa.acks_root}/{loc}/{worker_id}" for loc in locations],
            lambda p: self._client.exists_async(p),
        )
        return [p for p, stat in found if stat is not None]

    def _remove_worker_now(self, worker_id: str) -> bool:
        path = self.paths.worker(worker_id)

        def remove() -> bool:
            try:
                self._get(self._client.delete_async(path))
                gone = True
            except NoNodeError:
                gone = False
            pa = self.paths
            locations = self._get(self._client.get_children_async(pa.acks_root))
            self._bulk(  # one delete per location, those never acknowledged left out
                [f"{pa.acks_root}/{loc}/{worker_id}" for loc in locations],
                lambda p: self._client.delete_async(p),
            )
            return gone

        try:
            return self._call(f"unregister worker {worker_id!r}", remove)
        finally:
            self._forget_workers()

    def _remove_worker_if(self, worker_id: str, if_expires: datetime) -> bool:
        pa = self.paths
        path = pa.worker(worker_id)
        what = f"unregister expired worker {worker_id!r}"
        for _ in range(20):

            def look() -> tuple[int, bytes, ZnodeStat, list[str]] | None:
                created = self._get(self._client.exists_async(pa.workers)).version
                try:
                    raw, stat = self._get(self._client.get_async(path))
                except NoNodeError:
                    return None
                return created, raw, stat, self._worker_acks(worker_id)

            found = self._call(f"read worker {worker_id!r}", look)
            if found is None or not codec.is_registration(worker_id, found[1], if_expires):
                return False
            created, _raw, stat, acks = found
            txn = _Txn(self._client)
            txn.check("registrations", pa.workers, created)  # none created again since
            txn.delete("worker", path, stat.version)
            for ack in acks:
                txn.delete("acks", ack)
            try:
                failure = self._commit(what, txn)
            except AmbiguousCommit:
                continue  # looked at again: gone (False from here on) or still there
            if failure is None:
                return True
            label, exc = failure
            if label in ("registrations", "worker", "acks") and isinstance(
                exc, (NoNodeError, BadVersionError)
            ):
                continue  # renewed, replaced, or an acknowledgement went: judge it again
            raise self._unavailable(f"{what} ({label})", exc)
        raise BackendUnavailable(f"{what}: its registration kept changing; try again")

    def workers(self) -> list[WorkerInfo]:
        """Registered workers, sorted by id, at least as fresh as every answer this backend
        returned before the call (a record read or written, on this session); an unreadable
        registration node as its stand-in (:func:`codec.corrupt_worker`: alive while listed,
        unless what is left of it still carries a lease).

        Served from a copy kept while watches on ``workers`` (children and each node's data)
        are armed and the session is connected: any registration, heartbeat, expiry or
        connection change drops it, and so does every registration write of this backend before
        it returns, so a caller always sees its own writes. This saves the manager a round trip
        on every transition (its settle looks at the live workers).

        The watch that drops the copy runs on kazoo's callback thread, after the answer that
        followed its event may already have reached the caller: a record read after a worker
        registered could meet a copy from before (docs/zookeeper.md, "Workers and
        acknowledgements"). So the copy is
        served only once every event received so far has been handled
        (:meth:`_events_handled`); otherwise the list is read from the server."""
        self._check_open()
        if self._has_workers_copy() and self._events_handled():
            with self._lock:
                if self._workers_cache is not None and self._live.is_set():
                    return list(self._workers_cache)
        with self._lock:
            epoch = self._workers_epoch
        pa = self.paths

        def get_all() -> list[tuple[str, Any]]:
            names = sorted(
                self._get(self._client.get_children_async(pa.workers, watch=self._watch))
            )
            return self._bulk(
                names, lambda n: self._client.get_async(f"{pa.workers}/{n}", watch=self._watch)
            )

        # An unreadable node is listed as the live worker it may be (codec.corrupt_worker),
        # never left out: leaving it out would let a transition settle without that worker.
        out = [codec.decode_worker(name, raw) for name, (raw, _stat) in
               self._call("list workers", get_all)]
        with self._lock:
            if self._workers_epoch == epoch and self._live.is_set():
                self._workers_cache = list(out)
        return out

    def _has_workers_copy(self) -> bool:
        with self._lock:
            return self._workers_cache is not None and self._live.is_set()

    def _events_handled(self) -> bool:
        """Wait until kazoo's callback thread has run every watch callback queued before this
        call (a marker queued behind them has run), at most ``_EVENTS_WAIT`` seconds. ZooKeeper
        delivers a watch event before any answer that follows it on the session, and kazoo
        queues the event's callbacks before it hands that answer over, so once the marker ran
        every registration change visible to an earlier answer has dropped the copy. False
        (read the server instead) on that thread itself, or when it is stuck."""
        if threading.get_ident() == self._callback_ident:
            return False
        done = threading.Event()

        def marker() -> None:
            self._callback_ident = threading.get_ident()
            done.set()

        self._client.handler.dispatch_callback(Callback("locstatus-marker", marker, ()))
        return done.wait(_EVENTS_WAIT)

    def _forget_workers(self) -> None:
        """Drop the copy of the workers list (any thread; never blocks on I/O)."""
        with self._lock:
            self._workers_cache = None
            self._workers_epoch += 1

    def ack(
        self,
        worker_id: str,
        location: str,
        service: str,
        generation: int,
        *,
        if_version: int | None = None,
    ) -> None:
        """Record an acknowledgement (ephemeral, held by this session). An ack for a location
        that does not exist (purged meanwhile) is dropped: it could only confuse a record
        created again under the same name. With ``if_version`` the multi-op checks the whole
        version instead of the record's mere existence, as a compare-and-set does: the record's
        znode version and its incarnation (a record created again and written as many times has
        the same znode version). VersionConflict when either differs."""
        self.paths.ack(location, worker_id)  # validate both names before any I/O
        at = None if if_version is None else split_version(if_version)
        written = self._write_ack(location, worker_id, {service: generation}, at)
        if not written and if_version is not None:
            raise stale_ack(location, if_version)

    def _write_ack(
        self, location: str, worker_id: str, update: dict[str, int],
        at: tuple[int, int] | None = None,
    ) -> bool:
        """Write this worker's ack node; False (nothing written) when the record is gone, or
        not at version ``at`` (``(incarnation, seq)`` of :func:`split_version`; None: any)."""
        pa = self.paths
        node, parent = pa.ack(location, worker_id), pa.acks(location)
        loc_path = pa.location(location)
        client = self._client

        def attempt() -> bool:
            key = (location, worker_id)
            for _ in range(20):
                txn = _Txn(client)
                if at is None:
                    txn.check("location", loc_path, -1)
                else:
                    txn.check("location", pa.history(location), at[0] + 1)  # the incarnation
                    txn.check("location", loc_path, at[1] - 1)
                session = client.client_id
                with self._lock:
                    known = self._ack_nodes.pop(key, None)
                    mine = dict(self._my_acks.get(key, {}))
                if known is not None and session is not None and known[0] == session[0]:
                    # Our own node, at the version our last write left it, holding ``mine``:
                    # no read needed. Anything else (another session took it over, it was
                    # removed with the record) fails the version, and the next pass reads it.
                    new_version, content = known[1] + 1, {**mine, **update}
                    txn.set_data("ack", node, json.dumps(content).encode(), known[1])
                else:
                    new_version, session, content = self._read_ack_op(txn, node, update)
                txn.set_data("parent", parent, _ACKS_HINT)
                failure = self._commit(f"ack of {worker_id}/{location}", txn)
                if failure is None:
                    owner = client.client_id
                    with self._lock:
                        if owner is not None and session is not None and owner[0] == session[0]:
                            self._ack_nodes[key] = (owner[0], new_version)
                            self._my_acks[key] = content  # what the node holds now
                        else:
                            self._my_acks.pop(key, None)
                    return True
                label, exc = failure
                if label == "location":
                    return False
                if label == "parent" or (label == "ack" and isinstance(exc, NoNodeError)):
                    with contextlib.suppress(NodeExistsError):  # record made without its acks dir
                        self._get(client.create_async(parent, b""))
            raise BackendUnavailable(f"ack of {worker_id}/{location} kept conflicting")

        try:
            return self._call(f"ack {worker_id}/{location}", attempt)
        except AmbiguousCommit:  # acks are idempotent: write it again
            return self._call(f"ack {worker_id}/{location}", attempt)

    def _read_ack_op(
        self, txn: _Txn, node: str, update: dict[str, int]
    ) -> tuple[int, Any, dict[str, int]]:
        """Read ack node ``node`` and add its write to ``txn``: create it, merge ``update`` into
        it, or take it over from another session. Returns (the node's version after the write,
        this client's session, what the node will hold)."""
        client = self._client
        try:
            raw, stat = self._get(client.get_async(node))
        except NoNodeError:
            txn.create("ack", node, json.dumps(update).encode(), ephemeral=True)
            return 0, client.client_id, dict(update)
        content = {**(_decode_acks(raw) or {}), **update}
        merged = json.dumps(content).encode()
        session = client.client_id
        if session is None:
            raise ConnectionLoss()  # retried once connected again
        if stat.ephemeralOwner == session[0]:
            txn.set_data("ack", node, merged, stat.version)
            return stat.version + 1, session, content
        # Held by another session (this worker before a restart): take it over, or the ack
        # would vanish when that session expires.
        txn.delete("ack", node, stat.version)
        txn.create("ack", node, merged, ephemeral=True)
        return 0, session, content

    def acks(self, location: str) -> AckMap:
        parent = self.paths.acks(location)

        def get_all() -> list[tuple[str, Any]]:
            try:
                names = sorted(self._get(self._client.get_children_async(parent)))
            except NoNodeError:
                return []
            return self._bulk(names, lambda n: self._client.get_async(f"{parent}/{n}"))

        out: AckMap = {}
        for worker, (raw, _stat) in self._call(f"read acks of {location!r}", get_all):
            acked = _decode_acks(raw)
            if acked is not None:
                out[worker] = acked
        return out

    def all_acks(self) -> dict[str, AckMap]:
        root = self.paths.acks_root

        def get_all() -> list[tuple[str, Any]]:
            locations = sorted(self._get(self._client.get_children_async(root)))
            listed = self._bulk(locations, lambda n: self._client.get_children_async(f"{root}/{n}"))
            keys = [f"{loc}/{w}" for loc, workers in listed for w in workers]
            return self._bulk(keys, lambda k: self._client.get_async(f"{root}/{k}"))

        out: dict[str, AckMap] = {}
        for key, (raw, _stat) in self._call("read every ack", get_all):
            loc, _, worker = key.partition("/")
            acked = _decode_acks(raw)
            if acked is not None:
                out.setdefault(loc, {})[worker] = acked
        return out

    # -- sessions, watches and hints (the backend's own thread) ---------------------------

    def _on_state(self, state: str) -> None:
        """kazoo's connection thread: note the state, hand the rest to our thread, return."""
        if state == KazooState.CONNECTED:
            self._down_since = None
            self._live.set()
        else:
            if self._down_since is None:
                self._down_since = time.monotonic()
            self._live.clear()
        self._forget_workers()
        self._events.put(("state", state))

    def _watch(self, event: WatchedEvent) -> None:
        """kazoo's callback thread: enqueue and return."""
        path = event.path or ""
        if event.type == EventType.NONE or path.startswith(self.paths.workers):
            self._forget_workers()
        self._events.put(("watch", event))

    def _run(self) -> None:
        while True:
            wait = 1.0
            if self._acks_later:
                wait = min(wait, max(0.0, min(self._acks_later.values()) - time.monotonic()))
            try:
                batch = [self._events.get(timeout=wait)]
            except queue.Empty:
                batch = [("tick", None)]
            while True:
                try:
                    batch.append(self._events.get_nowait())
                except queue.Empty:
                    break
            if any(kind == "stop" for kind, _ in batch):
                return
            try:
                self._handle(batch)
            except Exception:  # keep the thread alive whatever a callback or a request did
                log.exception("zookeeper backend %s: event handling failed", self.params.chroot)

    def _handle(self, batch: list[tuple[str, object]]) -> None:
        hints: dict[tuple[str, str | None], Hint] = {}
        children_changed = False
        rearm: set[str] = set()
        for kind, arg in batch:
            if kind == "state":
                session = self._client.client_id if arg == KazooState.CONNECTED else None
                if session is not None:  # None: disconnected again already, wait for the next
                    if self._session_id is not None:
                        lost = session[0] != self._session_id
                        if lost:
                            self._need_restore = True
                        _add_resync(hints, session_lost=lost)
                    self._session_id = session[0]
                self._disarm()  # kazoo drops every watch when a connection breaks
            elif kind == "watch":
                event = cast(WatchedEvent, arg)
                if event.type == EventType.NONE or not self._armed:
                    continue
                hint, again = self._classify(event)
                if hint is not None:
                    hints[(hint.kind, hint.location)] = hint
                if event.path == self.paths.locations:
                    children_changed = True
                elif again and hint is not None and hint.kind == "acks":
                    self._acks_later.setdefault(event.path, time.monotonic() + _ACKS_COALESCE)
                elif again:
                    rearm.add(event.path)
        if not self._live.is_set():
            return
        if self._need_restore:
            self._restore_ephemerals()
        with self._lock:
            subscribed = bool(self._subscribers)
        if not subscribed:
            self._disarm()
            return
        if not self._armed:
            self._arm_all()
            if self._armed and self._missed:
                self._missed = False
                _add_resync(hints)
        else:
            if not self._acks_armed and self._wants_acks():
                # A subscriber that wants acks joined: watch every acknowledgement node now,
                # and hint every location's acks (they may have changed before the watches).
                self._acks_armed = True
                rearm |= {f"{self.paths.acks_root}/{n}" for n in self._watched}
                for n in self._watched:
                    hints[("acks", n)] = Hint(kind="acks", location=n)
            if children_changed:
                for h in self._refresh_locations():
                    hints[(h.kind, h.location)] = h
            now = time.monotonic()
            for path, due in list(self._acks_later.items()):
                if due <= now:  # set the watch again and hint what changed while it was not
                    del self._acks_later[path]
                    rearm.add(path)
                    name = path.rpartition("/")[2]
                    hints[("acks", name)] = Hint(kind="acks", location=name)
            # A changed location's watch is set again by reading it (get with a watch), and its
            # hint carries that record: subscribers need not read it themselves, one request
            # and one round trip fewer per subscriber and change. Other watches: send the
            # re-arming requests, then deliver, then wait for their answers: a session answers
            # in order, so any read a subscriber makes on this backend after the hint reaches
            # the server after the watch is set again (no change can slip between them).
            reads = self._send_reads({p for p in rearm if p.startswith(self._location_prefix)})
            pending = self._send_rearm(
                {p for p in rearm if not p.startswith(self._location_prefix)}
            )
            for name, rec in self._await_reads(reads):
                hints[("location", name)] = Hint(kind="location", location=name, record=rec)
            if hints:
                self._deliver(list(hints.values()))
                hints = {}
            self._await_rearm(pending)
            if self._armed:
                self._armed_event.set()  # a subscriber waits for the acks watches it asked for
        if hints:
            self._deliver(list(hints.values()))

    def _classify(self, event: WatchedEvent) -> tuple[Hint | None, bool]:
        """The hint a watch event stands for, and whether to arm the watch again."""
        pa = self.paths
        path = event.path
        parent, _, name = path.rpartition("/")
        if path == pa.locations:
            return None, False
        if path == pa.workers:
            return Hint(kind="workers"), True
        if parent == pa.locations:
            if event.type == EventType.DELETED:
                self._watched.discard(name)
                return Hint(kind="location", location=name), False
            return Hint(kind="location", location=name), True
        if parent == pa.acks_root:
            return Hint(kind="acks", location=name), self._acks_armed and name in self._watched
        return None, False

    def _watches_lost(self) -> None:
        """Setting watches failed: disarmed, armed again on the next tick or reconnection,
        then a ``resync`` hint covers whatever changed meanwhile."""
        self._disarm()
        self._missed = True

    def _disarm(self) -> None:
        self._armed = False
        self._acks_later.clear()  # every watch is set again by _arm_all, then a resync
        self._armed_event.clear()

    def _arm_all(self) -> None:
        """Watch everything again (after subscribe or a reconnection)."""
        pa = self.paths
        try:
            acks = self._wants_acks()
            names = self._get(self._client.get_children_async(pa.locations, watch=self._watch))
            pending = [self._client.get_children_async(pa.workers, watch=self._watch)]
            for name in names:
                path = f"{pa.locations}/{name}"
                pending.append(self._client.exists_async(path, watch=self._watch))
                if acks:
                    pending.append(
                        self._client.exists_async(f"{pa.acks_root}/{name}", watch=self._watch)
                    )
            for item in pending:
                self._get(item)
        except (KazooException, KazooTimeoutError) as exc:
            log.info("zookeeper backend %s: watches not armed yet: %s", pa.root, exc)
            self._missed = True  # a resync follows once they are
            return
        self._watched = set(names)
        self._acks_armed = acks
        self._armed = True
        self._armed_event.set()

    def _refresh_locations(self) -> list[Hint]:
        pa = self.paths
        try:
            names = set(self._get(self._client.get_children_async(pa.locations, watch=self._watch)))
        except (KazooException, KazooTimeoutError):
            self._watches_lost()
            return []
        added, removed = names - self._watched, self._watched - names
        acks = {f"{pa.acks_root}/{n}" for n in added} if self._acks_armed else set()
        self._rearm({f"{pa.locations}/{n}" for n in added} | acks)
        self._watched = names
        return [Hint(kind="location", location=n) for n in sorted(added | removed)]

    def _send_reads(self, paths: set[str]) -> list[tuple[str, Any]] | None:
        """Read changed locations with a watch set again (None if sending failed: disarmed)."""
        try:
            return [
                (p.rpartition("/")[2], self._client.get_async(p, watch=self._watch))
                for p in sorted(paths)
            ]
        except (KazooException, KazooTimeoutError):
            self._watches_lost()
            return None

    def _await_reads(
        self, pending: list[tuple[str, Any]] | None
    ) -> list[tuple[str, LocationStatus | None]]:
        """The records read by :meth:`_send_reads`: None in place of one that is gone, corrupt
        or unreadable (its hint then carries no record; a subscriber reads and sees why). A
        failed read disarms, as a failed re-arm does."""
        out: list[tuple[str, LocationStatus | None]] = []
        for name, item in pending or []:
            try:
                raw, stat = self._get(item)
            except NoNodeError:
                out.append((name, None))  # deleted meanwhile: its DELETED event follows
                continue
            except (KazooException, KazooTimeoutError):
                self._watches_lost()
                out.append((name, None))
                continue
            try:
                out.append((name, self._decode(name, raw, stat)))
            except LocstatusError:
                out.append((name, None))
        return out

    def _rearm(self, paths: set[str]) -> None:
        self._await_rearm(self._send_rearm(paths))

    def _send_rearm(self, paths: set[str]) -> list[Any] | None:
        """Send the requests that set the watches on ``paths`` again; None if sending failed
        (then disarmed: armed again on the next tick or reconnection, then a resync)."""
        try:
            return [
                self._client.get_children_async(p, watch=self._watch)
                if p == self.paths.workers
                else self._client.exists_async(p, watch=self._watch)
                for p in paths
            ]
        except (KazooException, KazooTimeoutError):
            self._watches_lost()
            return None

    def _await_rearm(self, pending: list[Any] | None) -> None:
        if pending is None:
            return
        try:
            for item in pending:
                self._get(item)
        except (KazooException, KazooTimeoutError):
            self._watches_lost()

    def _restore_ephemerals(self) -> None:
        """A new session: put back the worker registrations this backend wrote.

        Not their acknowledgements: written back from here they would race the agent's own
        (a copy taken before an acknowledgement, written after it, put the generation back
        and left a location pausing for good). The ``resync`` hint of a new session says
        ``session_lost``; agents acknowledge again what they applied, each against the
        record as it is then."""
        with self._lock:
            workers = list(self._my_workers.values())
        try:
            for info in workers:
                self._put_worker_node(self.paths.worker(info.worker_id), self._worker_bytes(info))
        except (LocstatusError, KazooException, KazooTimeoutError) as exc:
            log.warning("zookeeper backend %s: re-registration after session loss failed, "
                        "will retry: %s", self.paths.root, exc)
            return
        log.info("zookeeper backend %s: new session, re-registered %d worker(s)",
                 self.paths.root, len(workers))
        self._need_restore = False
        self._forget_workers()

    def _deliver(self, hints: list[Hint]) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for cb, kinds in subscribers:
            for hint in hints:
                if not _wants(kinds, hint.kind):
                    continue
                try:
                    cb(hint)
                except Exception:
                    log.exception("hint callback %r failed", cb)

    def _wants_acks(self) -> bool:
        with self._lock:
            return any(_wants(kinds, "acks") for _, kinds in self._subscribers)

    def subscribe(
        self, callback: HintCallback, *, kinds: Collection[str] | None = None
    ) -> Unsubscribe:
        """Deliver hints to ``callback`` on the backend's thread. Returns once the watches are
        armed (at most ``timeout`` seconds), so any change after that is hinted. The
        acknowledgement nodes are watched only while a subscriber wants ``acks`` hints."""
        self._check_open()
        entry = (callback, None if kinds is None else frozenset(kinds))
        with self._lock:
            self._subscribers.append(entry)
            if _wants(entry[1], "acks") and not self._acks_armed:
                self._armed_event.clear()  # set again once the acks watches are armed too
        self._events.put(("subscribe", None))
        if threading.current_thread() is not self._thread:
            self._armed_event.wait(self.params.timeout)

        def unsubscribe() -> None:
            with self._lock:
                if entry in self._subscribers:
                    self._subscribers.remove(entry)

        return unsubscribe

    # -- lifecycle -------------------------------------------------------------------------

    def probe_time(self) -> datetime:
        """The ensemble's time: the ``mtime`` the leader stamps on a write of ``<chroot>/clock``
        (milliseconds, the leader's clock when it proposed the write; docs/time.md). Fails at
        once, with :class:`BackendUnavailable`, while not connected: a time source keeps its
        last estimate meanwhile rather than wait."""
        self._check_open()
        if not self._live.is_set():
            raise BackendUnavailable(
                f"not connected to ZooKeeper {self.params.hosts} (connection "
                f"{self._client.state}): cannot read its time"
            )
        path = self.paths.clock

        def stamp() -> int:
            try:
                stat = self._get(self._client.set_async(path, b"", -1))
            except NoNodeError:
                with contextlib.suppress(NodeExistsError):
                    self._get(self._client.create_async(path, b""))
                stat = self._get(self._client.set_async(path, b"", -1))
            return int(stat.mtime)

        ms = self._call("read the server's time", stamp)
        return datetime.fromtimestamp(ms / 1000, UTC)

    def ping(self) -> None:
        self._check_open()
        if not self._live.is_set():
            raise BackendUnavailable(
                f"not connected to ZooKeeper {self.params.hosts} (connection {self._client.state})"
            )
        try:
            self._get(self._client.exists_async(self.paths.root))
        except (KazooException, KazooTimeoutError) as exc:
            raise self._unavailable("ping", exc) from exc

    def close(self) -> None:
        """Close the session (its ephemeral registrations and acks go with it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._events.put(("stop", None))
        thread = getattr(self, "_thread", None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        self._client.remove_listener(self._on_state)
        with contextlib.suppress(Exception):
            self._client.stop()
        with contextlib.suppress(Exception):
            self._client.close()
        self._live.clear()


def _add_resync(hints: dict[tuple[str, str | None], Hint], *, session_lost: bool = False) -> None:
    """Add a ``resync`` hint to a batch; one that says ``session_lost`` stays so."""
    earlier = hints.get(("resync", None))
    lost = session_lost or (earlier is not None and earlier.session_lost)
    hints[("resync", None)] = Hint(kind="resync", session_lost=lost)


def _wants(kinds: frozenset[str] | None, kind: str) -> bool:
    """Whether a subscriber that asked for ``kinds`` (None: every kind) gets ``kind`` hints;
    every subscriber gets ``resync``."""
    return kinds is None or kind in kinds or kind == "resync"


def _decode_acks(raw: bytes) -> dict[str, int] | None:
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and type(v) is int for k, v in data.items()
    ):
        log.warning("ignoring an unreadable acknowledgement: %r", raw[:200])
        return None
    return data
