"""The repair: fix what is safe to fix, through the manager's guarded writes (docs/check.md).

Every repair is a manager call (``settle``, ``fire_due_resumes``, ``add_location``,
``remove_location``, ``purge_location``) or ``Backend.remove_worker`` /
``Backend.restore_history`` (a copy, never a rewrite). Each of those is guarded (a
compare-and-set on the version, the FSM's ``resume_at``/generation guards, the removal
conditional on the lease deadline seen expired, the history collection's unique index), so any
number of checks may repair at once from several hosts: each repair happens once and the others
find it done.

A scan is a snapshot that may be seconds old when a repair runs, so each handler re-reads what
it is about to fix and reports ``already_done`` when someone else fixed it meanwhile,
``blocked`` when it is not safe (a live worker still lags, so a settle would lie; the backend's
time cannot be told, so no deadline is acted on, docs/time.md), or ``applied``. The order is
planned first, purely (:func:`plan`): the same phase order everywhere, one call per location
for resumes and location sync, and a random order within a phase so that concurrent checks
spread over different locations instead of trailing each other.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from datetime import timedelta

from locstatus.check.report import (
    FINDING_STATE,
    Action,
    Finding,
    FindingState,
    Kind,
    Outcome,
    ProgressBar,
    Repair,
    no_progress,
)
from locstatus.check.text import iso
from locstatus.check.tombstones import readiness
from locstatus.errors import (
    BackendUnavailable,
    InvalidTransition,
    LocstatusError,
    NotFound,
    VersionConflict,
)
from locstatus.manager import Manager, lagging_workers, worker_live
from locstatus.models import LocationStatus

ORDER = (
    Action.RESTORE_HISTORY,
    Action.REMOVE_WORKER,
    Action.FIRE_DUE_RESUMES,
    Action.SETTLE,
    Action.ADD_LOCATION,
    Action.REMOVE_LOCATION,
    Action.PURGE_LOCATION,
)
"""The phases, in the order they run: history first (it only copies), expired workers before
the settles they would block, due resumes before settles (a fired resume is a new transition),
location sync, and purges last."""

_PER_LOCATION = (Action.FIRE_DUE_RESUMES, Action.ADD_LOCATION)
"""Actions made once per location for all its findings (one write for every service)."""


def plan(findings: Sequence[Finding], rng: random.Random) -> list[list[Finding]]:
    """The repairs to make, as groups of findings handled by one call each, in run order:
    the findings with a repair, by phase (:data:`ORDER`); consecutive findings of one
    location whose action is per location (:data:`_PER_LOCATION`) in one group; the groups of
    each phase shuffled with ``rng``."""
    todo = sorted(
        (f for f in findings if f.repair.action is not None),
        key=lambda f: ORDER.index(f.repair.action),
    )
    groups: list[list[Finding]] = []
    for f in todo:
        last = groups[-1] if groups else None
        if (
            last is not None
            and f.repair.action in _PER_LOCATION
            and last[0].repair.action is f.repair.action
            and last[0].location == f.location
        ):
            last.append(f)
        else:
            groups.append([f])
    phases: dict[Action | None, list[list[Finding]]] = {}
    for group in groups:
        phases.setdefault(group[0].repair.action, []).append(group)
    ordered: list[list[Finding]] = []
    for phase in ORDER:
        batch = phases.get(phase, [])
        rng.shuffle(batch)
        ordered.extend(batch)
    return ordered


class Repairer:
    """Applies (or, with ``dry_run``, plans) the repair of every finding that has one,
    re-checking each first; writes carry ``actor``. Sets each finding's state from its
    repair's outcome, and :attr:`backend_down` once a repair found the backend unavailable
    (the repairs after it are ``not_attempted``).

    Usage::

        repairer = Repairer(mgr, "check:host:1:1", dry_run=False, tombstone_ttl=86400.0)
        repairs = repairer.run(scan.findings)
    """

    def __init__(self, mgr: Manager, actor: str, dry_run: bool, tombstone_ttl: float) -> None:
        self.mgr = mgr
        self.backend = mgr.backend
        self.actor = actor
        self.dry_run = dry_run
        self.ttl = timedelta(seconds=tombstone_ttl)
        self.backend_down = False
        self.repairs: list[Repair] = []

    def run(self, findings: list[Finding], progress: ProgressBar = no_progress) -> list[Repair]:
        """Repair ``findings`` (see the module docstring); returns the repairs, in the order
        made. Errors of a repair are reported in it, never raised."""
        for f in findings:  # a stuck transition with live lagging workers: nothing safe to do
            if f.kind is Kind.STUCK_TRANSITION and f.repair.action is None:
                f.state = FindingState.BLOCKED
        groups = plan(findings, random.Random())
        handlers: dict[Action, Callable[[list[Finding]], None]] = {
            Action.REMOVE_WORKER: self._remove_worker,
            Action.FIRE_DUE_RESUMES: self._fire,
            Action.SETTLE: self._settle,
            Action.ADD_LOCATION: self._add_location,
            Action.REMOVE_LOCATION: self._remove_location,
            Action.PURGE_LOCATION: self._purge,
            Action.RESTORE_HISTORY: self._restore_history,
        }
        with progress(len(groups), "repairing") as advance:
            for group in groups:
                action = group[0].repair.action
                assert action is not None
                if self.dry_run:
                    for f in group:
                        self._record(f, Outcome.PLANNED, f.repair.description)
                elif self.backend_down:
                    for f in group:
                        self._record(f, Outcome.NOT_ATTEMPTED, "backend unavailable")
                else:
                    try:
                        handlers[action](group)
                    except BackendUnavailable as exc:
                        self.backend_down = True
                        for f in group:
                            self._record(f, Outcome.FAILED, f"backend unavailable: {exc}")
                    except LocstatusError as exc:
                        for f in group:
                            self._record(f, Outcome.FAILED, f"{type(exc).__name__}: {exc}")
                advance()
        return self.repairs

    def _record(
        self, f: Finding, outcome: Outcome, detail: str, version: int | None = None
    ) -> None:
        assert f.repair.action is not None
        f.state = FINDING_STATE[outcome]
        self.repairs.append(
            Repair(
                finding=f.id,
                kind=f.kind,
                action=f.repair.action,
                location=f.location,
                service=f.service,
                worker_id=f.worker_id,
                outcome=outcome,
                detail=detail,
                version=version,
            )
        )

    def _read(self, location: str) -> LocationStatus | None:
        try:
            return self.mgr.status(location)
        except NotFound:
            return None

    def _wrote(self, location: str, since_version: int) -> bool:
        """True if this run's actor wrote ``location`` after ``since_version`` (the actor is
        unique per run, and the manager records it in the history of the writes it makes)."""
        for entry in self.backend.history(location, limit=20):
            if entry.version <= since_version:
                return False
            if entry.actor == self.actor:
                return True
        return False

    # -- one handler per action ----------------------------------------------------------

    def _restore_history(self, group: list[Finding]) -> None:
        for f in group:
            loc = f.location
            assert loc is not None
            wanted = set(f.evidence["missing_versions"])
            try:
                still = wanted & set(self.backend.history_gaps(loc).restorable)
            except NotFound:
                self._record(f, Outcome.ALREADY_DONE, "the location is gone")
                continue
            if not still:
                self._record(f, Outcome.ALREADY_DONE, "copied meanwhile")
                continue
            copied = set(self.backend.restore_history(loc))
            left = wanted & set(self.backend.history_gaps(loc).restorable)
            if left:
                self._record(
                    f, Outcome.FAILED, f"still missing: {', '.join(map(str, sorted(left)))}"
                )
            elif copied & still:
                self._record(
                    f, Outcome.APPLIED,
                    f"copied versions {', '.join(map(str, sorted(copied & still)))} from the "
                    "record's recent history",
                )
            else:
                self._record(f, Outcome.ALREADY_DONE, "copied meanwhile")

    def _remove_worker(self, group: list[Finding]) -> None:
        for f in group:
            wid = f.worker_id
            assert wid is not None
            current = next((w for w in self.backend.workers() if w.worker_id == wid), None)
            if current is None:
                self._record(f, Outcome.ALREADY_DONE, "no longer registered")
            elif worker_live(current, self.mgr.time):
                problem = self.mgr.time.problem()
                if problem is not None:
                    self._record(f, Outcome.BLOCKED, f"kept: {problem} (docs/time.md)")
                else:
                    self._record(f, Outcome.ALREADY_DONE, "lease renewed meanwhile; kept")
            elif self.backend.remove_worker(wid, if_expires=current.lease_expires_at):
                self._record(f, Outcome.APPLIED, "unregistered; its acknowledgements dropped")
            else:  # removal conditional on the lease seen expired (model/README.md, remove_race)
                self._record(
                    f, Outcome.ALREADY_DONE, "lease renewed or registered again meanwhile; kept"
                )

    def _fire(self, group: list[Finding]) -> None:
        loc = group[0].location
        assert loc is not None
        time_source = self.mgr.time
        before = self._read(loc)
        due = (
            set()
            if before is None or before.deleted
            else {
                f.service
                for f in group
                if f.service in before.services
                and before.services[f.service].resume_due(time_source)
            }
        )
        rec = self.mgr.fire_due_resumes(loc, actor=self.actor) if due else before
        now = self.mgr.clock()
        for f in group:
            st = None if rec is None else rec.services.get(f.service or "")
            version = None if rec is None else rec.version
            if st is None or rec is None or rec.deleted:
                self._record(f, Outcome.ALREADY_DONE, "location gone or removed meanwhile")
            elif f.service in due and st.actor == self.actor and st.resume_at is None:
                self._record(f, Outcome.APPLIED, f"resumed: now {st.state.value}", version)
            elif not st.resume_overdue(now):
                self._record(
                    f, Outcome.ALREADY_DONE, f"fired or rescheduled meanwhile ({st.state.value})",
                    version,
                )
            elif f.service not in due:
                problem = time_source.problem()
                self._record(
                    f, Outcome.BLOCKED,
                    f"not fired: {problem} (docs/time.md)" if problem is not None
                    else "not fired: not yet past by the backend's time beyond doubt",
                    version,
                )
            else:
                self._record(f, Outcome.FAILED, "still due after firing", version)

    def _settle(self, group: list[Finding]) -> None:
        for f in group:
            loc, svc = f.location, f.service
            assert loc is not None and svc is not None
            before = self._read(loc)
            gen = f.evidence["generation"]
            if (
                before is None
                or before.deleted
                or svc not in before.services
                or not before.services[svc].state.transitional
                or before.services[svc].generation != gen
            ):
                self._record(f, Outcome.ALREADY_DONE, "settled or changed meanwhile")
                continue
            writes = self.mgr.stats["writes"]
            rec = self.mgr.settle(loc, svc)
            st = rec.services[svc]
            if not st.state.transitional:
                if self.mgr.stats["writes"] > writes:  # this manager committed the settle
                    self._record(f, Outcome.APPLIED, f"settled: now {st.state.value}", rec.version)
                else:
                    self._record(f, Outcome.ALREADY_DONE, "settled meanwhile", rec.version)
                continue
            lagging = lagging_workers(
                loc, svc, st.generation, self.backend.workers(), self.backend.acks(loc),
                self.mgr.time,
            )
            problem = self.mgr.time.problem()
            self._record(
                f,
                Outcome.BLOCKED,
                f"live workers still lag: {', '.join(lagging) or 'none'}; not settled"
                + (f" ({problem}: leases not judged, docs/time.md)" if problem else ""),
                rec.version,
            )

    def _add_location(self, group: list[Finding]) -> None:
        loc = group[0].location
        assert loc is not None
        services = tuple(group[0].evidence["expected_services"])
        before = self._read(loc)
        if before is not None and not before.deleted and all(
            s in before.services for s in services
        ):
            for f in group:
                self._record(f, Outcome.ALREADY_DONE, "present meanwhile", before.version)
            return
        rec = self.mgr.add_location(loc, services, actor=self.actor)
        if self._wrote(loc, 0 if before is None else before.version):
            what = "created" if before is None else "restored" if before.deleted else "added"
            outcome = Outcome.APPLIED
        else:
            what, outcome = "added meanwhile", Outcome.ALREADY_DONE
        for f in group:
            self._record(f, outcome, what, rec.version)

    def _remove_location(self, group: list[Finding]) -> None:
        for f in group:
            loc = f.location
            assert loc is not None
            before = self._read(loc)
            if before is None or before.deleted:
                self._record(f, Outcome.ALREADY_DONE, "removed meanwhile")
                continue
            rec = self.mgr.remove_location(loc, actor=self.actor)
            if self._wrote(loc, before.version):
                self._record(f, Outcome.APPLIED, f"removed at {iso(rec.deleted_at)}", rec.version)
            else:
                self._record(f, Outcome.ALREADY_DONE, "removed meanwhile", rec.version)

    def _purge(self, group: list[Finding]) -> None:
        for f in group:
            loc = f.location
            assert loc is not None
            version = int(f.evidence["version"])
            for _ in range(2):
                try:
                    self.mgr.purge_location(loc, version)
                except NotFound:
                    self._record(f, Outcome.ALREADY_DONE, "purged meanwhile")
                except InvalidTransition:
                    self._record(f, Outcome.ALREADY_DONE, "restored meanwhile; kept")
                except VersionConflict:
                    # Changed since the scan: purge only if it is still the same, ready tombstone.
                    rec = self._read(loc)
                    if rec is None:
                        self._record(f, Outcome.ALREADY_DONE, "purged meanwhile")
                    elif not rec.deleted:
                        self._record(f, Outcome.ALREADY_DONE, "restored meanwhile; kept")
                    elif rec.deleted_at != f.since or readiness(
                        rec, self.backend.workers(), self.backend.acks(loc), self.mgr.time,
                        self.ttl,
                    ) is None:
                        self._record(f, Outcome.BLOCKED, "changed meanwhile; no longer ready")
                    else:
                        version = rec.version
                        continue
                else:
                    self._record(f, Outcome.APPLIED, "purged")
                break
            else:
                self._record(f, Outcome.BLOCKED, "kept changing; left for the next check")
