"""A bulk operation's plan at fleet scale: the general plan's decisions and stored bytes, without
running the state machine and the encoders from scratch at every location.

Why: a ``pause all`` of 100 000 locations spent most of its time per location in Python: the
state machine's decision, a new service status, record and history entry built, both encoded
by pydantic (docs/benchmarks.md, "Bulk operations"). Across a fleet these are nearly all the
same: one operation, one time per batch, services in a handful of distinct states. So:

- **Cases.** What an operator event (pause, resume, a schedule, its cancel) does to one service
  depends on its status but for ``op_id`` and ``updated_at``: the state machine's rules read
  the state, the generation and the scheduled resume; the new status keeps or replaces the
  reason and actor; and every change overwrites ``op_id`` and ``updated_at``
  (tests/test_bulk_plan.py checks it against :func:`~locstatus.fsm.transition`). A
  :class:`_Case` is that outcome computed once, by the state machine itself, for the first
  status of each key of a batch: the new status (one frozen value shared by every location of
  the case), its stored JSON, and its history entry's stored JSON with the location and the
  version left as slots.
- **The same bytes.** The texts come from the codec's own encoders (the status through
  :func:`~locstatus.backends.codec.service_text`, the entry through
  :func:`~locstatus.backends.codec.encode_history` with sentinels cut out), and each case's
  first record in a batch is also encoded the general way and compared: a case whose texts
  differ is not used, its locations go to the general plan. So does every record the cases do not
  cover: a removed one, a refusal, a generation at the top, a schedule of "every service"
  (which leaves refused services alone), more distinct statuses than :data:`MAX_CASES`.
- **Still one write per location.** The plan decides one location's write from its record,
  as the general plan does (a :class:`~.plans.Write`, :data:`~.plans.NOTHING`); only the
  stored texts come with the write (:attr:`~.plans.Write.texts`), for a backend that stores
  the codec's text (SQLite) to use as they are. Its compare-and-set, conflicts and history
  are the write loop's (:mod:`.writes`), as for any plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from locstatus.backends import codec
from locstatus.errors import InvalidInput, InvalidTransition
from locstatus.fsm import Event, transition
from locstatus.models import MAX_STORED_INT, HistoryEntry, LocationStatus, ServiceStatus, copy_with

from .plans import NOTHING, Decision, Plan, Write

MAX_CASES: Final = 4096
"""Distinct service statuses one batch keeps cases for; the statuses beyond go to the general
plan (a fleet's statuses are a handful: those of the operations that last wrote them)."""

_LOCATION: Final = "\x00location\x00"
"""Stands for the location in an entry's template: encoded as ``"\\u0000location\\u0000"``,
which no other field's text holds (free text has no control character, op ids are printable,
a name matches its pattern), and a template whose sentinel is not met exactly once is not
used."""
_VERSION: Final = MAX_STORED_INT - 12_345
"""Stands for the version in an entry's template (a version no write of a case reaches: a case
is made only below :data:`_TOP`)."""
_TOP: Final = _VERSION - 1
"""Records at this version or above go to the general plan (no template's sentinel is then a
version a write produces)."""

_Key = tuple[str, str, int, datetime | None, str | None, str | None]
"""A case's key: the service, and its status but for ``op_id`` and ``updated_at``."""


@dataclass(frozen=True, slots=True)
class _Case:
    """One service status's outcome under the operation at one time: ``status`` None when
    nothing changes; else the new status, its stored ``text``, the history ``entry`` the state
    machine made for it (at the location and version of the first record met), and that
    entry's stored JSON around the location (``head`` .. ``middle``) and version (``middle`` ..
    ``tail``); ``alone``: the stored text of a record holding this service alone."""

    status: ServiceStatus | None
    text: str = ""
    entry: HistoryEntry | None = None
    head: str = ""
    middle: str = ""
    tail: str = ""
    alone: str = ""


_NO_CHANGE: Final = _Case(None)
_GENERAL: Final = _Case(None)
"""The key's records go to the general plan."""


class BulkPlan:
    """A :data:`~.plans.Plan` of one operator event for many records, deciding as ``general``
    (the operation's own plan, :meth:`.operator.Operation.plan`) does and giving each write its
    stored texts (see the module docstring). ``event``: the state machine's event, the same for
    each service; ``names``: the targeted services (None: every service of each record).
    ``general`` decides what the cases do not cover."""

    def __init__(
        self, event: Event, op_id: str, names: Sequence[str] | None, general: Plan
    ) -> None:
        self.event, self.op_id, self.general = event, op_id, general
        self.names = None if names is None else tuple(names)
        self._now: datetime | None = None
        self._cases: dict[_Key, _Case] = {}
        self._checked: set[tuple[int, ...]] = set()  # the cases (by id) compared together
        self._one = self.names[0] if self.names is not None and len(self.names) == 1 else None

    def __call__(self, rec: LocationStatus, now: datetime) -> Decision:
        if rec.deleted_at is not None or rec.version >= _TOP:
            return self.general(rec, now)
        if now != self._now:  # a case is the outcome at one time
            self._now = now
            self._cases.clear()
            self._checked.clear()
        services = rec.services
        if self._one is not None and len(services) == 1:
            return self._alone(rec, self._one, now)
        chosen = self.names if self.names is not None else sorted(services)
        cases = self._cases
        changes: list[tuple[str, _Case]] = []
        for name in chosen:
            st = services.get(name)
            if st is None:
                return self.general(rec, now)  # the general plan names what is missing
            key = (name, st.state, st.generation, st.resume_at, st.reason, st.actor)
            case = cases.get(key)
            if case is None:
                if len(cases) >= MAX_CASES:
                    return self.general(rec, now)
                case = cases[key] = self._case(rec, name, st, now)
            if case is _GENERAL:
                return self.general(rec, now)
            if case.status is not None:
                changes.append((name, case))
        if not changes:
            return NOTHING
        version = rec.version + 1
        location = rec.location
        new_services = dict(services)
        entries: list[HistoryEntry] = []
        for name, case in changes:
            assert case.status is not None and case.entry is not None  # a change's case
            new_services[name] = case.status
            entries.append(copy_with(case.entry, {"location": location, "version": version}))
        record = copy_with(rec, {"services": new_services, "version": version})
        vtext = str(version)
        history = "[" + ",".join(
            f"{c.head}{location}{c.middle}{vtext}{c.tail}" for _, c in changes
        ) + "]"
        if len(new_services) == 1:
            texts = [(changes[0][0], changes[0][1].text)]
        else:  # in the record's own order, the others as they are
            mine = {name: c.text for name, c in changes}
            texts = [
                (name, mine[name] if name in mine else codec.service_text(st))
                for name, st in new_services.items()
            ]
        write = Write(record, entries, (codec.live_record_text(texts), history))
        signature = tuple([id(c) for _, c in changes])
        if signature not in self._checked and not self._same_as_general(write, changes):
            return self.general(rec, now)
        return write

    def _alone(self, rec: LocationStatus, name: str, now: datetime) -> Decision:
        """:meth:`__call__` of a record holding one service, the one targeted (the usual
        fleet's pause of one service): the same decision, in fewer steps."""
        st = rec.services.get(name)
        if st is None:
            return self.general(rec, now)
        key = (name, st.state, st.generation, st.resume_at, st.reason, st.actor)
        cases = self._cases
        case = cases.get(key)
        if case is None:
            if len(cases) >= MAX_CASES:
                return self.general(rec, now)
            case = cases[key] = self._case(rec, name, st, now)
        if case.status is None:
            return self.general(rec, now) if case is _GENERAL else NOTHING
        assert case.entry is not None  # a change's case
        version = rec.version + 1
        location = rec.location
        write = Write(
            copy_with(rec, {"services": {name: case.status}, "version": version}),
            [copy_with(case.entry, {"location": location, "version": version})],
            (case.alone, f"[{case.head}{location}{case.middle}{version}{case.tail}]"),
        )
        if (id(case),) not in self._checked and not self._same_as_general(write, [(name, case)]):
            return self.general(rec, now)
        return write

    def _case(self, rec: LocationStatus, name: str, st: ServiceStatus, now: datetime) -> _Case:
        """The state machine's outcome for ``st``, with its texts; :data:`_GENERAL` for a
        refusal or a status the templates cannot take."""
        try:
            change = transition(
                rec.location, name, st, self.event, now=now, op_id=self.op_id,
                version=rec.version + 1,
            )
        except (InvalidTransition, InvalidInput):
            return _GENERAL  # the general plan refuses it, naming the location
        if change is None:
            return _NO_CHANGE
        probe = copy_with(change.entry, {"location": _LOCATION, "version": _VERSION})
        text = codec.encode_history([probe])[1:-1]
        loc_json, version_json = codec.json_text(_LOCATION), str(_VERSION)
        if text.count(loc_json) != 1 or text.count(version_json) != 1:
            return _GENERAL
        head, rest = text.split(loc_json)
        if rest.count(version_json) != 1:
            return _GENERAL  # the version before the location: not this template's shape
        middle, tail = rest.split(version_json)
        text = codec.service_text(change.status)
        return _Case(
            change.status, text, change.entry, head + '"', '"' + middle, tail,
            codec.live_record_text([(name, text)]),
        )

    def _same_as_general(self, write: Write, changes: list[tuple[str, _Case]]) -> bool:
        """Whether ``write``'s texts are what the codec writes for its record and entries: each
        set of cases met together is compared once per batch, and a case whose texts differ is
        not used again."""
        self._checked.add(tuple([id(c) for _, c in changes]))
        assert write.texts is not None
        same = write.texts == (
            codec.encode_record(write.record),
            codec.encode_history(codec.stamp(write.entries, write.record.version)),
        )
        if not same:
            used = {id(c) for _, c in changes}
            for key, known in list(self._cases.items()):
                if id(known) in used:
                    self._cases[key] = _GENERAL
        return same
