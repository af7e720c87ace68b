"""The workers as one shape for every front end: each registration with whether its lease holds
and where it lags behind a change (:meth:`Manager.worker_statuses
<locstatus.manager.Manager.worker_statuses>`). ``GET /v1/workers`` and ``locstatus workers
--json`` serve exactly this (serialized with ``by_alias=True``), so the two never disagree on
a field (docs/http.md, docs/cli.md).

Pure over what was read: one listing of the records (corrupt ones beside them), one read of the
workers and one of every acknowledgement; liveness by :func:`.liveness.worker_live` (the
backend's time, docs/time.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from locstatus.errors import CorruptRecord, HolderPresent, NotFound
from locstatus.models import WorkerInfo

from .core import Core
from .liveness import acks_lapsed, holder_away, holder_present, worker_live
from .reads import listing

audit = logging.getLogger("locstatus.audit")
"""Operator actions no location's history records (a retirement), one line each."""


class Lag(BaseModel):
    """A change a live worker has not acknowledged yet: it acknowledged generation ``acked``
    of ``service`` at ``location``, whose current generation is ``generation``. ``acked`` is
    None when what it acknowledged is not known any more: a standing registration whose holder
    is away on a store whose acknowledgements went with the holder's session (ZooKeeper,
    :func:`.liveness.acks_lapsed`), not "it applied nothing" (0)."""

    model_config = ConfigDict(frozen=True)

    location: str
    service: str
    acked: int | None
    generation: int


class WorkerStatus(WorkerInfo):
    """A registered worker (every :class:`~locstatus.models.WorkerInfo` field) and

    - ``live`` (``alive`` in JSON: the name :meth:`WorkerInfo.alive` has in Python): its lease
      holds (false only once its deadline passed by the backend's time beyond doubt,
      docs/time.md); always true for a standing registration, which counts while its holder
      is away (docs/agent.md "Standing registrations");
    - ``away``: a standing registration whose holder is away (its lease ran out, or on
      ZooKeeper no session holds it): ``lease_expires_at`` then says since when, where known;
    - ``lagging``: each service in a transition (pausing, resuming) at a location it applies
      whose current generation it has not acknowledged (:class:`Lag`), by location and
      service; a settled service is never listed, as nothing waits for it (docs/fsm.md);
    - ``lag_unknown``: locations it may apply whose record cannot be read (corrupt), so its lag
      there cannot be told.
    """

    live: bool = Field(serialization_alias="alive")
    lagging: list[Lag]
    lag_unknown: list[str]


class WorkerReport(NamedTuple):
    """:func:`worker_statuses`' answer; unpacks as ``workers, corrupt``."""

    workers: list[WorkerStatus]
    """Every registration (expired and unreadable ones included), as the backend lists them."""
    corrupt: list[CorruptRecord]
    """The records that could not be read (each is in the ``lag_unknown`` of the workers that
    may apply it)."""


def worker_statuses(core: Core) -> WorkerReport:
    """Every registered worker with its liveness and lag. Raises
    :class:`~locstatus.errors.BackendUnavailable`."""
    infos = core.backend.workers()
    records, corrupt = listing(core)
    acks = core.backend.all_acks()
    out: list[WorkerStatus] = []
    for w in infos:
        lapsed = acks_lapsed(w, core.backend.session_leases)
        lag: list[Lag] = []
        for rec in records:
            for svc, st in sorted(rec.services.items()):
                # only a transition waits for acknowledgements (the settle rule, docs/fsm.md):
                # a settled service lags nobody, whatever acknowledgement is stored (ZooKeeper's
                # go with the session that wrote them), as /metrics and the check judge it
                if not st.state.transitional or not w.applies(rec.location, svc):
                    continue
                stored = acks.get(rec.location, {}).get(w.worker_id, {}).get(svc)
                acked = stored if stored is not None else 0
                if acked < st.generation:
                    lag.append(Lag(location=rec.location, service=svc,
                                   acked=None if stored is None and lapsed else acked,
                                   generation=st.generation))
        unknown = [
            bad.location
            for bad in corrupt
            if w.corrupt is not None or w.locations is None or bad.location in w.locations
        ]
        # built as read, not validated again: a registration listed as corrupt may be stored
        # under a key that is no valid worker id (the backend contract, invariant 6)
        fields = {name: getattr(w, name) for name in WorkerInfo.model_fields}
        fields["away"] = holder_away(w, core.time)
        out.append(WorkerStatus.model_construct(
            **fields, live=worker_live(w, core.time), lagging=lag, lag_unknown=unknown
        ))
    return WorkerReport(out, corrupt)


FORCE_POLL = 0.2
"""Seconds between two looks at a registration a forced retirement waits on."""


def _holder_refusal(worker_id: str, info: WorkerInfo, why: str, *,
                    forced: bool = False) -> HolderPresent:
    """The refusal naming ``info``'s holder; ``why`` adds to "whose holder is present"."""
    force = "" if forced else (
        ", or, if it is gone for good and its lease has not run out yet, retire with "
        "--force, which waits for that")
    return HolderPresent(
        f"{worker_id} is a standing registration whose holder is present (host "
        f"{info.host or '?'}, pid {info.pid}){why}: retired now, a pause would settle without "
        f"what it stands for; stop its holder first (it is then away){force} "
        "(docs/agent.md \"Standing registrations\")"
    )


