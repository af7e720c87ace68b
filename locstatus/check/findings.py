"""Each kind of finding, built from facts the scan already read (docs/check.md, "Finding kinds").

One method of :class:`Findings` per kind (or per shape of a kind): it takes what the scan read
and judged (the record, the lagging workers and whether their leases hold, the tombstone's
readiness, the history's problems) and writes the finding: its stable id, the operator's
sentence, the evidence ``docs/check.md`` documents, and the repair it would take (or why there is
none). Nothing here reads a backend or asks a clock: the scan decides *whether*, this module
says *what*, so the wording and the evidence of every kind live in one place and are the same
whichever path found them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from locstatus.check.history import Problem
from locstatus.check.report import Action, Finding, Kind, RepairPlan
from locstatus.check.text import human_age, iso, offset_text
from locstatus.manager.liveness import RETIRE_ADVICE, handler_errors
from locstatus.models import HistoryEntry, LocationStatus, ServiceStatus, WorkerInfo

SKEW_REPAIR = RepairPlan(
    action=None,
    description=(
        "none: fix that host's time sync (NTP); deadlines are judged on the backend's time "
        "meanwhile (docs/time.md)"
    ),
)
"""The plan of every ``clock_skew`` finding: the check never acts on a host's clock."""


def notes_of(worker_id: str, stuck: Mapping[str, str], errors: Mapping[str, str]) -> str:
    """`` (stuck ...; last handler error: ...)`` for ``worker_id``, or "" when nothing is
    known."""
    notes = [n for n in (stuck.get(worker_id),
                         f"last handler error: {errors[worker_id]}" if worker_id in errors
                         else None) if n]
    return f" ({'; '.join(notes)})" if notes else ""


