"""The checker run after every scenario: is the history consistent with what every caller was
told, and did every live worker converge to the backend's state?

:func:`check_ops` reads the operation logs of :mod:`loadgen` and the backend's full history
(``history_check.full_history``, the reader of the existing no-lost-update test) and checks,
per location:

- **gap-free chain**: the versions of the history are consecutive (one write, one version);
- **exactly once**: an operation told ``wrote`` is in the history once, at the version it was
  told (missing: *lost*; twice: *duplicated*); one told ``noop``/``refused``/``failed`` is not
  there at all (*phantom*); one whose outcome is unknown (ambiguous commit, or its process was
  killed mid-call) is there at most once;
- **real-time order**: a write that completed before another started has the lower version;
- **replay**: per service, each entry starts from the state the previous one left
  (``from_state`` = previous ``to_state``), the generation moves by exactly one when the desired
  state flips and not otherwise, and replaying the history gives the stored record (state,
  generation, scheduled resume) at the version of the newest entry.

It runs once the system has converged (nothing pending), so records and histories, read one
after the other, describe the same state.

:func:`check_clock_safety` counts what the clock design (docs/time.md) rules out, from the same
history, the operation logs and what each worker's handlers did (their event files):

- **false settle**: a ``settle`` to paused (running) while a live worker had not applied
  paused (running). The settle's real time is bounded by the operations around it in the
  version chain (after the start of every operation whose write is older, before the end of
  every one whose write is newer), never by its own stamp (a writer whose clock is off stamps
  it wrong); it is false when a worker that was up and healthy throughout (no kill, freeze or
  failed heartbeat within a lease of it) had not applied that state at any instant of that
  interval.
- **early resume**: a ``resume_due`` that happened before the ``resume_at`` it fired, by the
  backend's time (this host's: every server runs here): the write is bounded as above and by
  the first worker handler that applied its generation.

Both are conservative: anything the timings cannot prove is not counted.

It extends ``history_check.check_history`` (which assumes no faults: every failure must be
absent, and every process finished) with unknown outcomes, killed processes and the replay.

:func:`divergence` is the convergence predicate (it lists why the system has not converged; empty
means converged): no service pausing/resuming, no scheduled resume due in the next 10 s, every live worker's
published view equal to the backend (same record version, acknowledged the current generation,
its handlers applied the desired state), and :func:`locstatus.check.run_check` reports
``clean``. :func:`wait_converged` polls it and measures the time.
"""

from __future__ import annotations

import bisect
import itertools
import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from agent_proc import AgentProc

from locstatus import connect
from locstatus.check import run_check
from locstatus.errors import CorruptRecord
from locstatus.manager import Manager
from locstatus.models import HistoryEntry, LocationStatus, State

from support.history_check import full_history

MUST_BE_ABSENT = ("noop", "refused", "failed")
SOON = timedelta(seconds=10)
"""A scheduled resume due within this much is pending work: the system has not converged
(the load's short schedules are seconds ahead; its long ones hours)."""


@dataclass
class Op:
    """One operation of the load: its ``b`` line, and its ``e`` line when it finished."""

    op_id: str
    op: str
    location: str
    service: str | None
    start: float
    end: float | None = None
    outcome: str = "killed"
    """wrote | noop | refused | failed | unknown | crash, or ``killed`` (no ``e`` line)."""
    version: int | None = None
    error: str | None = None
    ambiguous: bool = False
    """The manager met an ambiguous commit during the call and resolved it by op_id."""


def load_ops(paths: Iterable[Path]) -> list[Op]:
    """Every operation of every log file (a torn last line of a killed process is ignored)."""
    ops: dict[str, Op] = {}
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r["k"] == "b":
                ops[r["op_id"]] = Op(r["op_id"], r["op"], r["location"], r["service"], r["start"])
            elif r["op_id"] in ops:
                o = ops[r["op_id"]]
                o.end, o.outcome, o.version, o.error = r["end"], r["outcome"], r["version"], r["error"]
                o.ambiguous = bool(r.get("ambiguous"))
    return list(ops.values())


