"""The apply side of the agent: run the handlers for due work, acknowledge what was applied.

The apply thread takes (location, service) keys from the due-work queue in the order they
became due and, for each (docs/agent.md, "Acknowledge only what was applied"):

1. runs the handlers for the state read (``on_pause`` / ``on_resume``, or ``on_remove`` for
   a tombstone), unless they already succeeded for that generation;
2. acknowledges on the condition that the record is still at the version whose state was
   applied (``Backend.ack(..., if_version=)``, one write);
3. if the record moved, reads it again: a newer generation runs the handlers again before
   anything is acknowledged;
4. for a transitional state, opens a settle window (the watch thread settles, so the next
   handler never waits for it).

A failing handler is retried with :class:`HandlerRetry` backoff and its error published; a
backend error retries the key shortly without running the handler again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from locstatus.agent.handlers import Applying, Handler, HandlerRetry, Handlers
from locstatus.agent.queue import Key
from locstatus.agent.settle import is_settler
from locstatus.agent.state import AgentState
from locstatus.errors import LocstatusError, NotFound, VersionConflict
from locstatus.models import (
    TOMBSTONE_ACK,
    LocationStatus,
    ServiceStatus,
    tombstone_generation,
)

if TYPE_CHECKING:
    from locstatus.manager import Manager

__all__ = ["Applier"]

log = logging.getLogger("locstatus.agent")


class Applier:
    """Runs one worker's handlers for the work queued in ``state`` and acknowledges it."""

    def __init__(
        self,
        state: AgentState,
        manager: Manager,
        worker_id: str,
        handlers: Handlers,
        retry: HandlerRetry,
    ) -> None:
        self.state = state
        self.manager = manager
        self.backend = manager.backend
        self.worker_id = worker_id
        self.handlers = handlers
        self.retry = retry
        self.applying: Applying | None = None
        """Inside a handler: what it applies (:attr:`Agent.applying`)."""

    def run(self) -> None:
        """The apply loop, until the agent stops."""
        s = self.state
        try:
            while True:
                with s.cond:
                    key = self._next_due()
                    if key is None:
                        return
                try:
                    self.apply(key)
                except Exception:  # pragma: no cover - a bug in the agent; retry, keep going
                    log.exception("agent %s: applying %s failed", self.worker_id, key)
                    with s.cond:
                        s.schedule_locked(key, -1, delay=self.retry.delay(3))
                finally:
                    with s.lock:
                        s.first_pass_discard_locked((key,))
        finally:
            self.handlers.close()

    def _next_due(self) -> Key | None:
        """Wait for the earliest due key and pop it; None when stopping. Caller holds the
        lock (through the condition)."""
        s = self.state
        while not s.stopping.is_set():
            key = s.queue.pop(now=s.monotonic())
            if key is not None:
                return key
            at = s.queue.next_at()
            s.cond.wait(None if at is None else max(0.0, at - s.monotonic()))
        return None

    def apply(self, key: Key) -> None:
        """Apply ``key`` once: handlers, acknowledgement, re-read until it is current."""
        s = self.state
        location, service = key
        with s.lock:
            rec = s.copy.records.get(location)
        if rec is None:
            return
        if service == TOMBSTONE_ACK:
            self._apply_removal(key, rec)
            return
        while True:
            st = rec.services.get(service)
            if rec.deleted or st is None:
                return
            generation = st.generation
            with s.lock:
                if s.copy.applied.get(key) == generation:
                    return
                handled = s.copy.handled.get(key) == generation
            if not handled:
                handlers = self.handlers.for_state(service, paused=st.paused)
                if not self._run_handlers(key, handlers, st, generation):
                    return
            # Acknowledge only while the record is still the one whose state was applied: one
            # conditional write. If it moved meanwhile, read it; a newer generation runs the
            # handler again before anything is acknowledged.
            acked = self._acknowledge(key, generation, if_version=rec.version)
            if acked is None:
                fresh = self._reread(key, generation)
                if fresh is None:
                    return
                now_st = fresh.services.get(service)
                if fresh.deleted or now_st is None:
                    return
                if now_st.generation != generation:
                    # The state moved while the handler ran: apply the newer one first.
                    s.count("handler_reruns")
                rec = fresh
                continue
            if not acked:
                return
            if st.state.transitional:
                settler = self._is_settler(location, service)
                with s.lock:
                    s.settle.acknowledged(location, settler=settler, now=s.monotonic())
                s.wake.set()
            return

    def _is_settler(self, location: str, service: str) -> bool:
        """True when this worker settles ``location`` first among the live workers that apply
        ``service`` there (:func:`is_settler`). True as well when the workers cannot be read."""
        try:
            workers = self.backend.workers()
        except LocstatusError:
            return True
        now = self.manager.clock()
        live = (w.worker_id for w in workers if w.alive(now) and w.applies(location, service))
        return is_settler(location, self.worker_id, live)

    def _apply_removal(self, key: Key, rec: LocationStatus) -> None:
        s = self.state
        location = key[0]
        if rec.deleted_at is None:
            return
        removal = tombstone_generation(rec.deleted_at)
        with s.lock:
            if s.copy.applied.get(key) == removal:
                return
            handled = s.copy.handled.get(key) == removal
        if not handled:
            if not self._run_handlers(key, self.handlers.for_removal(), None, removal):
                return
            with s.lock:
                s.copy.removed(location)
        fresh = self._reread(key, removal)
        if fresh is None or fresh.deleted_at != rec.deleted_at:
            return  # purged, unreachable (retried), restored or removed again (due again)
        self._acknowledge(key, removal)

    def _run_handlers(
        self, key: Key, handlers: Iterable[Handler], status: ServiceStatus | None, generation: int
    ) -> bool:
        """Run ``handlers`` for ``key``; on failure record the error, schedule a retry with
        backoff and return False."""
        s = self.state
        location, service = key
        self.applying = Applying(location, service, status)
        try:
            for fn in handlers:
                self.handlers.call(fn, location)
        except Exception as exc:
            self.applying = None
            with s.cond:
                s.metrics["handler_errors"] += 1
                count = s.queue.failed(key, generation)
                s.errors[f"{location}/{service}"] = f"{type(exc).__name__}: {exc}"[:1000]
                s.schedule_locked(key, generation, delay=self.retry.delay(count))
            log.warning(
                "agent %s: handler for %s/%s (generation %d) failed (attempt %d): %s",
                self.worker_id,
                location,
                service,
                generation,
                count,
                exc,
                exc_info=exc,
            )
            s.beat_now.set()  # publish the error now, not at the next heartbeat
            return False
        self.applying = None
        with s.lock:
            s.metrics["handler_runs"] += 1
            s.copy.handled[key] = generation
        return True

    def _reread(self, key: Key, generation: int) -> LocationStatus | None:
        """Read the record again after a handler ran. None: gone, or unreachable (then the key
        is retried shortly; the handler is not run again for the same generation)."""
        s = self.state
        location = key[0]
        try:
            fresh = self.backend.read(location)
        except NotFound:
            with s.cond:
                s.forget_locked(location)
            return None
        except LocstatusError as exc:
            self._backend_retry(key, generation, exc)
            return None
        with s.cond:
            s.store_locked(fresh)
        return fresh

    def _acknowledge(
        self, key: Key, generation: int, *, if_version: int | None = None
    ) -> bool | None:
        """True: acknowledged. False: not now (stopping, or a backend error: retried later).
        None: the record is no longer at ``if_version`` (nothing written; read it again)."""
        s = self.state
        location, service = key
        if s.stopping.is_set():
            return False  # stop() unregisters this worker; never ack after that
        try:
            self.backend.ack(self.worker_id, location, service, generation, if_version=if_version)
        except VersionConflict:
            return None
        except LocstatusError as exc:
            self._backend_retry(key, generation, exc)
            return False
        with s.lock:
            s.metrics["acks"] += 1
            s.copy.applied[key] = generation
            s.copy.handled.pop(key, None)
            s.queue.succeeded(key)
            had_error = s.errors.pop(f"{location}/{service}", None) is not None
        if had_error:
            s.beat_now.set()  # clear the published error now
        return True

    def _backend_retry(self, key: Key, generation: int, exc: LocstatusError) -> None:
        log.warning("agent %s: %s/%s: backend error, retrying: %s", self.worker_id, *key, exc)
        with self.state.cond:
            self.state.metrics["backend_errors"] += 1
            self.state.schedule_locked(key, generation, delay=self.retry.delay(1))
