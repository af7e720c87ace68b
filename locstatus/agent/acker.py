"""The acknowledging side of the agent: what the apply threads applied, acknowledged in batches.

Why it is shaped so: a bulk change (a pause of every location) reaches a worker as a burst of
thousands of keys. Acknowledged one at a time, each key cost its own conditional write (an
SQLite transaction with its fsync, a ZooKeeper round trip) and its own read of the worker
list (who settles it), and 16 workers acknowledging 10 000 locations spent minutes where the
pause's own write took a fraction of a second (docs/agent.md "Bursts"). So an apply thread
that has run a key's handlers hands the key here and takes the next one; this thread takes
every key handed over since its last write and acknowledges them with one
``Backend.ack_many`` (each still conditional on the version whose state was applied), reads
the worker list once for the whole batch, and reads the records of the refused ones with one
``Backend.read_many``. Keys handed over while a batch is written form the next batch, so the
batches grow with the burst and stay single keys when changes come one at a time.

Each key keeps the guarantees of docs/agent.md "What the agent guarantees": its location stays
busy (no other handler of it runs) until its acknowledgement is decided; a refused one (the
record moved while the handler ran) is read again and stored, which plans the key again: a
newer generation runs the handlers again, the same one is acknowledged again at the version
read, without running them. A corrupt record, a backend error or a refusal at one key leaves
the others of the batch as they would be alone. Nothing is acknowledged while the worker is
fenced or stopping. What is held is bounded by the keys the worker watches (one entry per
busy location).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from locstatus.agent.handlers import HandlerRetry
from locstatus.agent.lives import ask_lives
from locstatus.agent.queue import Key
from locstatus.agent.settle import settle_rank
from locstatus.agent.state import AgentState
from locstatus.backends import AckItem
from locstatus.errors import CorruptRecord, LocstatusError, NotFound, VersionConflict
from locstatus.manager import worker_live
from locstatus.models import LocationStatus

if TYPE_CHECKING:
    from locstatus.manager import Manager

__all__ = ["ACK_BATCH", "LOG_EVERY", "Acker", "Applied"]

log = logging.getLogger("locstatus.agent")

ACK_BATCH = 1000
"""At most this many acknowledgements per ``ack_many`` call (and records per ``read_many``)."""
LOG_EVERY = 10.0
"""Seconds: at most one line per this period about acknowledgements failing on a backend
error (each line counts the failed batches it stands for)."""


@dataclass(frozen=True, slots=True)
class Applied:
    """A key whose handlers succeeded for ``generation``, read at ``version``, to acknowledge."""

    key: Key
    generation: int
    version: int
    transitional: bool
    """The state applied is pausing/resuming: a settle window opens once acknowledged."""


class Acker:
    """Acknowledges, in batches, the keys the apply threads applied (see the module docstring).

    ``retry``: the backoff before a key whose acknowledgement failed on a backend error is
    tried again (its first step; the handlers do not run again for it).

    Usage (the agent's threads)::

        acker.submit(Applied(("us-east-1", "replication"), 4, 17, True))   # apply thread
        acker.run()                                                         # its own thread
    """

    def __init__(
        self, state: AgentState, manager: Manager, worker_id: str, *, retry: HandlerRetry
    ) -> None:
        self.state = state
        self.manager = manager
        self.backend = manager.backend
        self.worker_id = worker_id
        self.retry = retry
        self._lock = threading.Lock()
        self._pending: list[Applied] = []
        self._wake = threading.Event()
        self._failures = 0  # batches failing on a backend error in a row
        self._logged_at = float("-inf")  # monotonic time of the last failure logged
        self._unlogged = 0  # failed batches since then, not logged

    def submit(self, applied: Applied) -> None:
        """Hand over ``applied`` (its location stays busy until it is decided)."""
        with self._lock:
            self._pending.append(applied)
        self._wake.set()

    def wake(self) -> None:
        """Wake the thread (the agent stops)."""
        self._wake.set()

    def reset(self) -> None:
        """Drop what is pending (a restarted agent starts from scratch)."""
        with self._lock:
            self._pending.clear()

    def run(self) -> None:
        """The acknowledging loop, until the agent stops; then what is still pending is
        released unacknowledged (stop() unregisters the worker)."""
        s = self.state
        while True:
            self._wake.wait()
            with self._lock:
                batch, self._pending = self._pending[:ACK_BATCH], self._pending[ACK_BATCH:]
                if not self._pending:
                    self._wake.clear()
            if s.stopping.is_set():
                with self._lock:
                    batch += self._pending
                    self._pending = []
                self._release(batch)
                return
            if batch:
                try:
                    self.flush(batch)
                except Exception:  # a bug, or an error nobody mapped: retry each key
                    log.exception("agent %s: acknowledging %d keys failed", self.worker_id,
                                  len(batch))
                    self._retry(batch)

    def flush(self, batch: Sequence[Applied]) -> None:
        """Acknowledge ``batch``, each on the condition that its record is still at the version
        applied; decide every key of it (acknowledged, planned again, or retried later)."""
        s = self.state
        if s.stopping.is_set() or s.fence.fenced:
            # Stopping: stop() unregisters, never ack after that. Fenced: the lease may have
            # lapsed; lifting the fence acknowledges again what was applied.
            self._release(batch)
            return
        items = [AckItem(a.key[0], a.key[1], a.generation, a.version) for a in batch]
        results = self.backend.ack_many(self.worker_id, items)
        done: list[Applied] = []
        refused: list[Applied] = []
        failed: list[tuple[Applied, LocstatusError]] = []
        for applied, result in zip(batch, results, strict=True):
            if result is None:
                done.append(applied)
            elif isinstance(result, VersionConflict):
                refused.append(applied)
            else:
                failed.append((applied, result))
        self._acknowledged(done)
        unavailable: list[tuple[Applied, LocstatusError]] = []
        for applied, exc in failed:
            if isinstance(exc, CorruptRecord):
                with s.lock:
                    s.corrupt_locked(exc)
                log.warning("agent %s: %s", self.worker_id, exc)
            else:
                unavailable.append((applied, exc))
        self._backend_retry(unavailable, batch=len(batch))
        self._release([a for a, _ in failed])
        if refused:
            self._reread(refused)

    def _acknowledged(self, done: Sequence[Applied]) -> None:
        s = self.state
        if not done:
            return
        had_error = False
        with s.lock:
            s.metrics["acks"] += len(done)
            for a in done:
                s.copy.applied[a.key] = a.generation
                s.copy.handled.pop(a.key, None)
                s.queue.succeeded(a.key)
                had_error |= s.errors.pop(f"{a.key[0]}/{a.key[1]}", None) is not None
        if had_error:
            s.beat_now.set()  # clear the published error now
        opened = [a for a in done if a.transitional]
        if opened:
            rank = self._settlers(opened)
            now = s.monotonic()
            with s.lock:
                for a in opened:
                    r = rank(a.key)
                    s.settle.acknowledged(a.key[0], settler=r == 0, backup=r == 1, now=now)
            s.wake.set()
        self._release(done)

    def _settlers(self, opened: Sequence[Applied]) -> Callable[[Key], int]:
        """This worker's place among the settlers of each of ``opened`` (:func:`settle_rank`:
        0 the settler, 1 its backup), from one read of the worker list; 0 for every key when
        it cannot be read."""
        try:
            workers = self.backend.workers()
        except LocstatusError:
            return lambda _key: 0
        live = [w for w in workers if worker_live(w, self.manager.time)]

        def rank(key: Key) -> int:
            location, service = key
            ids = (w.worker_id for w in live if w.applies(location, service))
            return settle_rank(location, self.worker_id, ids)

        return rank

    def _reread(self, refused: Sequence[Applied]) -> None:
        """The records of refused acknowledgements moved: read them (one batch read) and store
        them, which plans each key again (a newer generation: its handlers run again)."""
        s = self.state
        try:
            fresh = self.backend.read_many([a.key[0] for a in refused])
            good = [r for r in fresh if isinstance(r, LocationStatus)]
            lives = ask_lives(s, self.backend, self.worker_id, good)
        except LocstatusError as exc:
            self._backend_retry([(a, exc) for a in refused], batch=len(refused))
            self._release(refused)
            return
        for a, rec in zip(refused, fresh, strict=True):
            location, service = a.key
            if isinstance(rec, NotFound):
                with s.cond:
                    s.forget_locked(location)
                continue
            if isinstance(rec, CorruptRecord):  # keep what was applied; nothing is acknowledged
                with s.lock:
                    s.corrupt_locked(rec)
                log.warning("agent %s: %s", self.worker_id, rec)
                continue
            with s.cond:
                s.store_locked(rec, lives)
                st = rec.services.get(service)
                if st is not None and not rec.deleted and st.generation != a.generation:
                    s.metrics["handler_reruns"] += 1  # moved while the handler ran
        self._release(refused)

    def _backend_retry(self, failed: Sequence[tuple[Applied, LocstatusError]], *,
                       batch: int) -> None:
        """The acknowledgements of ``failed`` met a backend error (``batch``: the size of the
        batch they were part of): tried again together, as one batch, after one backoff that
        grows with the batches failing in a row (:attr:`retry`), and logged once for all of
        them, at most once per :data:`LOG_EVERY` seconds (the others counted in the next
        line): a store locked for a while once logged one line per location, thousands a
        worker (docs/agent.md "Bursts")."""
        s = self.state
        if not failed:
            self._failures = 0
            return
        self._failures += 1
        delay = self.retry.delay(self._failures)
        now = s.monotonic()
        if now < self._logged_at + LOG_EVERY:
            self._unlogged += 1
        else:
            unlogged, self._unlogged, self._logged_at = self._unlogged, 0, now
            (a, exc) = failed[0]
            log.warning(
                "agent %s: acknowledging %d of a batch of %d failed (%s/%s%s), retrying them "
                "together in %.2fs (failed batches in a row: %d%s): %s",
                self.worker_id, len(failed), batch, *a.key,
                f" and {len(failed) - 1} more" if len(failed) > 1 else "", delay,
                self._failures,
                f"; {unlogged} failed batches not logged since the last line" if unlogged else "",
                exc,
            )
        with s.cond:
            s.metrics["backend_errors"] += 1
            for applied, _ in failed:
                s.schedule_locked(applied.key, applied.generation, delay=delay)

    def _retry(self, batch: Sequence[Applied]) -> None:
        with self.state.cond:
            for a in batch:
                self.state.schedule_locked(a.key, a.generation, delay=self.retry.delay(1))
        self._release(batch)

    def _release(self, batch: Sequence[Applied]) -> None:
        """Each key of ``batch`` is decided: its location is free for the apply threads (and
        the key done for ``start(wait=True)``)."""
        if not batch:
            return
        s = self.state
        with s.cond:
            s.first_pass_discard_locked(a.key for a in batch)
            for a in batch:
                s.busy.discard(a.key[0])
                s.queue.release(a.key[0])
            s.cond.notify_all()