@dataclass
class OpReport:
    """Counts over every operation, and every violation found (empty when consistent)."""

    ops: int = 0
    writes: int = 0
    noops: int = 0
    refused: int = 0
    failed: int = 0
    unknown: int = 0
    """Outcome unknown to the caller (ambiguous commit, or process killed mid-call)."""
    unknown_applied: int = 0
    """Of those, how many are in the history (once each)."""
    lost: int = 0
    duplicated: int = 0
    ambiguous_resolved: int = 0
    """Calls that met an ambiguous commit and returned (resolved by op_id)."""
    misreported: int = 0
    """Of those, calls whose write is in the history but whose caller was told ``noop`` or
    another version (a violation; the bugs of ``test_product_bugs.py`` fixed in 43d6615 and
    70ae685)."""
    history_writes: int = 0
    """Writes in the history of the checked locations (operators', agents', schedulers')."""
    violations: list[str] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    """Failure messages by exception class (for the report)."""


def check_ops(url: str, locations: Sequence[str], ops: Sequence[Op]) -> OpReport:
    """Check the properties of the module docstring over ``locations``; return the counts and
    violations (the caller asserts)."""
    rep = OpReport(ops=len(ops))
    for o in ops:
        if o.outcome == "wrote":
            rep.writes += 1
        elif o.outcome == "noop":
            rep.noops += 1
        elif o.outcome == "refused":
            rep.refused += 1
        elif o.outcome == "failed":
            rep.failed += 1
        elif o.outcome in ("unknown", "killed"):
            rep.unknown += 1
        elif o.outcome == "crash":
            rep.violations.append(f"op {o.op_id} ({o.op} {o.location}) crashed: {o.error}")
        if o.error:
            name = o.error.split(":", 1)[0]
            rep.errors[name] = rep.errors.get(name, 0) + 1
    mgr = connect(url)
    try:
        records = {r.location: r for r in mgr.scan() if isinstance(r, LocationStatus)}
    finally:
        mgr.close()
    by_loc: dict[str, list[Op]] = {}
    for o in ops:
        by_loc.setdefault(o.location, []).append(o)
    for loc in locations:
        hist = full_history(url, loc)
        rep.history_writes += len({e.version for e in hist})
        _check_location(loc, hist, by_loc.get(loc, []), records.get(loc), rep)
    return rep