class Findings:
    """The findings of one run, in the order found (the report sorts them once, at the end).

    ``now`` (aware UTC) is the instant ages are measured from; ``max_skew`` (seconds) is the
    bound ``clock_skew`` findings quote. Each method adds one finding (or one per missing
    service) to :attr:`items`.
    """

    def __init__(self, now: datetime, max_skew: float) -> None:
        self.now = now
        self.max_skew = max_skew
        self.items: list[Finding] = []

    # -- records ---------------------------------------------------------------------------

    def stuck(
        self,
        rec: LocationStatus,
        svc: str,
        st: ServiceStatus,
        since: datetime | None,
        lagging: Sequence[WorkerInfo],
        alive: Mapping[str, bool],
        acks: Mapping[str, Mapping[str, int]],
        stuck: Mapping[str, str],
        lapsed: frozenset[str] = frozenset(),
    ) -> None:
        """``stuck_transition``: ``svc`` has been transitional since ``since``; ``lagging``: the
        workers that apply it and have not acknowledged its generation, ``alive`` whether each
        one's lease holds, ``acks`` the location's acknowledgements, ``stuck`` where a live
        worker's handler is stuck (docs/agent.md "Handlers") or, for a standing registration,
        that its holder is away (docs/agent.md "Standing registrations"); ``lapsed``: the workers
        whose acknowledgements went with their away holder's session (ZooKeeper), whose
        ``acked_generation`` is then unknown, not "none" (``ack_lapsed`` true). Settled only
        when no live worker lags."""
        loc = rec.location
        live = [w.worker_id for w in lagging if alive[w.worker_id]]
        errors = handler_errors(lagging, [w.worker_id for w in lagging], loc, [svc])
        evidence = {
            "state": st.state.value,
            "generation": st.generation,
            "version": rec.version,
            "lagging_workers": [
                {
                    "worker_id": w.worker_id,
                    "lease_alive": alive[w.worker_id],
                    "lease_expires_at": iso(w.lease_expires_at),
                    "acked_generation": acks.get(w.worker_id, {}).get(svc),
                    "ack_lapsed": (w.worker_id in lapsed
                                   and acks.get(w.worker_id, {}).get(svc) is None),
                    "stuck": stuck.get(w.worker_id),
                    "handler_error": errors.get(w.worker_id),
                }
                for w in lagging
            ],
        }
        target = "paused" if st.state.desired_paused else "running"
        if live:
            message = (
                f"{st.state.value} generation {st.generation} for {human_age(self.age(since))}; "
                f"live workers not acknowledged: "
                + ", ".join(w + notes_of(w, stuck, errors) for w in live)
            )
            away = [w for w in live if "holder away" in stuck.get(w, "")]
            standing = [w.worker_id for w in lagging
                        if w.standing and w.worker_id in live and w.worker_id not in away]
            ordinary = [w for w in live if w not in away and w not in standing]
            parts = []
            if away:
                parts.append(
                    f"{', '.join(away)} "
                    + ("is a standing registration" if len(away) == 1
                       else "are standing registrations")
                    + " whose holder is away: start the holder again (it acknowledges), or retire "
                    "what is gone for good with 'locstatus workers retire WORKER_ID' "
                    "(docs/agent.md \"Standing registrations\")"
                )
            if standing:
                parts.append(
                    f"{', '.join(standing)} "
                    + ("is a standing registration" if len(standing) == 1
                       else "are standing registrations")
                    + " (its lease never lapses it): start its holder again (e.g. the Backbeat "
                    f"bridge); {RETIRE_ADVICE}: "
                    + "; ".join(f"locstatus workers retire {w}" for w in standing)
                    + " (docs/agent.md \"Standing registrations\")"
                )
            if ordinary:
                parts.append(
                    f"{', '.join(ordinary)} {'lags' if len(ordinary) == 1 else 'lag'} "
                    "with a live lease: fix or stop "
                    f"{'that worker' if len(ordinary) == 1 else 'those workers'} "
                    "(a stopped worker's lease expires, then --repair settles)"
                )
            plan = RepairPlan(action=None, description="none while " + "; ".join(parts))
        else:
            dead = [w.worker_id for w in lagging]
            message = (
                f"{st.state.value} generation {st.generation} for {human_age(self.age(since))}; "
                + (f"only expired workers lag: {', '.join(dead)}" if dead else "nobody lags")
            )
            plan = RepairPlan(action=Action.SETTLE, description=f"settle to {target}")
        self.add(Kind.STUCK_TRANSITION, loc, svc, None, since, message, evidence, plan)

    def overdue(self, rec: LocationStatus, svc: str, st: ServiceStatus) -> None:
        """``overdue_resume``: the scheduled resume of ``svc`` is overdue
        (:meth:`ServiceStatus.resume_overdue`) and was not fired."""
        assert st.resume_at is not None
        self.add(
            Kind.OVERDUE_RESUME,
            rec.location,
            svc,
            None,
            st.resume_at,
            f"resume scheduled at {iso(st.resume_at)} not fired; still {st.state.value}",
            {
                "state": st.state.value,
                "generation": st.generation,
                "resume_at": iso(st.resume_at),
                "version": rec.version,
            },
            RepairPlan(action=Action.FIRE_DUE_RESUMES, description="fire the due resume"),
        )

    def tombstone(
        self, rec: LocationStatus, why: str, acked: list[str], waiting: list[str]
    ) -> None:
        """``tombstone_ready``: the tombstone ``rec`` may be purged, ``why`` (``ttl`` or
        ``acknowledged``, see :func:`locstatus.check.tombstones.readiness`)."""
        assert rec.deleted_at is not None
        message = (
            f"removed at {iso(rec.deleted_at)}, older than the TTL"
            if why == "ttl"
            else f"removed at {iso(rec.deleted_at)}, acknowledged by every live worker"
            + ("" if acked else " (none applies it)")
        )
        self.add(
            Kind.TOMBSTONE_READY,
            rec.location,
            None,
            None,
            rec.deleted_at,
            message,
            {
                "deleted_at": iso(rec.deleted_at),
                "reason": why,
                "acknowledged_by": acked,
                "not_acknowledged_by": waiting,
                "version": rec.version,
            },
            RepairPlan(action=Action.PURGE_LOCATION, description="purge the tombstone"),
        )

    def missing(self, loc: str, rec: LocationStatus | None, services: tuple[str, ...]) -> None:
        """``missing_location``: ``loc`` is expected with ``services`` but not stored (``rec``
        None), removed, or stored without some of them (one finding per missing service)."""
        evidence: dict[str, Any] = {
            "expected_services": list(services),
            "stored_services": None if rec is None else sorted(rec.services),
            "removed_at": None if rec is None else iso(rec.deleted_at),
            "version": None if rec is None else rec.version,
        }
        if rec is None:
            message, plan = "expected but not stored", "create it"
        elif rec.deleted:
            message = f"expected but removed at {iso(rec.deleted_at)}"
            plan = "restore it"
        else:
            missing = [s for s in services if s not in rec.services]
            for svc in missing:
                self.add(
                    Kind.MISSING_LOCATION,
                    loc,
                    svc,
                    None,
                    None,
                    f"expected service {svc} not stored at this location",
                    evidence,
                    RepairPlan(action=Action.ADD_LOCATION, description=f"add service {svc}"),
                )
            return
        self.add(
            Kind.MISSING_LOCATION,
            loc,
            None,
            None,
            rec.deleted_at if rec is not None else None,
            message,
            evidence,
            RepairPlan(action=Action.ADD_LOCATION, description=plan),
        )

    def unknown(self, rec: LocationStatus) -> None:
        """``unknown_location``: a live location the expected list does not name."""
        self.add(
            Kind.UNKNOWN_LOCATION,
            rec.location,
            None,
            None,
            None,
            "stored but not in the expected location list",
            {"services": sorted(rec.services), "version": rec.version},
            RepairPlan(
                action=Action.REMOVE_LOCATION,
                description="remove it (tombstone; purged once acknowledged or after the TTL)",
            ),
        )

    def corrupt(self, loc: str, detail: str, *, part: str) -> None:
        """``corrupt_record``: the ``record`` (or its ``history``, ``part``) of ``loc`` does not
        parse or validate (``detail``: what is wrong). Never repaired."""
        self.add(
            Kind.CORRUPT_RECORD,
            loc,
            None,
            None,
            None,
            f"{part} does not parse: {detail}",
            {"part": part, "detail": detail},
            RepairPlan(
                action=None,
                description=(
                    "none: never rewritten or deleted by the check; inspect it with the "
                    "backend's own client and restore it by hand"
                ),
            ),
        )

    # -- history ---------------------------------------------------------------------------

    def gap(self, rec: LocationStatus, versions: list[int], *, restorable: bool) -> None:
        """``history_gap``: ``versions`` of ``rec``'s life are missing from its full history;
        ``restorable`` when the record's recent history still holds them."""
        listed = ", ".join(map(str, versions[:10])) + (", ..." if len(versions) > 10 else "")
        if restorable:
            message = (
                f"writes at versions {listed} are missing from the full history; the record's "
                "recent history still holds them (a writer stopped between its two writes)"
            )
            plan = RepairPlan(
                action=Action.RESTORE_HISTORY,
                description="copy them from the record's recent history",
            )
        else:
            message = (
                f"writes at versions {listed} are in neither the full history nor the "
                "record's recent history: that history is lost"
            )
            plan = RepairPlan(
                action=None,
                description=(
                    "none: nothing holds them any more; 'locstatus history' skips those "
                    "versions"
                ),
            )
        self.add(
            Kind.HISTORY_GAP,
            rec.location,
            None,
            None,
            None,
            message,
            {
                "missing_versions": versions,
                "in_recent_history": restorable,
                "version": rec.version,
            },
            plan,
            key="restorable" if restorable else "lost",
        )

    def mismatch(self, rec: LocationStatus, problems: Sequence[Problem]) -> None:
        """``history_mismatch``: one finding per problem :func:`compare_history` found in
        ``rec`` (the record those problems were found in). Never repaired: history is never
        rewritten."""
        for svc, fields, entry in problems:
            st = rec.services.get(svc) if svc != "*" else None
            since = st.updated_at if st is not None else None
            if entry is None:
                message = (
                    f"no history entry for this service (record version {rec.version})"
                    if svc != "*"
                    else f"record version {rec.version} has no history"
                )
            elif svc == "*" and entry.version > rec.version:
                message = (
                    f"the history holds a write at version {entry.version}, newer than the "
                    f"record (version {rec.version}): its next write will be refused"
                )
            elif svc == "*":
                message = (
                    f"record version {rec.version} has no history entry (newest is version "
                    f"{entry.version})"
                )
            else:
                message = (
                    f"{', '.join(fields)} {'differs' if len(fields) == 1 else 'differ'} from "
                    f"the newest history entry ({entry.event} at version {entry.version})"
                )
            self.add(
                Kind.HISTORY_MISMATCH,
                rec.location,
                None if svc == "*" else svc,
                None,
                since,
                message,
                {
                    "fields": fields,
                    "record": (
                        {"version": rec.version} if svc == "*"
                        else _status_view(rec.services[svc])
                    ),
                    "history": None if entry is None else _entry_view(entry),
                },
                RepairPlan(
                    action=None,
                    description=(
                        "none: history is never rewritten; compare 'locstatus history' with the "
                        "record (the next change of the service records its state again)"
                    ),
                ),
            )

    # -- workers and clocks ----------------------------------------------------------------

    def expired(self, w: WorkerInfo, acknowledged: int) -> None:
        """``expired_worker``: ``w``'s lease ran out; ``acknowledged``: the number of
        locations it holds acknowledgements at."""
        assert w.lease_expires_at is not None
        self.add(
            Kind.EXPIRED_WORKER,
            None,
            None,
            w.worker_id,
            w.lease_expires_at,
            f"lease expired at {iso(w.lease_expires_at)} (host {w.host or '?'}, pid {w.pid})",
            {
                "host": w.host,
                "pid": w.pid,
                "services": list(w.services),
                "locations": None if w.locations is None else list(w.locations),
                "started_at": iso(w.started_at),
                "lease_expires_at": iso(w.lease_expires_at),
                "locations_acknowledged": acknowledged,
            },
            RepairPlan(
                action=Action.REMOVE_WORKER,
                description="unregister it (and drop its acknowledgements) if still expired",
            ),
        )

    def corrupt_worker(self, w: WorkerInfo, live: bool, acknowledged: int) -> None:
        """``corrupt_worker``: ``w``'s registration does not parse; ``live`` while the lease it
        still carries holds (then it counts as a live worker applying everything, contract
        invariant 6, and is not removed); ``acknowledged`` as for :meth:`expired`."""
        assert w.corrupt is not None
        expired = not live  # only a lease it still carries can have run out
        lease = (
            f"its lease ran out at {iso(w.lease_expires_at)}" if expired
            else "counted as a live worker that applies every service at every location"
            + ("" if w.lease_expires_at is None else f" until {iso(w.lease_expires_at)}")
        )
        self.add(
            Kind.CORRUPT_WORKER,
            None,
            None,
            w.worker_id,
            w.lease_expires_at if expired else None,
            f"registration does not parse: {w.corrupt}; {lease}",
            {
                "detail": w.corrupt,
                "lease_expires_at": iso(w.lease_expires_at),
                "lease_alive": live,
                "locations_acknowledged": acknowledged,
            },
            RepairPlan(
                action=Action.REMOVE_WORKER,
                description="unregister it (and drop its acknowledgements) if still expired",
            ) if expired else RepairPlan(
                action=None,
                description=(
                    "none while it may be a live worker: its worker's next registration "
                    "replaces it (ZooKeeper: the node goes with its session); if that worker "
                    "is gone, remove the registration with the backend's own client"
                ),
            ),
        )

    def worker_skew(self, w: WorkerInfo) -> None:
        """``clock_skew`` of a worker: its published clock offset exceeds the bound."""
        offset = w.clock_offset_seconds
        assert offset is not None
        self.add(
            Kind.CLOCK_SKEW,
            None,
            None,
            w.worker_id,
            None,
            f"host {w.host or '?'} (pid {w.pid}) clock is {offset_text(offset)} the backend's "
            f"(bound {self.max_skew:g}s)",
            {
                "process": "worker",
                "host": w.host,
                "pid": w.pid,
                "offset_seconds": offset,
                "max_skew_seconds": self.max_skew,
                "uncertainty_seconds": None,
                "problem": None,
            },
            SKEW_REPAIR,
        )

    def own_clock(
        self,
        *,
        offset: float | None,
        uncertainty: float | None,
        problem: str | None,
        refused: int,
        host: str,
        pid: int,
    ) -> None:
        """``clock_skew`` of this check's own process, when its host clock is off by more than
        the bound (``offset``, seconds), or it could not tell the backend's time within its
        own bound (``problem``; ``refused``: deadline decisions refused this run, every
        deadline repair of the run then refused). Nothing is added otherwise."""
        skewed = offset is not None and abs(offset) > self.max_skew
        if not skewed and problem is None and not refused:
            return
        parts = []
        if skewed:
            assert offset is not None
            parts.append(f"this check's host clock is {offset_text(offset)} the backend's "
                         f"(bound {self.max_skew:g}s)")
        if problem is not None or refused:
            parts.append(f"deadlines refused ({refused} this run): "
                         f"{problem or 'backend time uncertain'}")
        self.add(
            Kind.CLOCK_SKEW,
            None,
            None,
            None,
            None,
            "; ".join(parts),
            {
                "process": "check",
                "host": host,
                "pid": pid,
                "offset_seconds": offset,
                "max_skew_seconds": self.max_skew,
                "uncertainty_seconds": uncertainty,
                "problem": problem,
            },
            SKEW_REPAIR,
            key="check",
        )

    # -- the one constructor ---------------------------------------------------------------

    def age(self, since: datetime | None) -> float | None:
        """Seconds from ``since`` to :attr:`now` (3 decimals), None for None."""
        return None if since is None else round((self.now - since).total_seconds(), 3)

    def add(
        self,
        kind: Kind,
        location: str | None,
        service: str | None,
        worker_id: str | None,
        since: datetime | None,
        message: str,
        evidence: dict[str, Any],
        plan: RepairPlan,
        *,
        key: str | None = None,
    ) -> Finding:
        """Add a finding of ``kind``; its id is ``kind:location:service-or-worker`` (``-`` for
        none), ``:key`` appended when one subject can have two findings of a kind."""
        ident = f"{kind.value}:{location or '-'}:{service or worker_id or '-'}"
        if key is not None:
            ident += f":{key}"
        finding = Finding(
            id=ident,
            kind=kind,
            location=location,
            service=service,
            worker_id=worker_id,
            since=since,
            age_seconds=self.age(since),
            message=message,
            evidence=evidence,
            repair=plan,
        )
        self.items.append(finding)
        return finding


def _status_view(st: ServiceStatus) -> dict[str, Any]:
    return {
        "op_id": st.op_id,
        "state": st.state.value,
        "generation": st.generation,
        "resume_at": iso(st.resume_at),
    }


def _entry_view(e: HistoryEntry) -> dict[str, Any]:
    return {
        "version": e.version,
        "op_id": e.op_id,
        "event": e.event,
        "service": e.service,
        "to_state": None if e.to_state is None else e.to_state.value,
        "generation": e.generation,
        "resume_at": iso(e.resume_at),
        "at": iso(e.at),
    }
