"""The sidecar's change feed for HTTP workers (docs/http.md, "Workers over HTTP"): one
:class:`WatchHub` per app turns backend hints into numbered events that every watch stream
reads from.

Why it is shaped so:

- **One reader, one order.** Every read of a record the feed publishes is made by the hub's own
  thread, one after the other, so a later read is never older than an earlier one: the events of
  a location follow the order of its writes (a hint's read and a full re-read done in two
  threads could finish in the other order, and a worker would apply an older state last). A new
  stream's snapshot is taken by that thread too (a full re-read, shared by every stream that
  connects meanwhile), so a worker that just registered never starts from a record older than
  what the settle that could have left it out read (docs/design.md §3.4).
- **Level-triggered.** An event carries the whole record as read, never a delta: a worker that
  missed events converges from the next one or from a snapshot. Hints only say where to look
  (``location``: that one; ``resync``: everything); a full re-read every ``resync_interval``
  seconds makes a dropped hint cost latency only.
- **Numbered, bounded replay.** Events get ids ``<epoch>-<seq>`` (``epoch``: this hub's life;
  ``seq``: counts up from 1). The last ``buffer`` events are kept, so a stream that reconnects
  with ``Last-Event-ID`` resumes without loss; a cursor of another epoch, older than the buffer
  or ahead of it is :class:`StaleCursor`, which the route answers as 410 "re-list" (a
  Kubernetes watch's answer to a resourceVersion too old).
- **Removals.** A tombstone is published as ``removed`` with the generation the worker
  acknowledges it with (:func:`~locstatus.models.tombstone_generation`, service
  ``_tombstone``), a record that disappeared (purged) as ``removed`` with no record, as the
  Python agent's ``on_remove`` sees them (docs/agent.md "Tombstones").
- **Corrupt records are said, not skipped.** A record that does not parse or validate is
  published as a ``corrupt`` event (``{location, detail}``) when it is first read so, and listed
  under ``corrupt`` in a snapshot; the feed keeps the last good record it read of that location
  (nothing is applied from a corrupt one, as the Python agent does, docs/agent.md "What the
  agent guarantees") and the next good read is published even if it equals that one, so a
  worker can clear the error it reports (docs/http.md "Workers over HTTP").
- **Settles after HTTP acknowledgements** are the hub's too: an acknowledgement asks for a settle
  of its location ~20 ms later, so sixteen workers acknowledging at once cost one settle, not
  sixteen (the Python agents elect a settler for the same reason, docs/agent.md "Settle").
- Streams run on the server's event loop and wait on an :class:`asyncio.Event` the hub sets
  from its thread (``call_soon_threadsafe``); they never block the loop on a lock held across
  I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from locstatus.errors import CorruptRecord, LocstatusError, NotFound
from locstatus.manager import Manager
from locstatus.models import TOMBSTONE_ACK, Hint, LocationStatus, WorkerInfo, tombstone_generation

__all__ = ["Event", "StaleCursor", "StreamSlot", "TooManyStreams", "WatchHub"]

log = logging.getLogger("locstatus.api")

SETTLE_DELAY = 0.02
"""Seconds between an HTTP acknowledgement and the settle it asks for (coalescing window)."""


class StaleCursor(Exception):
    """A ``Last-Event-ID`` this hub cannot resume from: re-list (snapshot) instead."""


@dataclass(frozen=True)
class Event:
    """One event of the feed. ``kind``: ``location`` (``record`` is the record as read; with
    ``removed`` it is a tombstone), ``removed`` with no record (the location was purged),
    ``corrupt`` (``detail``: why the stored record of ``location`` cannot be read), or
    ``resync`` (``session_lost``: the backend's session was replaced and the acknowledgements
    held through it are gone: acknowledge again what was applied)."""

    seq: int
    kind: str
    location: str | None = None
    record: LocationStatus | None = None
    session_lost: bool = False
    detail: str | None = None

    def payload(self) -> dict[str, Any]:
        """The event's JSON data (``data:`` of the SSE event)."""
        if self.kind == "resync":
            return {"session_lost": self.session_lost}
        if self.kind == "corrupt":
            return {"location": self.location, "detail": self.detail}
        return location_payload(self.location or "", self.record)