def _check_location(
    loc: str, hist: list[HistoryEntry], ops: list[Op], record: LocationStatus | None,
    rep: OpReport,
) -> None:
    v = rep.violations
    versions = list(dict.fromkeys(e.version for e in hist))
    gaps = [(a, b) for a, b in itertools.pairwise(versions) if b != a + 1]
    if gaps:
        v.append(f"{loc}: history versions are not a gap-free chain: {gaps[:5]}")
    if versions != sorted(versions):
        v.append(f"{loc}: history is not in version order")
    # The versions each operation's own change landed at; a call whose change no live worker
    # applies settles it in a write of its own right after, under the same op_id (its settle
    # rows), and returns that write's version (model/README.md, finding 1).
    seen: dict[str, set[int]] = {}
    settled: dict[str, int] = {}
    for e in hist:
        if e.event == "settle":
            settled[e.op_id] = e.version
        else:
            seen.setdefault(e.op_id, set()).add(e.version)

    def told(o: Op, found: set[int]) -> bool:
        """The caller was told the version of its change, or of its own settle after it."""
        return found == {o.version} or (
            len(found) == 1 and settled.get(o.op_id) == o.version and o.version > min(found)
        )

    for o in ops:
        found = seen.get(o.op_id, set())
        if o.ambiguous and o.outcome in ("wrote", "noop"):
            # Resolved by op_id after an ambiguous commit: applied at most once; when applied,
            # the caller should have been told so, at its write's version.
            rep.ambiguous_resolved += 1
            if len(found) > 1:
                rep.duplicated += 1
                v.append(f"{loc}: op {o.op_id} ({o.op}) applied {len(found)} times: {found}")
            elif o.outcome == "wrote" and not found:
                rep.lost += 1
                v.append(f"{loc}: op {o.op_id} ({o.op}) was told it wrote v{o.version}: lost")
            elif found and (o.outcome == "noop" or not told(o, found)):
                rep.misreported += 1
                v.append(f"{loc}: op {o.op_id} ({o.op}) is at {sorted(found)} after an "
                         f"ambiguous commit, its caller was told {o.outcome} v{o.version}")
            continue
        if o.outcome == "wrote":
            if not found:
                rep.lost += 1
                v.append(f"{loc}: op {o.op_id} ({o.op}) was told it wrote v{o.version}: lost")
            elif len(found) > 1:
                rep.duplicated += 1
                v.append(f"{loc}: op {o.op_id} ({o.op}) applied {len(found)} times: {found}")
            elif not told(o, found):
                v.append(f"{loc}: op {o.op_id} is at {found}, its caller was told v{o.version}")
        elif o.outcome in MUST_BE_ABSENT:
            if found:
                v.append(f"{loc}: op {o.op_id} ({o.op}, {o.outcome}: {o.error}) is in the history "
                         f"at {sorted(found)}")
        elif o.outcome in ("unknown", "killed"):
            if len(found) > 1:
                rep.duplicated += 1
                v.append(f"{loc}: op {o.op_id} of unknown outcome applied {len(found)} times")
            rep.unknown_applied += len(found) == 1
    # real-time order: a write that ended before another started has the lower version (for a
    # call resolved after an ambiguous commit, the version its write really has)
    done: list[tuple[float, float, int, str]] = []
    for o in ops:
        if o.end is None or o.outcome not in ("wrote", "noop"):
            continue
        found = seen.get(o.op_id, set())
        if o.ambiguous and len(found) == 1:
            done.append((o.start, o.end, next(iter(found)), o.op_id))
        elif not o.ambiguous and o.outcome == "wrote" and o.version is not None:
            done.append((o.start, o.end, int(o.version), o.op_id))
    by_end = sorted(done, key=lambda d: d[1])
    top, top_op, j = -1, "", 0
    for start, _, version, op_id in sorted(done):
        while j < len(by_end) and by_end[j][1] < start:
            if by_end[j][2] > top:
                top, top_op = by_end[j][2], by_end[j][3]
            j += 1
        if version <= top:
            v.append(f"{loc}: op {op_id} started after op {top_op} (v{top}) completed, "
                     f"yet got v{version}")
    _replay(loc, hist, record, v)


def _replay(
    loc: str, hist: list[HistoryEntry], record: LocationStatus | None, v: list[str]
) -> None:
    state: dict[str, tuple[State, int, datetime | None]] = {}
    for e in hist:
        if e.service == "*":
            continue
        if e.event == "add_service":
            state[e.service] = (State.RUNNING, 0, None)
            continue
        if e.from_state is None or e.to_state is None:
            v.append(f"{loc} v{e.version}: {e.event} of {e.service} has no from/to state")
            continue
        prev = state.get(e.service, (State.RUNNING, 0, None))
        if e.from_state != prev[0]:
            v.append(f"{loc} v{e.version}: {e.service} {e.event} from {e.from_state.value}, "
                     f"but the previous entry left it {prev[0].value}")
        flipped = e.from_state.desired_paused != e.to_state.desired_paused
        want = prev[1] + 1 if flipped else prev[1]
        if e.generation != want:
            v.append(f"{loc} v{e.version}: {e.service} {e.event} generation {e.generation}, "
                     f"expected {want}")
        state[e.service] = (e.to_state, e.generation, e.resume_at)
    if record is None:
        if hist:
            v.append(f"{loc}: history but no readable record")
        return
    if hist and hist[-1].version != record.version:
        v.append(f"{loc}: record at v{record.version}, its newest history entry is "
                 f"v{hist[-1].version}")
    for svc, st in record.services.items():
        got = state.get(svc, (State.RUNNING, 0, None))
        if (st.state, st.generation, st.resume_at) != got:
            v.append(f"{loc}: record {svc} is {st.state.value}/g{st.generation}/{st.resume_at}, "
                     f"history replays to {got[0].value}/g{got[1]}/{got[2]}")


# -- false settles and early resumes (docs/time.md) -----------------------------------------------

MEASURE = 0.05
"""Seconds a worker's event time, converted from its monotonic clock, may be off."""


