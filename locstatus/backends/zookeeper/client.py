"""One kazoo session and its single error edge: every request of the backend goes through
:class:`ZkClient`, which bounds it in time and turns kazoo's errors into locstatus errors.

Why it is shaped so (the client line of kazoo's protocol/client split; MongoDB's ``Store.io`` is
the same idea): a kazoo error means different things by where it happens, and deciding it in each
call had drifted. Here, once:

- **Reads and idempotent writes** (:meth:`ZkClient.call`) are retried on connection errors only,
  with a bounded :class:`~kazoo.retry.KazooRetry`, for at most ``timeout`` seconds; then
  :class:`BackendUnavailable` naming the hosts and the connection state.
- **Known down, answered at once**: while the connection is SUSPENDED or LOST, every call
  (each retry attempt too) waits for it only until :data:`~locstatus.backends.base.DOWN_GRACE`
  seconds after it went down, then fails with :class:`BackendUnavailable`, nothing sent: a blip
  is ridden through, an outage answered within a second, never after the full ``timeout``
  (docs/reliability.md, "Failing fast while the backend is down").
- **Transactions** (:meth:`ZkClient.commit`) are sent once, and only while connected (waiting
  as above), nothing sent otherwise. A multi-op sent whose answer is lost (ConnectionLoss,
  SessionExpired, timeout) raises :class:`AmbiguousCommit` (outcome unknown); one the server
  refused returns its :class:`~locstatus.backends.zookeeper.txn.Refusal` (nothing applied).
- **Refused credentials** (NoAuth, AuthFailed) say which ACL and how to give its credentials.
- **Size**: ZooKeeper refuses requests above ``jute.maxbuffer`` (1 MB) by dropping the
  connection; writes are measured first (:meth:`ZkClient.check_size`) and refused with
  :class:`InvalidInput` above ``max_bytes``.
- **Bulk reads** (:meth:`ZkClient.get_many`) ask for many nodes per request with ZooKeeper's
  multiRead (:mod:`~locstatus.backends.zookeeper.multiread`), pipelined; a server that does not
  know it (before 3.6) is read node by node from its first refusal on.
- **ACLs**: with credentials every node is created with a digest ACL giving that user all rights
  (plus world read unless ``world_read=false``), so other tenants of the ensemble cannot write
  locstatus nodes.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, TypeVar, cast

from kazoo.client import KazooClient
from kazoo.exceptions import (
    AuthFailedError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
    UnimplementedError,
    ZookeeperError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import ZnodeStat
from kazoo.retry import KazooRetry, RetryFailedError
from kazoo.security import ACL, make_acl, make_digest_acl

from locstatus.backends.base import DOWN_GRACE
from locstatus.backends.urls import redact_url
from locstatus.backends.zookeeper.multiread import MultiRead, requests
from locstatus.backends.zookeeper.txn import Refusal, Transaction, refusal
from locstatus.backends.zookeeper.url import AUTH_ENV, ZkParams
from locstatus.errors import AmbiguousCommit, BackendUnavailable, InvalidInput, LocstatusError

T = TypeVar("T")
log = logging.getLogger(__name__)

BATCH = 1000
"""Asynchronous requests in flight at once in bulk reads."""
READS_IN_FLIGHT = 5
"""MultiRead requests in flight at once in :meth:`ZkClient.get_many` (a thousand nodes, as
:data:`BATCH` node reads)."""
_POLL = 0.05
"""Seconds between looks at the connection while waiting for pipelined answers."""
_RETRYABLE = KazooRetry.RETRY_EXCEPTIONS + KazooRetry.EXPIRED_EXCEPTIONS


class ZkClient:
    """The kazoo client of one backend: its session, its connection state and its error edge.

    ``live`` is set while connected (by the backend's state listener, on kazoo's thread,
    through :meth:`connected` and :meth:`disconnected`); ``closed`` once the backend closed. Usage::

        client = ZkClient(parse_zk_url(url), url)
        client.start(listener)                        # BackendUnavailable if nobody answers
        raw, stat = client.call("read x", lambda: client.get(client.kazoo.get_async(path)))
    """

    def __init__(self, params: ZkParams, url: str) -> None:
        self.params = p = params
        self.where = redact_url(url)
        self.acl: list[ACL] | None = None
        auth_data: list[tuple[str, str]] | None = None
        if p.auth is not None:
            user, password = p.auth
            self.acl = [make_digest_acl(user, password, all=True)]
            if p.world_read:
                self.acl.append(make_acl("world", "anyone", read=True))
            auth_data = [("digest", f"{user}:{password}")]
        self.kazoo = KazooClient(
            hosts=p.hosts,
            timeout=p.session_timeout,
            default_acl=self.acl,
            auth_data=auth_data,
            connection_retry=KazooRetry(
                max_tries=-1, delay=0.05, backoff=2, max_delay=1.0, max_jitter=0.3
            ),
            command_retry=KazooRetry(max_tries=0),
        )
        self.live = threading.Event()
        self.down_since: float | None = None
        """Monotonic time the connection went down; None while connected."""
        self.closed = False
        self.multiread: bool | None = None
        """Whether the server answers multiRead: None until asked, False once it refused it."""

    # -- session -----------------------------------------------------------------------------

    def start(self, listener: Callable[[str], None]) -> None:
        """Connect within ``timeout`` seconds, ``listener`` told of every state change.
        Raises :class:`BackendUnavailable` naming the hosts (nothing left running)."""
        p = self.params
        self.kazoo.add_listener(listener)
        try:
            self.kazoo.start(timeout=p.timeout)
        except (KazooTimeoutError, KazooException, OSError) as exc:
            self.kazoo.remove_listener(listener)
            with contextlib.suppress(Exception):
                self.kazoo.stop()
                self.kazoo.close()
            raise BackendUnavailable(
                f"cannot connect to ZooKeeper {p.hosts} within {p.timeout:g}s "
                f"({type(exc).__name__}: {exc})"
            ) from exc

    def stop(self, listener: Callable[[str], None]) -> None:
        """Close the session (its ephemeral nodes go with it). Idempotent."""
        self.closed = True
        self.kazoo.remove_listener(listener)
        with contextlib.suppress(Exception):
            self.kazoo.stop()
        with contextlib.suppress(Exception):
            self.kazoo.close()
        self.live.clear()

    def connected(self) -> None:
        """The connection is up (kazoo's CONNECTED)."""
        self.down_since = None
        self.live.set()

    def disconnected(self) -> None:
        """The connection is down (SUSPENDED or LOST): calls fail fast from now on."""
        if self.down_since is None:
            self.down_since = time.monotonic()
        self.live.clear()

    @property
    def session_id(self) -> int | None:
        """The id of the current session, None while there is none."""
        session = self.kazoo.client_id
        return None if session is None else cast(int, session[0])

    # -- requests and their errors ---------------------------------------------------------

    def check_open(self) -> None:
        if self.closed:
            raise BackendUnavailable(f"backend {self.where} is closed")

    def get(self, async_result: Any) -> Any:
        """The answer of an asynchronous request, waited for at most ``timeout`` seconds."""
        return async_result.get(timeout=self.params.timeout)

    def unavailable(self, what: str, exc: BaseException) -> BackendUnavailable:
        """The :class:`BackendUnavailable` of kazoo error ``exc`` met while doing ``what``."""
        p = self.params
        if isinstance(exc, (NoAuthError, AuthFailedError)):
            creds = "with the configured credentials" if p.auth else "without credentials"
            return BackendUnavailable(
                f"ZooKeeper {p.hosts} refused to {what} under {p.chroot} {creds} "
                f"({type(exc).__name__}): the chroot is protected by a digest ACL; give its "
                f"credentials as zk://user:password@host/chroot or {AUTH_ENV}=user:password"
            )
        if isinstance(exc, (RetryFailedError, KazooTimeoutError, ConnectionLoss,
                            SessionExpiredError)):
            return BackendUnavailable(
                f"ZooKeeper {p.hosts} did not answer ({what}) within {p.timeout:g}s "
                f"(connection {self.kazoo.state}; {type(exc).__name__})"
            )
        if isinstance(exc, ConnectionClosedError) or self.closed:
            return BackendUnavailable(f"backend {self.where} is closed")
        return BackendUnavailable(
            f"ZooKeeper {p.hosts}: {what} failed: {type(exc).__name__} {exc}".rstrip()
        )

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` (a read, or an idempotent write) retrying connection errors only, for at
        most ``timeout`` seconds; then :class:`BackendUnavailable`. A locstatus error ``fn``
        raises passes through. While the connection is known down, each attempt waits for it
        only as :meth:`wait_live` does."""
        self.check_open()
        self.wait_live(what)

        def attempt() -> T:
            self.wait_live(what)
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
            raise self.unavailable(what, exc) from exc

    def wait_connected(self, what: str) -> None:
        """Block until connected (:meth:`wait_live`): writes are never queued while
        SUSPENDED. Raises :class:`BackendUnavailable` (nothing was sent)."""
        self.check_open()
        self.wait_live(what, written=True)

    def wait_live(self, what: str, *, written: bool = False) -> None:
        """Return at once while connected; while the connection is known down, wait for it
        until :data:`DOWN_GRACE` seconds after it went down, then raise
        :class:`BackendUnavailable` (nothing was sent)."""
        if self.live.is_set():
            return
        since = self.down_since
        left = DOWN_GRACE if since is None else since + DOWN_GRACE - time.monotonic()
        if left > 0 and self.live.wait(left):
            return
        down = 0.0 if since is None else time.monotonic() - since
        raise BackendUnavailable(
            f"not connected to ZooKeeper {self.params.hosts} (connection {self.kazoo.state} "
            f"for {down:.1f}s); {what}: " + ("nothing was written" if written else "not sent")
        )

    def transaction(self) -> Transaction:
        return Transaction(self.kazoo)

    def commit(self, what: str, txn: Transaction) -> Refusal | None:
        """Send a transaction once, when connected. Returns None when it applied, its
        :class:`Refusal` when the server refused it (nothing applied). Raises
        :class:`AmbiguousCommit` when the answer was lost after sending (outcome unknown),
        :class:`BackendUnavailable` when it was not sent or the credentials were refused."""
        self.wait_connected(what)
        return self._settled(what, txn, lambda: self.get(txn.tx.commit_async()))

    def _settled(
        self, what: str, txn: Transaction, results_of: Callable[[], Any]
    ) -> Refusal | None:
        """The outcome of ``txn`` from ``results_of()`` (its results, waited for): see
        :meth:`commit`."""
        try:
            results = results_of()
        except (ConnectionLoss, SessionExpiredError, KazooTimeoutError) as exc:
            raise AmbiguousCommit(
                f"ZooKeeper {self.params.hosts}: connection lost after {what} was sent "
                f"({type(exc).__name__}); its outcome is unknown"
            ) from exc
        except (NoAuthError, AuthFailedError, ConnectionClosedError) as exc:
            raise self.unavailable(what, exc) from exc
        except ZookeeperError as exc:  # a whole-request error: nothing was applied
            return Refusal("transaction", exc)
        refused = refusal(results, txn.labels)
        if refused is not None and isinstance(refused.error, (NoAuthError, AuthFailedError)):
            raise self.unavailable(what, refused.error)
        return refused

    def commit_many(
        self, what: Callable[[int], str], txns: Iterable[Transaction]
    ) -> list[Refusal | LocstatusError | None]:
        """Send several transactions at once, pipelined on the session (each its own multi-op,
        applied or refused alone; ``what(i)`` names the ``i``-th, once it was produced), when
        connected, and collect each outcome as :meth:`commit` decides it, an error as a value:
        :class:`AmbiguousCommit` for one whose answer was lost, :class:`BackendUnavailable`
        for one not sent. Raises nothing for one transaction. ``txns`` may be an iterator
        that builds each transaction as it is asked for: each is sent as soon as it is built,
        so the server works on the first while the next are built.

        The answers are waited for with one deadline for all (``timeout`` seconds from the
        send), and no longer once the connection is known down (:data:`DOWN_GRACE` after it
        went down): a multi-op kazoo queued after it dropped the connection is answered only
        when a connection is back, so waiting for each in turn with the full ``timeout``
        hung a bulk for minutes when the server died (docs/reliability.md, "Failing fast
        while the backend is down"). Each still unanswered then is an
        :class:`AmbiguousCommit` (it may be sent when the connection is back)."""
        produced = iter(txns)
        first = next(produced, None)
        if first is None:
            return []
        try:
            self.wait_connected(what(0))
        except BackendUnavailable as exc:
            return [exc] * (1 + sum(1 for _ in produced))
        built: list[Transaction] = []
        sent: list[Any] = []
        for i, txn in enumerate(itertools.chain((first,), produced)):
            built.append(txn)
            if not self.live.is_set():  # dropped while sending: send no more
                sent.append(BackendUnavailable(
                    f"ZooKeeper {self.params.hosts}: the connection dropped before "
                    f"{what(i)} was sent; nothing was written"
                ))
                continue
            try:
                sent.append(txn.tx.commit_async())
            except (KazooException, OSError) as exc:  # not queued: nothing sent
                sent.append(self.unavailable("a pipelined write", exc))
        deadline = time.monotonic() + self.params.timeout
        out: list[Refusal | LocstatusError | None] = []
        for i, (txn, pending) in enumerate(zip(built, sent, strict=True)):
            if isinstance(pending, LocstatusError):
                out.append(pending)
                continue
            if not self._answered(pending, deadline):
                out.append(AmbiguousCommit(
                    f"ZooKeeper {self.params.hosts}: no answer to {what(i)} "
                    f"(connection {self.kazoo.state}); its outcome is unknown"
                ))
                continue
            try:
                out.append(self._settled(what(i), txn, partial(pending.get, timeout=0)))
            except LocstatusError as exc:
                out.append(exc)
        return out

    def _answered(self, pending: Any, deadline: float) -> bool:
        """Wait for ``pending`` (a kazoo async result) until ``deadline`` (monotonic) or until
        the connection has been down :data:`DOWN_GRACE` seconds; True once it is answered."""
        while not pending.ready():
            now = time.monotonic()
            since = self.down_since
            if now >= deadline or self.closed or (
                since is not None and now - since >= DOWN_GRACE
            ):
                return bool(pending.ready())
            pending.wait(min(_POLL, deadline - now))
        return True

    def check_size(self, location: str, what: str, *parts: bytes) -> None:
        """Refuse a write of ``parts`` above ``max_bytes`` (:class:`InvalidInput`, nothing
        sent): ZooKeeper would drop the connection instead of answering."""
        size = sum(len(x) for x in parts)
        if size > self.params.max_bytes:
            raise InvalidInput(
                f"location {location!r}: {what} of {size} bytes exceeds the ZooKeeper node "
                f"limit of {self.params.max_bytes} bytes (jute.maxbuffer is 1 MB); nothing "
                "was written"
            )

    # -- bulk requests (inside a call) -------------------------------------------------------

    def ensure(self, paths: Iterable[str]) -> None:
        """Create the persistent nodes ``paths`` (and their parents) if missing."""
        for path in paths:
            with contextlib.suppress(NodeExistsError):
                self.get(self.kazoo.create_async(path, b"", makepath=True))

    def bulk(self, keys: Sequence[str], start: Callable[[str], Any]) -> list[tuple[str, Any]]:
        """Pipelined requests: ``start(key)`` for every key, :data:`BATCH` in flight at a time.
        Keys whose node vanished meanwhile (NoNode) are left out."""
        out: list[tuple[str, Any]] = []
        for i in range(0, len(keys), BATCH):
            chunk = [(k, start(k)) for k in keys[i : i + BATCH]]
            for key, pending in chunk:
                try:
                    out.append((key, self.get(pending)))
                except NoNodeError:
                    continue
        return out

    def get_many(self, paths: Sequence[str]) -> list[tuple[bytes, ZnodeStat] | None]:
        """The data and stat of each of ``paths``, in order (None: no such node), each as its
        own ``get`` would give it at the moment the server reads it: multiRead requests
        (:func:`~.multiread.requests`: at most ``max_bytes`` each), :data:`READS_IN_FLIGHT` in
        flight at a time; node by node (:meth:`get_each`) on a server that does not know
        multiRead, known by its answer to the first one (it closes the connection after it:
        the next request waits for the reconnection as any does). Any other error of a node
        (NoAuth) or of a request (connection lost) raises as a ``get``'s would, for
        :meth:`call` to decide."""
        if self.multiread is False:
            return self.get_each(paths)
        root = self.kazoo.chroot
        full = [root + p for p in paths] if root else paths
        out: list[tuple[bytes, ZnodeStat] | None] = []
        pending: deque[Any] = deque()
        try:
            for run in requests(full, self.params.max_bytes):
                pending.append(self._multiread(run))
                if self.multiread is None or len(pending) >= READS_IN_FLIGHT:
                    self._answers(pending.popleft(), out)
                    self.multiread = True
            while pending:
                self._answers(pending.popleft(), out)
        except UnimplementedError:
            log.info("ZooKeeper %s does not answer multiRead (before 3.6): bulk reads go "
                     "node by node", self.params.hosts)
            self.multiread = False
            return self.get_each(paths)
        return out

    def _multiread(self, paths: Sequence[str]) -> Any:
        """Send one multiRead of ``paths``; its kazoo async result."""
        result = self.kazoo.handler.async_result()
        self.kazoo._call(MultiRead(paths), result)
        return result

    def _answers(self, pending: Any, out: list[tuple[bytes, ZnodeStat] | None]) -> None:
        """Wait for the answers of one multiRead and add them to ``out``."""
        for answer in self.get(pending):
            if isinstance(answer, NoNodeError):
                out.append(None)
            elif isinstance(answer, Exception):
                raise answer
            else:
                out.append(answer)

    def get_each(self, paths: Sequence[str]) -> list[tuple[bytes, ZnodeStat] | None]:
        """:meth:`get_many` with one pipelined ``get`` per node, :data:`BATCH` in flight."""
        out: list[tuple[bytes, ZnodeStat] | None] = []
        get_async = self.kazoo.get_async
        for i in range(0, len(paths), BATCH):
            for pending in [get_async(p) for p in paths[i : i + BATCH]]:
                try:
                    out.append(self.get(pending))
                except NoNodeError:
                    out.append(None)
        return out

    def delete_tree(self, path: str) -> None:
        """Delete ``path`` and everything below it, pipelined level by level. NoNode is fine."""
        kazoo = self.kazoo
        levels: list[list[str]] = [[path]]
        while levels[-1]:
            listed = self.bulk(levels[-1], lambda p: kazoo.get_children_async(p))
            levels.append([f"{parent}/{c}" for parent, kids in listed for c in kids])
        for level in reversed(levels[:-1]):
            for i in range(0, len(level), BATCH):
                pending = [kazoo.delete_async(p) for p in level[i : i + BATCH]]
                for item in pending:
                    with contextlib.suppress(NoNodeError, NotEmptyError):
                        self.get(item)
