"""The apply side of the agent: run the handlers for due work, acknowledge what was applied.

Each apply thread takes (location, service) keys from the due-work queue in the order they
became due, one location at a time (no two threads work on the same location: its keys wait
in the queue meanwhile), and, for each (docs/agent.md, "Acknowledge only what was applied"):

1. runs the handlers for the state read (``on_pause`` / ``on_resume``, or ``on_remove`` for
   a tombstone), unless they already succeeded for that generation;
2. hands the key to the acknowledging thread (:mod:`.acker`), which acknowledges it, with the
   other keys due, on the condition that the record is still at the version whose state was
   applied (``Backend.ack_many``, each item an ``ack(..., if_version=)``); the location stays
   busy until that is decided;
3. if the record moved, that thread reads it again and stores it: a newer generation comes
   back here and runs the handlers again before anything is acknowledged;
4. for a transitional state, a settle window opens once acknowledged (the watch thread
   settles, so the next handler never waits for it).

A failing handler (whatever it raises, ``BaseException`` included) is retried with
:class:`HandlerRetry` backoff and its error published; a backend error retries the key shortly
without running the handler again. While the worker is self-fenced (docs/agent.md
"Self-fencing") a key it runs is first stopped (``on_fence``, else ``on_pause``), nothing else
starts and nothing is acknowledged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from locstatus.agent.acker import Acker, Applied
from locstatus.agent.guard import IDLE_WAKE
from locstatus.agent.handlers import Applying, Handler, HandlerRetry, Handlers, handler_name
from locstatus.agent.lives import ask_lives
from locstatus.agent.queue import Key
from locstatus.agent.replica import PURGED
from locstatus.agent.state import FENCE, AgentState, Running
from locstatus.errors import (
    CorruptRecord,
    HandlerPending,
    LocstatusError,
    NotFound,
    VersionConflict,
)
from locstatus.logs import log_context
from locstatus.models import (
    TOMBSTONE_ACK,
    LocationStatus,
    ServiceStatus,
    tombstone_generation,
    utcnow,
)

if TYPE_CHECKING:
    from locstatus.manager import Manager

__all__ = ["Applier"]

log = logging.getLogger("locstatus.agent")


class Applier:
    """Runs one worker's handlers for the work queued in ``state`` and acknowledges it.

    ``deadline``: seconds after which a running handler is reported as stuck (the guard
    thread marks it, :mod:`.guard`).
    """

    def __init__(
        self,
        state: AgentState,
        manager: Manager,
        worker_id: str,
        handlers: Handlers,
        retry: HandlerRetry,
        *,
        deadline: float,
        on_interrupt: Callable[[], None],
        acker: Acker,
    ) -> None:
        self.state = state
        self.acker = acker
        """Acknowledges what the handlers applied, in batches (:mod:`.acker`)."""
        self.on_interrupt = on_interrupt
        """Called when a handler raised KeyboardInterrupt: the agent stops (docs/agent.md)."""
        self.manager = manager
        self.backend = manager.backend
        self.worker_id = worker_id
        self.handlers = handlers
        self.retry = retry
        self.deadline = deadline

    def run(self) -> None:
        """One apply thread's loop, until the agent stops. Several run at once; each takes
        the earliest due key of a location no other thread is working on."""
        s = self.state
        try:
            while True:
                with s.cond:
                    key = self._next_due()
                    if key is None:
                        return
                handed = False
                try:
                    with log_context(worker=self.worker_id, location=key[0], service=key[1]):
                        handed = self.apply(key)
                except Exception:  # pragma: no cover - a bug in the agent; retry, keep going
                    log.exception("agent %s: applying %s failed", self.worker_id, key)
                    with s.cond:
                        s.schedule_locked(key, -1, delay=self.retry.delay(3))
                finally:
                    with s.cond:
                        if not handed:  # else the acknowledging thread frees it
                            s.first_pass_discard_locked((key,))
                            s.busy.discard(key[0])
                            s.queue.release(key[0])
                            s.cond.notify()
        finally:
            self.handlers.close()

    def _next_due(self) -> Key | None:
        """Wait for the earliest due key of a location not busy, pop it and mark its location
        busy; None when stopping. Caller holds the lock (through the condition)."""
        s = self.state
        while not s.stopping.is_set():
            key = s.queue.pop(now=s.monotonic(), busy=s.busy)
            if key is not None:
                s.busy.add(key[0])
                return key
            at = s.queue.next_at()
            s.cond.wait(None if at is None else max(0.0, at - s.monotonic()))
        return None

    def apply(self, key: Key) -> bool:
        """Apply ``key`` once: its handlers, then its acknowledgement handed to the acknowledging
        thread (True: the location stays busy until that is decided)."""
        s = self.state
        location, service = key
        with s.lock:  # one look at the shared state per key: a burst has thousands of them
            stop = key in s.fence.to_stop
            rec = s.copy.records.get(location)
            purged = service == TOMBSTONE_ACK and location in s.copy.purged
            fenced = s.fence.fenced
            applied, handled_at = s.copy.applied.get(key), s.copy.handled.get(key)
        if stop:
            if not self._fence(key):
                return False
            with s.lock:
                rec = s.copy.records.get(location)
                purged = service == TOMBSTONE_ACK and location in s.copy.purged
                fenced = s.fence.fenced
                applied, handled_at = s.copy.applied.get(key), s.copy.handled.get(key)
        if purged:
            self._apply_purge(key)  # stops consumers: safe while fenced too
            return False
        if rec is None or fenced:
            return False  # fenced: nothing starts; lifting the fence plans everything again
        if service == TOMBSTONE_ACK:
            self._apply_removal(key, rec)
            return False
        st = rec.services.get(service)
        if rec.deleted or st is None:
            return False
        generation = st.generation
        if applied == generation:
            return False
        handled = handled_at == generation
        if not handled:
            handlers = self.handlers.for_state(service, paused=st.paused)
            if not self._run_handlers(key, handlers, st, generation):
                return False
        # Acknowledge only while the record is still the one whose state was applied: the
        # acknowledging thread writes it conditionally, with the others due (:mod:`.acker`);
        # if the record moved meanwhile it reads it, and a newer generation comes back here.
        self.acker.submit(Applied(key, generation, rec.version, st.state.transitional))
        return True

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

    def _fence(self, key: Key) -> bool:
        """Stop ``key`` for a self-fence: its ``on_fence`` handlers, else its ``on_pause``
        ones, with the status last read (:attr:`Agent.fencing` is True). On success nothing
        of it counts as applied any more (True); a failure is retried like any handler's."""
        s = self.state
        location, service = key
        with s.lock:
            rec = s.copy.records.get(location)
        status = None if rec is None else rec.services.get(service)
        handlers = self.handlers.for_fence(service)
        if not self._run_handlers(key, handlers, status, FENCE, fenced=True):
            return False
        with s.cond:
            s.fence.stopped(key)
            s.copy.stopped(key)
            lifted = s.try_unfence_locked()
        if lifted:
            log.warning("agent %s: fence lifted, re-applying", self.worker_id)
        return True

    def _apply_purge(self, key: Key) -> None:
        """``on_remove`` for a location that disappeared before this worker saw its removal
        (nothing to acknowledge: the record is gone). If it was created again meanwhile, its
        pause/resume handlers run again after this."""
        s = self.state
        location = key[0]
        if not self._run_handlers(key, self.handlers.for_removal(), None, PURGED):
            return
        with s.cond:
            s.copy.purged.discard(location)
            s.copy.handled.pop(key, None)
            s.copy.removed(location)
            s.fence.removed(location)  # what ran there is torn down: the fence may lift
            s.queue.succeeded(key)
            had_error = s.errors.pop(f"{location}/{key[1]}", None) is not None
            lifted = s.try_unfence_locked()
            again = s.copy.records.get(location)
            if again is not None and not lifted:
                s.store_locked(again)
        if had_error:
            s.beat_now.set()  # it no longer fails: clear the published error now
        if lifted:
            log.warning("agent %s: fence lifted, re-applying", self.worker_id)

    def _run_handlers(
        self,
        key: Key,
        handlers: Iterable[Handler],
        status: ServiceStatus | None,
        generation: int,
        *,
        fenced: bool = False,
    ) -> bool:
        """Run ``handlers`` for ``key``; on failure record the error, schedule a retry with
        backoff and return False. Any exception a handler raises is a handler error, including
        a ``BaseException`` (``asyncio.CancelledError``, ``SystemExit``): the apply thread
        never dies of one. ``KeyboardInterrupt`` is recorded, then stops the agent."""
        s = self.state
        location, service = key
        what = Applying(location, service, status)
        if fenced:
            event = "fence"
        else:
            event = "remove" if status is None else "pause" if status.paused else "resume"
        try:
            for fn in handlers:
                if not self._started(key, event, fn):
                    self._ended(key)
                    return False  # fenced meanwhile: lifting the fence plans it again
                log.info(
                    "agent %s: %s handler %s for %s/%s (generation %d)", self.worker_id, event,
                    handler_name(fn), location, service, generation,
                    extra={"event": event, "generation": generation,
                           "op_id": None if status is None else status.op_id,
                           "actor": None if status is None else status.actor},
                )
                self.handlers.call(fn, location, what, fence=fenced)
        except BaseException as exc:
            self._ended(key)
            with s.cond:
                s.metrics["handler_errors"] += 1
                count = s.queue.failed(key, generation)
                s.errors[f"{location}/{service}"] = f"{type(exc).__name__}: {exc}"[:1000]
                s.schedule_locked(key, generation, delay=self.retry.delay(count))
            if isinstance(exc, HandlerPending):  # a waiting state, not a failure: one line
                log.info(
                    "agent %s: handler for %s/%s (generation %d) not done yet (attempt %d): %s",
                    self.worker_id, location, service, generation, count, exc,
                )
            else:
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
            if isinstance(exc, KeyboardInterrupt):
                log.warning(
                    "agent %s: a handler raised KeyboardInterrupt: stopping", self.worker_id
                )
                self.on_interrupt()
            return False
        self._ended(key)
        with s.lock:
            s.metrics["handler_runs"] += 1
            if status is not None:
                s.copy.touched.add(location)
            if not fenced:
                s.copy.handled[key] = generation
                if status is not None and status.paused:
                    s.copy.running.discard(key)
                elif status is not None:
                    s.copy.running.add(key)
        return True

    def _started(self, key: Key, event: str, fn: Handler) -> bool:
        """A handler starts for ``key``: the guard watches its deadline. False (it must not
        start) for an ``on_resume`` once the worker is fenced: checked under the lock the
        fence is imposed under, so a fence either sees this handler running (and stops its
        key after it) or this handler sees the fence."""
        s = self.state
        run = Running(s.monotonic(), self._now(), event, handler_name(fn))
        with s.lock:
            if event == "resume" and s.fence.fenced:
                return False
            was_stuck = s.running.get(key, run).stuck
            s.running[key] = run
        if self.deadline < IDLE_WAKE:
            # A nearer deadline than the guard's next look at least every IDLE_WAKE seconds:
            # wake it to count from now (else it finds this one in time; a burst starts
            # thousands of handlers, and each wake-up takes the lock).
            s.guard_wake.set()
        if was_stuck:
            s.beat_now.set()  # the previous handler of this key was reported: it returned
        return True

    def _now(self) -> datetime:
        """The manager's time, for a report only (when a handler started); the local clock
        while the backend's time cannot be read at all (nothing is decided on it)."""
        try:
            return self.manager.clock()
        except LocstatusError:
            return utcnow()

    def _ended(self, key: Key) -> None:
        s = self.state
        with s.lock:
            run = s.running.pop(key, None)
        if run is not None and run.stuck:
            log.warning(
                "agent %s: handler %s for %s/%s returned after %.1fs (was stuck)",
                self.worker_id,
                run.handler,
                *key,
                s.monotonic() - run.started,
            )
            s.beat_now.set()  # no longer stuck: publish now

    def _reread(self, key: Key, generation: int) -> LocationStatus | None:
        """Read the record again after a handler ran. None: gone, unreachable (then the key
        is retried shortly; the handler is not run again for the same generation), or of
        another life of the location (its ``on_remove`` for the old one runs first, then the
        new one is planned: :meth:`AgentState.store_locked`)."""
        s = self.state
        location = key[0]
        try:
            fresh = self.backend.read(location)
            lives = ask_lives(s, self.backend, self.worker_id, [fresh])
        except NotFound:
            with s.cond:
                s.forget_locked(location)
            return None
        except CorruptRecord as exc:  # keep what was applied; nothing is acknowledged
            with s.lock:
                s.corrupt_locked(exc)
            log.warning("agent %s: %s", self.worker_id, exc)
            return None
        except LocstatusError as exc:
            self._backend_retry(key, generation, exc)
            return None
        with s.cond:
            if not s.store_locked(fresh, lives) or location in s.copy.purged:
                return None
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
        if s.fence.fenced:
            return False  # its lease may have lapsed: acknowledged again once it is back
        try:
            self.backend.ack(self.worker_id, location, service, generation, if_version=if_version)
        except VersionConflict:
            return None
        except CorruptRecord as exc:
            with s.lock:
                s.corrupt_locked(exc)
            return False
        except LocstatusError as exc:
            self._backend_retry(key, generation, exc)
            return False
        log.debug(
            "agent %s: acknowledged %s/%s generation %d", self.worker_id, location, service,
            generation, extra={"generation": generation},
        )
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