@dataclass
class ClockReport:
    """What :func:`check_clock_safety` found: counts and one line per violation."""

    settles: int = 0
    false_settle: int = 0
    fired: int = 0
    early_resume: int = 0
    violations: list[str] = field(default_factory=list)


@dataclass
class _WorkerLog:
    """One worker's handler events and lifetimes, in this process's wall time."""

    id: str
    lease: float
    applied: dict[tuple[str, str], list[tuple[float, str]]] = field(default_factory=dict)
    resumed: dict[tuple[str, str, int], float] = field(default_factory=dict)
    """First start of a handler applying ``running`` per (location, service, generation)."""
    up: list[tuple[float, float]] = field(default_factory=list)
    disturbed: list[float] = field(default_factory=list)

    def steady(self, lo: float, hi: float) -> bool:
        """Up and undisturbed from a lease before ``lo`` to a lease after ``hi``."""
        if not any(a <= lo - self.lease and b >= hi for a, b in self.up):
            return False
        return not any(lo - self.lease <= t <= hi + self.lease for t in self.disturbed)

    def maybe(self, location: str, service: str, state: str, lo: float, hi: float) -> bool:
        """Could its handlers have left ``service`` at ``location`` in ``state`` at some instant
        of ``[lo, hi]``?"""
        timeline = self.applied.get((location, service), [])
        before = [to for t, to in timeline if t < lo - MEASURE]
        if before and before[-1] == state:
            return True
        return any(to == state for t, to in timeline if lo - MEASURE <= t <= hi + MEASURE)


def _worker_log(agent: AgentProc) -> _WorkerLog:
    shift = time.time() - time.monotonic()  # a monotonic reading of this host as wall time
    log = _WorkerLog(agent.id, agent.lease)
    ready: list[float] = []
    lines = agent.events.read_text().splitlines() if agent.events.exists() else []
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a torn last line of a killed process
        t = float(r["mono"]) + shift if "mono" in r else float(r["t"])
        ev = r.get("ev")
        if ev == "ready":
            ready.append(t)
        elif ev == "health":
            log.disturbed.append(t)
        elif ev in ("start", "end") and r.get("location") and r.get("service"):
            key = (r["location"], r["service"])
            if ev == "end":
                log.applied.setdefault(key, []).append((t, r.get("to")))
            elif r.get("to") == "running" and r.get("generation") is not None:
                gkey = (key[0], key[1], int(r["generation"]))
                log.resumed[gkey] = min(t, log.resumed.get(gkey, t))
    for timeline in log.applied.values():
        timeline.sort()
    life = sorted(agent.life)
    for i, (t, kind) in enumerate(life):
        log.disturbed.append(t)
        end = life[i + 1][0] if i + 1 < len(life) else float("inf")
        if kind == "start":
            begin = next((r for r in sorted(ready) if t <= r < end), None)
            if begin is not None:
                log.up.append((begin, end))
        elif kind == "thaw":
            log.up.append((t, end))
    return log


def _bounds(ops: Sequence[Op]) -> Callable[[int], tuple[float, float]]:
    """For a version of one location: (after, before), the real-time interval its write lies in,
    from the operations whose write is older (started before it) and newer (ended after)."""
    told = sorted((int(o.version), o.start, float(o.end)) for o in ops
                  if o.outcome == "wrote" and not o.ambiguous and o.version is not None
                  and o.end is not None)
    versions = [v for v, _, _ in told]
    after: list[float] = []
    for _, start, _ in told:
        after.append(max(start, after[-1]) if after else start)
    before: list[float] = [0.0] * len(told)
    low = float("inf")
    for i in range(len(told) - 1, -1, -1):
        low = min(low, told[i][2])
        before[i] = low

    def bounds(version: int) -> tuple[float, float]:
        i = bisect.bisect_left(versions, version)
        lo = after[i - 1] if i > 0 else float("-inf")
        j = bisect.bisect_right(versions, version)
        hi = before[j] if j < len(told) else float("inf")
        return lo, hi

    return bounds