def _wait_bound(core: Core, info: WorkerInfo) -> float:
    """Seconds a forced retirement waits for ``info``'s holder to be away: until its lease
    deadline passed beyond doubt (heartbeat backends), or one session timeout (ZooKeeper,
    where the lease is the holder's session), and a few looks more."""
    try:  # at most the clock's bound: above it the wait ends refused (it cannot tell)
        slack = min(max(0.0, core.time.uncertainty_seconds()),
                    core.time.max_uncertainty_seconds)
    except Exception:  # a source that cannot say: judge on its estimate alone
        slack = 0.0
    expires = info.lease_expires_at
    if expires is not None:
        left = (expires - core.time.now()).total_seconds()
    else:
        timeout = getattr(core.backend, "session_timeout", None)
        left = float(timeout) if isinstance(timeout, int | float) else 0.0
    return max(0.0, left) + slack + 3 * FORCE_POLL


def _await_away(
    core: Core, worker_id: str, info: WorkerInfo, sleep: Callable[[float], None],
    on_wait: Callable[[WorkerInfo, float], None] | None = None,
) -> WorkerInfo:
    """Wait until the holder of ``info`` (present) is away, and return the registration as
    then listed. A holder that writes its registration meanwhile (a renewal, a handler error
    published, a new holder) runs: :class:`HolderPresent`, as when it is still present once
    its lease (or session) had time to run out. :class:`NotFound` when it went meanwhile."""
    bound = _wait_bound(core, info)
    if on_wait is not None:
        on_wait(info, bound)
    deadline = time.monotonic() + bound
    while True:
        sleep(FORCE_POLL)
        now = {w.worker_id: w for w in core.backend.workers()}.get(worker_id)
        if now is None:
            raise NotFound(f"no worker {worker_id!r} is registered any more (retired or "
                           "removed while this retirement waited for its holder)")
        if not holder_present(now, core.time):
            return now
        if now != info:
            raise _holder_refusal(worker_id, now, ", and it wrote its registration while "
                                  "this retirement waited for it to be away: it runs",
                                  forced=True)
        if time.monotonic() >= deadline:
            problem = core.time.problem()
            raise _holder_refusal(worker_id, now, ", still, after its lease had time to run "
                                  "out: it runs" + (f" (or the {problem}: docs/time.md)"
                                                    if problem else ""), forced=True)


def retire_worker(
    core: Core,
    worker_id: str,
    actor: str | None = None,
    *,
    force: bool = False,
    sleep: Callable[[float], None] = time.sleep,
    on_wait: Callable[[WorkerInfo, float], None] | None = None,
) -> WorkerInfo:
    """Remove ``worker_id``'s registration and its acknowledgements: how a standing
    registration ends (docs/agent.md "Standing registrations"; an ordinary one is
    unregistered as its agent's ``stop()`` does).

    A standing registration is never removed while its holder is present
    (:func:`.liveness.holder_present`: its lease ahead beyond doubt, or on ZooKeeper its
    holder node exists): its holder still applies what it stands for, and a pause made before
    the holder wrote it again would settle without it (a hostile review: a forced retirement
    of a running Backbeat bridge's registration let one settle while the processor ran). So
    it is refused (:class:`~locstatus.errors.HolderPresent`), unless ``force``, which waits
    for the holder to be away (``sleep``: how it waits, seconds; at most until its lease
    deadline passed beyond doubt, on ZooKeeper one session timeout) and retires then: for a
    holder known gone (killed, its host lost) whose lease has not run out yet. A holder that
    writes its registration while it waits, or is still present then, runs:
    :class:`~locstatus.errors.HolderPresent`, nothing removed. ``on_wait(registration,
    seconds)`` is called once before such a wait, with the most it can last (so a front end
    says why it is silent: ``locstatus workers retire --force``, docs/cli.md).

    The removal is conditional on heartbeat backends: only while the registration still
    carries the lease deadline judged (a holder taking it over in between writes another, and
    keeps it: :class:`~locstatus.errors.HolderPresent`). Returns the registration as it was
    listed just before. Logged on ``locstatus.audit`` with ``actor`` and ``worker`` (no
    location's history holds a registration). Raises :class:`~locstatus.errors.NotFound`
    for a worker not registered, :class:`~locstatus.errors.HolderPresent` (nothing removed),
    :class:`~locstatus.errors.BackendUnavailable`."""
    listed = {w.worker_id: w for w in core.backend.workers()}
    info = listed.get(worker_id)
    waited = False
    if info is not None and holder_present(info, core.time):
        if not force:
            raise _holder_refusal(worker_id, info, "")
        info = _await_away(core, worker_id, info, sleep, on_wait)
        waited = True
    if info is None:
        names = sorted(listed)
        known = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        raise NotFound(f"no worker {worker_id!r} is registered (registered: {known or 'none'})")
    # judged in the removal's own atomic step where the store can (its lease deadline, which
    # every write of a holder moves); on ZooKeeper the lease is the session: unconditional
    conditional = (info.standing and info.lease_expires_at is not None
                   and not core.backend.session_leases)
    if not core.backend.remove_worker(
        worker_id, if_expires=info.lease_expires_at if conditional else None, retire=True
    ):
        again = {w.worker_id: w for w in core.backend.workers()}.get(worker_id)
        if again is None:
            raise NotFound(f"no worker {worker_id!r} is registered any more (retired or "
                           "removed meanwhile)")
        raise _holder_refusal(worker_id, again, ", registered again just now")
    audit.info(
        "worker %s retired by %s (%s registration; services %s)%s",
        worker_id, actor or "an unnamed actor",
        "standing" if info.standing else "ordinary", ",".join(info.services) or "?",
        " with --force, once its holder was away" if waited else "",
        extra={"worker": worker_id, "actor": actor or ""},
    )
    return info