def location_payload(location: str, record: LocationStatus | None) -> dict[str, Any]:
    """``{location, removed, remove_generation, record}``: what a worker applies for one
    location. ``remove_generation`` is what a removal is acknowledged with (service
    ``_tombstone``), None when there is nothing to acknowledge (purged, or not removed)."""
    removed = record is None or record.deleted
    remove_generation = (
        tombstone_generation(record.deleted_at)
        if record is not None and record.deleted_at is not None
        else None
    )
    return {
        "location": location,
        "removed": removed,
        "remove_generation": remove_generation,
        "remove_service": TOMBSTONE_ACK,
        "record": None if record is None else record.model_dump(mode="json"),
    }


class TooManyStreams(Exception):
    """A watch stream refused by a limit (the message names it); nothing was counted."""


@dataclass(frozen=True)
class StreamSlot:
    """One counted stream: its caller, principal (or None) and whether it is in the shared
    pool."""

    caller: str
    principal: str | None
    shared: bool


def _count_out(counts: dict[str, int], key: str) -> None:
    n = counts.get(key, 0) - 1
    if n > 0:
        counts[key] = n
    else:
        counts.pop(key, None)


@dataclass(eq=False)
class _Waiter:
    loop: asyncio.AbstractEventLoop
    event: asyncio.Event = field(default_factory=asyncio.Event)