def check_clock_safety(
    url: str, locations: Sequence[str], ops: Sequence[Op], agents: Sequence[AgentProc]
) -> ClockReport:
    """Count false settles and early resumes over ``locations`` (see the module docstring)."""
    rep = ClockReport()
    workers = [_worker_log(a) for a in agents]
    by_loc: dict[str, list[Op]] = {}
    for o in ops:
        by_loc.setdefault(o.location, []).append(o)
    for loc in locations:
        bounds = _bounds(by_loc.get(loc, []))
        scheduled: dict[str, datetime | None] = {}
        for e in full_history(url, loc):
            if e.event == "settle" and e.to_state in (State.PAUSED, State.RUNNING):
                rep.settles += 1
                lo, hi = bounds(e.version)
                want = e.to_state.value
                lagging = [w.id for w in workers
                           if hi != float("inf") and w.steady(lo, hi)
                           and not w.maybe(loc, e.service, want, lo, hi)]
                if lagging:
                    rep.false_settle += 1
                    rep.violations.append(
                        f"{loc} v{e.version}: {e.service} settled {want} (generation "
                        f"{e.generation}) between {_ts(lo)} and {_ts(hi)} while live worker(s) "
                        f"{', '.join(lagging)} had not applied it"
                    )
            elif e.event == "resume_due":
                rep.fired += 1
                due = scheduled.get(e.service)
                _, hi = bounds(e.version)
                seen = min((w.resumed.get((loc, e.service, e.generation), float("inf"))
                            for w in workers), default=float("inf"))
                happened = min(hi, seen)
                if due is not None and happened < due.timestamp() - MEASURE:
                    rep.early_resume += 1
                    rep.violations.append(
                        f"{loc} v{e.version}: {e.service} resume due at {due.isoformat()} fired "
                        f"by {_ts(happened)}, {due.timestamp() - happened:.2f}s early"
                    )
            if e.service != "*":
                scheduled[e.service] = e.resume_at
    return rep


def _ts(t: float) -> str:
    if t in (float("inf"), float("-inf")):
        return "?"
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


# -- convergence ---------------------------------------------------------------------------------


def divergence(
    mgr: Manager, agents: Sequence[AgentProc], *, expect_corrupt: Iterable[str] = (),
    allow_kinds: Iterable[str] = (),
) -> list[str]:
    """Why the system has not converged yet (empty list: converged). See the module
    docstring; ``expect_corrupt`` names corrupt records that are expected (they must be
    reported by the check as ``corrupt_record`` and by nothing else); ``allow_kinds`` are
    check findings that may stay (``clock_skew`` of a worker whose clock is off)."""
    why: list[str] = []
    read_at = time.time()
    now = mgr.clock()
    corrupt = set(expect_corrupt)
    records: dict[str, LocationStatus] = {}
    for r in mgr.scan():
        if isinstance(r, CorruptRecord):
            if r.location not in corrupt:
                why.append(f"unexpected corrupt record {r.location}: {r.detail}")
            continue
        records[r.location] = r
        if r.deleted:
            continue
        for svc, st in r.services.items():
            if st.state.transitional:
                try:  # who it waits for, and what is stored: the first thing to look at
                    lagging = mgr.lagging(r.location, svc)
                    acks = mgr.backend.acks(r.location)
                    workers = [w.worker_id for w in mgr.workers()]
                except Exception as exc:
                    lagging, acks, workers = [f"({type(exc).__name__})"], {}, []
                why.append(f"{r.location}/{svc} is {st.state.value} at generation "
                           f"{st.generation}, version {r.version}; lagging {lagging}; "
                           f"workers {workers}; acks {acks}")
            if st.resume_at is not None and st.resume_at <= now + SOON:
                why.append(f"{r.location}/{svc} resume due at {st.resume_at} (now {now})")
    if why:
        return why
    for a in agents:
        if not a.alive:
            continue
        snap = _fresh_snapshot(a, read_at)
        if snap is None:
            why.append(f"worker {a.id}: no view published since the backend was read")
            continue
        why.extend(_agent_divergence(a.id, snap, records))
    if why:
        return why
    report = run_check(mgr)
    allowed = set(allow_kinds)
    left = [f for f in report.findings
            if not (f.kind.value == "corrupt_record" and f.location in corrupt)
            and f.kind.value not in allowed]
    if left:
        why.extend(f"check: {f.kind.value} {f.location}/{f.service or f.worker_id}: {f.message}"
                   for f in left)
    missing = corrupt - {f.location for f in report.findings if f.kind.value == "corrupt_record"}
    if missing:
        why.append(f"check did not report corrupt records {sorted(missing)}")
    return why


def _fresh_snapshot(agent: AgentProc, since: float, wait: float = 2.0) -> dict[str, Any] | None:
    """The worker's published view, once it is newer than ``since`` (it publishes every
    0.1 s); None if it published nothing newer within ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        snap = agent.snapshot()
        if snap is not None and _published(snap) >= since:
            return snap
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)


def _published(snap: dict[str, Any]) -> float:
    """When a worker published ``snap``, in this process's wall time: from its monotonic clock
    (real even in a worker whose wall clock is off) when it gives it."""
    if "mono" in snap:
        return float(snap["mono"]) + time.time() - time.monotonic()
    return float(snap["t"])


def _agent_divergence(
    worker: str, snap: dict[str, Any], records: dict[str, LocationStatus]
) -> list[str]:
    why: list[str] = []
    views = snap["records"]
    for loc, rec in records.items():
        view = views.get(loc)
        if view is None:
            why.append(f"worker {worker}: has not seen {loc}")
            continue
        if view["version"] != rec.version or view["deleted"] != rec.deleted:
            why.append(f"worker {worker}: {loc} at v{view['version']}, backend v{rec.version}")
            continue
        if rec.deleted:
            continue
        for svc, st in rec.services.items():
            observed = snap["observed"].get(loc, {}).get(svc)
            applied = snap["applied"].get(loc, {}).get(svc)
            want = "paused" if st.paused else "running"
            if observed != st.generation:
                why.append(f"worker {worker}: {loc}/{svc} acknowledged g{observed}, "
                           f"backend g{st.generation}")
            elif applied != want:
                why.append(f"worker {worker}: {loc}/{svc} handlers left it {applied}, "
                           f"desired {want}")
    extra = set(views) - set(records)
    if extra:
        why.append(f"worker {worker}: knows locations the backend does not: {sorted(extra)[:5]}")
    return why


@dataclass
class Convergence:
    """When the system converged, measured from ``since`` (wall clock), or why it did not."""

    seconds: float | None
    polls: int
    last_divergence: list[str]
    trace: list[tuple[float, str]] = field(default_factory=list)
    """What kept it from converging, over time: (seconds since ``since`` at the end of the
    poll, the first reason and how many), each time that first reason changed; last, the
    converging poll. Shows what a convergence time is made of (report.json)."""


def wait_converged(
    url: str,
    agents: Sequence[AgentProc],
    *,
    since: float,
    timeout: float,
    expect_corrupt: Iterable[str] = (),
    allow_kinds: Iterable[str] = (),
    manager: Manager | None = None,
) -> Convergence:
    """Poll :func:`divergence` until it is empty (then ``seconds`` = now - ``since``) or
    ``timeout`` seconds have passed since ``since`` (then ``seconds`` is None). ``manager``: one
    connected (and its clock probed) before ``since``, so the time the checker takes to connect
    is not counted as the system's (closed here); None: connect here."""
    mgr = manager if manager is not None else connect(url)
    polls = 0
    why: list[str] = ["never checked"]
    trace: list[tuple[float, str]] = [(round(time.time() - since, 3), "connected")]
    try:
        while True:
            polls += 1
            try:
                why = divergence(mgr, agents, expect_corrupt=expect_corrupt,
                                 allow_kinds=allow_kinds)
            except Exception as exc:  # a backend still coming back: keep polling
                why = [f"{type(exc).__name__}: {exc}"]
            first = f"{why[0][:160]} (+{len(why) - 1} more)" if why else "converged"
            if trace[-1][1] != first:
                trace.append((round(time.time() - since, 3), first))
            if not why:
                return Convergence(time.time() - since, polls, [], trace)
            if time.time() - since > timeout:
                return Convergence(None, polls, why, trace)
            time.sleep(0.05)
    finally:
        mgr.close()