class WatchHub:
    """The feed of one sidecar app. Started on first use (:meth:`ensure_started`), stopped by
    :meth:`close`.

    - ``buffer``: events kept for ``Last-Event-ID`` replay.
    - ``resync_interval``: seconds between full re-reads (safety net for dropped hints).
    - ``max_streams`` / ``max_streams_per_caller``: open watch streams this hub serves at most,
      in total and per caller (a worker id, a principal on ``/v1/watch``, a client address);
      :meth:`open_stream` refuses more (docs/http.md "Limits").
    - ``max_shared_streams``: the part of ``max_streams`` that streams without a token or of a
      ``read`` principal may hold together, so they cannot lock workers out.
    - ``max_streams_per_principal``: streams one principal holds at most over all its callers
      (its workers), unless its tokens-file entry sets ``max_streams``.
    """

    def __init__(
        self,
        mgr: Manager,
        *,
        buffer: int = 4096,
        resync_interval: float = 10.0,
        max_streams: int = 1024,
        max_streams_per_caller: int = 64,
        max_shared_streams: int = 256,
        max_streams_per_principal: int = 512,
    ) -> None:
        limits = (max_streams, max_streams_per_caller, max_shared_streams,
                  max_streams_per_principal)
        if buffer < 1 or resync_interval <= 0 or min(limits) < 1:
            raise ValueError("buffer, resync_interval and the stream limits must be positive")
        self.mgr = mgr
        self.epoch = uuid.uuid4().hex[:12]
        self.resync_interval = resync_interval
        self.max_streams = max_streams
        self.max_streams_per_caller = max_streams_per_caller
        self.max_shared_streams = max_shared_streams
        self.max_streams_per_principal = max_streams_per_principal
        self._cond = threading.Condition()
        self._events: deque[Event] = deque(maxlen=buffer)
        self._seq = 0
        self._cache: dict[str, LocationStatus] = {}
        self._corrupt: dict[str, str] = {}
        """location -> why its stored record cannot be read (as last read)."""
        self._dirty: set[str] = set()
        self._full_wanted = True
        self._full_started = 0
        self._full_done = 0
        self._session_lost = False
        self._settle_at: dict[str, float] = {}
        self._waiters: set[_Waiter] = set()
        self._streams: dict[str, int] = {}
        """caller -> open streams; principals and the shared pool are counted beside it."""
        self._principal_streams: dict[str, int] = {}
        self._shared_streams = 0
        self._thread: threading.Thread | None = None
        self._stop = False
        self._unsubscribe: Any = None
        self.started_at: dict[str, Any] = {}
        """worker id -> ``started_at`` of registrations made through this hub's app."""
        self.registrations: dict[str, WorkerInfo] = {}
        """worker id -> the registration this hub's app wrote last (acknowledgements check
        the worker's lease against it before reading the stored one)."""
        local = mgr.backend.local_reads  # SQLite, memory: a store on this host
        self.local_writes: contextlib.AbstractContextManager[Any] = (
            threading.Lock() if local else contextlib.nullcontext()
        )
        """Held around the worker routes' writes on a local store: threads of one process
        taking turns on SQLite's write lock wait for each other's sleeping busy handlers
        (16 concurrent acknowledgements: 200-650 ms, one at a time: ~50 ms in all)."""
        self.stats = {"events": 0, "full_reads": 0, "reads": 0, "settles": 0, "errors": 0}

    # -- lifecycle -------------------------------------------------------------------------

    def ensure_started(self) -> None:
        """Start the thread and the backend subscription (idempotent, thread-safe)."""
        with self._cond:
            if self._thread is not None or self._stop:
                return
            self._thread = threading.Thread(
                target=self._run, name="locstatus-watch-hub", daemon=True
            )
            self._thread.start()
        self._unsubscribe = self.mgr.backend.subscribe(
            self._on_hint, kinds=("location", "resync")
        )

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread and unsubscribe (idempotent). Open streams end at their next wake."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            thread = self._thread
        if self._unsubscribe is not None:
            with contextlib.suppress(Exception):
                self._unsubscribe()
            self._unsubscribe = None
        if thread is not None:
            thread.join(timeout)
        self._wake_streams()

    @property
    def closed(self) -> bool:
        return self._stop

    # -- what streams call -----------------------------------------------------------------

    def snapshot(
        self, timeout: float
    ) -> tuple[int, list[LocationStatus], dict[str, str]]:
        """A full re-read made by the hub's thread after this call (shared with every caller
        waiting meanwhile): ``(seq, records, corrupt)``, records tombstones included, sorted by
        location (for a corrupt location: the last good record read, if any), ``corrupt``:
        location -> why its record cannot be read; events after ``seq`` follow it. Blocking:
        call it from a worker thread. Raises :class:`TimeoutError` when the re-read did not
        finish within ``timeout`` seconds (the backend does not answer), :class:`RuntimeError`
        once closed."""
        self.ensure_started()
        deadline = time.monotonic() + timeout
        with self._cond:
            ticket = self._full_started + 1
            self._full_wanted = True
            self._cond.notify_all()
            while self._full_done < ticket:
                if self._stop:
                    raise RuntimeError("the watch hub is closed")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the backend did not answer the snapshot read in time")
                self._cond.wait(left)
            records = sorted(self._cache.values(), key=lambda r: r.location)
            return self._seq, records, dict(sorted(self._corrupt.items()))

    def cursor(self, last_event_id: str) -> int:
        """The ``seq`` a stream resumes after, from a ``Last-Event-ID``. Raises
        :class:`StaleCursor` for another epoch, a malformed id, or a cursor older than the
        buffer (events after it were dropped) or ahead of this hub."""
        epoch, _, seq_text = last_event_id.strip().rpartition("-")
        if epoch != self.epoch or not seq_text.isdigit():
            raise StaleCursor(
                f"event id {last_event_id[:64]!r} is not one of this sidecar's current feed "
                "(another sidecar, or this one restarted): re-list"
            )
        seq = int(seq_text)
        with self._cond:
            oldest = self._events[0].seq if self._events else self._seq + 1
            if seq > self._seq or seq < oldest - 1:
                raise StaleCursor(
                    f"event {seq} is no longer kept (the oldest kept is {oldest}): re-list"
                )
        return seq

    def events_after(self, seq: int) -> list[Event]:
        """Events with a number above ``seq``, oldest first. Raises :class:`StaleCursor` when
        some of them were dropped from the buffer (a stream that fell that far behind)."""
        with self._cond:
            if not self._events or self._events[-1].seq <= seq:
                return []
            oldest = self._events[0].seq
            if seq < oldest - 1:
                raise StaleCursor(f"the stream fell behind: event {seq + 1} was dropped")
            return [e for e in self._events if e.seq > seq]

    def event_id(self, seq: int) -> str:
        return f"{self.epoch}-{seq}"

    def waiter(self) -> _Waiter:
        """A waiter on the running event loop, set whenever events are added."""
        w = _Waiter(asyncio.get_running_loop())
        with self._cond:
            self._waiters.add(w)
        return w

    def drop_waiter(self, w: _Waiter) -> None:
        with self._cond:
            self._waiters.discard(w)

    def open_stream(
        self,
        caller: str,
        *,
        principal: str | None = None,
        principal_cap: int | None = None,
        shared: bool = False,
    ) -> StreamSlot:
        """Count a stream of ``caller`` in, before anything is read for it. ``principal``: the
        principal it is held by (capped at ``principal_cap``, else
        ``max_streams_per_principal``); ``shared``: a stream without a token or of a ``read``
        principal (the shared pool). Raises :class:`TooManyStreams` (nothing counted) naming
        the limit reached (docs/http.md "Limits")."""
        with self._cond:
            if sum(self._streams.values()) >= self.max_streams:
                raise TooManyStreams(
                    f"this sidecar serves at most {self.max_streams} watch streams"
                )
            if shared and self._shared_streams >= self.max_shared_streams:
                raise TooManyStreams(
                    f"streams without a token or of a read principal share "
                    f"{self.max_shared_streams} of this sidecar's {self.max_streams}"
                )
            if self._streams.get(caller, 0) >= self.max_streams_per_caller:
                raise TooManyStreams(
                    f"{caller} holds {self.max_streams_per_caller} streams, the most per caller"
                )
            if principal is not None:
                cap = principal_cap or self.max_streams_per_principal
                if self._principal_streams.get(principal, 0) >= cap:
                    raise TooManyStreams(
                        f"principal {principal!r} holds {cap} streams, its most "
                        "(its 'max_streams' in the tokens file)"
                    )
                self._principal_streams[principal] = self._principal_streams.get(principal, 0) + 1
            self._streams[caller] = self._streams.get(caller, 0) + 1
            self._shared_streams += shared
            return StreamSlot(caller, principal, shared)

    def close_stream(self, slot: StreamSlot) -> None:
        """Count out a stream :meth:`open_stream` counted in (once per slot)."""
        with self._cond:
            _count_out(self._streams, slot.caller)
            if slot.principal is not None:
                _count_out(self._principal_streams, slot.principal)
            self._shared_streams -= slot.shared

    def open_streams(self) -> int:
        with self._cond:
            return sum(self._streams.values())

    def settle_soon(self, location: str) -> None:
        """Ask for ``mgr.settle(location)`` about :data:`SETTLE_DELAY` seconds from now
        (coalesced with any already asked for)."""
        self.ensure_started()
        with self._cond:
            self._settle_at.setdefault(location, time.monotonic() + SETTLE_DELAY)
            self._cond.notify_all()

    # -- the thread ------------------------------------------------------------------------

    def _on_hint(self, hint: Hint) -> None:
        with self._cond:
            if hint.kind == "location" and hint.location is not None:
                self._dirty.add(hint.location)
            else:
                self._full_wanted = True
                self._session_lost = self._session_lost or hint.session_lost
            self._cond.notify_all()

    def _run(self) -> None:
        next_full = time.monotonic()
        while True:
            with self._cond:
                while not self._stop:
                    now = time.monotonic()
                    due = [loc for loc, at in self._settle_at.items() if at <= now]
                    if self._full_wanted or self._dirty or due or now >= next_full:
                        break
                    wake = min([next_full, *self._settle_at.values()])
                    self._cond.wait(max(0.0, wake - now))
                if self._stop:
                    return
                full = self._full_wanted or time.monotonic() >= next_full
                if full:
                    self._full_wanted = False
                    self._full_started += 1
                    ticket = self._full_started
                    dirty: set[str] = set()
                    self._dirty.clear()
                else:
                    dirty, self._dirty = self._dirty, set()
                session_lost, self._session_lost = self._session_lost, False
                for loc in due:
                    self._settle_at.pop(loc, None)
            try:
                if session_lost:
                    self._publish([("resync", None, None, "session_lost")])
                if full:
                    next_full = time.monotonic() + self.resync_interval
                    self._full_read()
                    with self._cond:
                        self._full_done = ticket
                        self._cond.notify_all()
                for loc in sorted(dirty):
                    self._read_one(loc)
                for loc in due:
                    self._settle(loc)
            except _Retry:
                pass  # logged where it failed; asked for again
            except Exception:  # never let the feed's thread die
                self.stats["errors"] += 1
                log.exception("watch hub: unexpected error; going on")
                with self._cond:
                    if full and self._full_done < ticket:
                        self._full_wanted = True  # a waiting snapshot gets the next one
                time.sleep(0.2)

    def _full_read(self) -> None:
        self.stats["full_reads"] += 1
        try:
            items = self.mgr.scan()
        except LocstatusError as exc:
            self.stats["errors"] += 1
            log.warning("watch hub: full read failed, retrying: %s", exc)
            with self._cond:
                self._full_wanted = True
            time.sleep(0.2)
            raise _Retry from exc
        seen: set[str] = set()
        changes: list[_Change] = []
        for item in items:
            seen.add(item.location)
            if isinstance(item, CorruptRecord):
                changes.append(("corrupt", item.location, None, item.detail))
            else:
                changes.append(("location", item.location, item, None))
        with self._cond:
            gone = [loc for loc in {*self._cache, *self._corrupt} if loc not in seen]
        changes.extend(("removed", loc, None, None) for loc in sorted(gone))
        self._publish(changes)

    def _read_one(self, location: str) -> None:
        self.stats["reads"] += 1
        try:
            rec: LocationStatus | None = self.mgr.backend.read(location)
        except NotFound:
            rec = None
        except CorruptRecord as exc:
            self._publish([("corrupt", location, None, exc.detail)])
            return
        except LocstatusError:
            self.stats["errors"] += 1
            with self._cond:
                self._dirty.add(location)  # read again on the next turn
            time.sleep(0.2)
            return
        if rec is None:
            self._publish([("removed", location, None, None)])
        else:
            self._publish([("location", location, rec, None)])

    def _publish(self, changes: Iterable[_Change]) -> None:
        """Number and keep the changes that say something new. ``(kind, location, record,
        detail)``; ``resync`` with a detail means ``session_lost``."""
        added = 0
        with self._cond:
            for kind, loc, rec, detail in changes:
                lost = False
                if kind == "location" and loc is not None and rec is not None:
                    old = self._cache.get(loc)
                    was_corrupt = self._corrupt.pop(loc, None) is not None
                    if old is not None and old == rec and not was_corrupt:
                        continue
                    self._cache[loc] = rec
                elif kind == "corrupt" and loc is not None:
                    if self._corrupt.get(loc) == detail:
                        continue  # said already
                    self._corrupt[loc] = detail or ""
                elif kind == "removed" and loc is not None:
                    known = self._cache.pop(loc, None) is not None
                    if self._corrupt.pop(loc, None) is None and not known:
                        continue  # not known: nothing to say
                elif kind == "resync":
                    lost = detail is not None
                self._seq += 1
                self._events.append(
                    Event(self._seq, kind, loc, rec, lost, detail if kind == "corrupt" else None)
                )
                added += 1
            self.stats["events"] += added
        if added:
            self._wake_streams()

    def _wake_streams(self) -> None:
        with self._cond:
            waiters = list(self._waiters)
        for w in waiters:
            with contextlib.suppress(RuntimeError):  # its loop closed
                w.loop.call_soon_threadsafe(w.event.set)

    def _settle(self, location: str) -> None:
        self.stats["settles"] += 1
        try:
            with self.local_writes:
                self.mgr.settle(location)
        except LocstatusError as exc:
            log.info("watch hub: settle of %s after an acknowledgement: %s", location, exc)


_Change = tuple[str, str | None, LocationStatus | None, str | None]
"""``(kind, location, record, detail)``: what :meth:`WatchHub._publish` numbers."""


class _Retry(Exception):
    """A full read failed on a backend error: the loop tries again."""
