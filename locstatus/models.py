"""Typed records of docs/design.md §2: what is stored, returned by the library and served over HTTP.

Every field is documented once, here. All datetimes are timezone-aware and normalised to UTC;
a naive datetime is refused rather than guessed. Location and service names are validated by
:mod:`locstatus.names` so a bad name never reaches a backend. Models are frozen: a state change
is a new value computed by :mod:`locstatus.fsm`, never an in-place edit of a cached object
(the "stale cache written back whole" failure mode of docs/design.md §1).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetPydanticSchema,
    StringConstraints,
    WithJsonSchema,
)
from pydantic_core import SchemaValidator, core_schema

from locstatus.clock import TimeSource
from locstatus.names import LOCATION_RE, SERVICE_ALIASES, SERVICE_RE, check_location


def utcnow() -> datetime:
    """The current time as an aware UTC datetime."""
    return datetime.now(UTC)


def new_op_id() -> str:
    """A fresh operation id (32 hex characters), recorded with every write (docs/design.md §3.2)."""
    return uuid.uuid4().hex


def _to_utc(value: datetime) -> datetime:
    try:
        return value.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59:59-01:00: a valid datetime, no UTC time
        raise ValueError("out of range: its UTC time is past year 9999 or before year 1") from None


def _service_aliases(value: Any) -> Any:
    """Map alias keys (``crr``) to canonical service names. Raises ValueError when an alias
    and the name it stands for are both keys: which of the two holds the state is not said."""
    if isinstance(value, dict) and any(k in SERVICE_ALIASES for k in value):
        out = {SERVICE_ALIASES.get(k, k): v for k, v in value.items()}
        if len(out) != len(value):
            both = [f"{a!r} and {c!r}" for a, c in SERVICE_ALIASES.items() if {a, c} <= set(value)]
            raise ValueError(f"{', '.join(both)} name the same service: keep one of them")
        return out
    return value


def _service_tuple(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(SERVICE_ALIASES.get(v, v) if isinstance(v, str) else v for v in value)
    return value


# Why the schemas below are hand-built: every stored record is decoded on the hot paths (scan,
# statuses(), the agent's snapshot, the check job, each transition's read). A Python validator
# anywhere in a model makes pydantic-core call back into Python per field, and a ``before``
# validator on ``services`` makes it build the whole sub-tree as Python objects first and then
# validate it a second time: together they made a decode 2x slower than json.loads + nothing.
# So what stored records always hold (UTC times, canonical service keys) is checked in Rust, and
# the Python callbacks run only for input that needs them (an offset to convert, an alias).


def _utc_schema(_source: Any, _handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
    return core_schema.union_schema(
        [
            core_schema.datetime_schema(tz_constraint=0),  # UTC already: no Python call
            core_schema.no_info_after_validator_function(
                _to_utc, core_schema.datetime_schema(tz_constraint="aware")
            ),
        ],
        mode="left_to_right",
        custom_error_type="utc_datetime",
        custom_error_message=(
            "Input should be a timezone-aware date and time (ISO 8601 with Z or an offset)"
        ),
    )


def _aliases_on_python_input(fn: Callable[[Any], Any]) -> GetPydanticSchema:
    """The field's own schema, with ``fn`` mapping service aliases first on Python input only:
    stored JSON holds canonical names and is validated in Rust alone."""

    def schema(source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        inner = handler(source)
        return core_schema.json_or_python_schema(
            json_schema=inner,
            python_schema=core_schema.no_info_before_validator_function(fn, inner),
        )

    return GetPydanticSchema(schema)


UTCDateTime = Annotated[
    datetime,
    GetPydanticSchema(_utc_schema),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]
"""An aware datetime, converted to UTC. Naive datetimes are refused."""

LocationName = Annotated[str, StringConstraints(pattern=f"^{LOCATION_RE.pattern}$")]
"""A location name (docs/design.md §2): ``^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`` (which excludes
``.`` and ``..``). Checked in pydantic's core for speed; entry points also call
:func:`locstatus.names.check_location`, which refuses the reserved bulk name ``all``."""

ServiceName = Annotated[str, StringConstraints(pattern=f"^{SERVICE_RE.pattern}$")]
"""A service name (``crr`` is read as ``replication`` where services are keys, see
:class:`LocationStatus`)."""


def _worker_id_schema(source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
    stored = core_schema.str_schema(pattern=f"^{LOCATION_RE.pattern}$")
    return core_schema.json_or_python_schema(
        json_schema=stored,
        python_schema=core_schema.no_info_after_validator_function(check_location, stored),
    )


WorkerId = Annotated[str, GetPydanticSchema(_worker_id_schema)]
"""Worker ids follow the location-name rules (they become znode names and keys too)."""


class State(StrEnum):
    """The four states of a service at a location (docs/design.md §3)."""

    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    RESUMING = "resuming"

    @property
    def transitional(self) -> bool:
        """``pausing`` and ``resuming`` wait for worker acknowledgements before settling
        (docs/design.md §3): what every site that settles, reports a stuck transition or
        waits for workers asks."""
        return self in _TRANSITIONAL

    @property
    def desired_paused(self) -> bool:
        """True when the operator asked for the service to be paused."""
        return self in _DESIRED_PAUSED


# Sets, not tuples: membership is a hash lookup, and the check's screen asks once per service
# of every record (bench/check.py).
_TRANSITIONAL = frozenset({State.PAUSING, State.RESUMING})
_DESIRED_PAUSED = frozenset({State.PAUSING, State.PAUSED})


MAX_STORED_INT = 2**63 - 1
"""The largest generation or version a record may hold: every backend stores them as signed
64-bit integers (SQLite's INTEGER, MongoDB's int64), so a larger one could not be written back
or acknowledged (a raw ``OverflowError`` once, retried for ever by the agent). A stored record
beyond it is a :class:`~locstatus.errors.CorruptRecord`."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=False)


_Model = TypeVar("_Model", bound=_Frozen)
_setattr = object.__setattr__


def copy_with(model: _Model, update: dict[str, Any]) -> _Model:
    """``model.model_copy(update=update)``: a copy of a frozen model with these fields replaced,
    not validated (the caller passes values of the fields' types, as with ``model_copy``),
    without pydantic's generic copy (which copies each of the model's internals with
    :func:`copy.copy`: 2.6 against 1.6 us a call). Every write makes several (the new service
    status, the new record, the history entry's and the stored record's version), so a bulk
    operation of 100 000 locations makes 400 000 (docs/benchmarks.md, "Bulk operations"). The
    models forbid extra fields and have no private attributes, so both are None in a copy."""
    cls = type(model)
    new = cls.__new__(cls)
    fields = model.__dict__.copy()
    fields.update(update)
    _setattr(new, "__dict__", fields)
    _setattr(new, "__pydantic_extra__", None)
    _setattr(new, "__pydantic_fields_set__", model.__pydantic_fields_set__ | update.keys())
    _setattr(new, "__pydantic_private__", None)
    return new


def with_version(record: LocationStatus, version: int) -> LocationStatus:
    """``record`` at ``version``: itself when it is already (a write planned from the record
    it replaces carries the version it produces), else a copy (:func:`copy_with`)."""
    return record if record.version == version else copy_with(record, {"version": version})


def built_from(cls: type[_Model], fields: dict[str, Any]) -> _Model:
    """``cls.model_construct(**fields)`` for values that are already of the fields' types and
    normalised (names checked, datetimes aware UTC): an instance not validated again. Only for
    what is built from validated parts in a hot path (a transition's history entry, from the
    validated status and event); ``fields`` must give every field (the defaults are not
    filled in). pydantic's ``model_construct`` fills defaults field by field and measured
    slower than validating; this takes 1 us."""
    new = cls.__new__(cls)
    _setattr(new, "__dict__", fields)
    _setattr(new, "__pydantic_extra__", None)
    _setattr(new, "__pydantic_fields_set__", set(fields))
    _setattr(new, "__pydantic_private__", None)
    return new


class ServiceStatus(_Frozen):
    """Status of one service at one location."""

    state: State = State.RUNNING
    """Current state: running | pausing | paused | resuming."""
    generation: int = Field(default=0, ge=0, le=MAX_STORED_INT)
    """+1 each time the desired state flips (pause <-> resume). Workers acknowledge it. At most
    :data:`MAX_STORED_INT`."""
    resume_at: UTCDateTime | None = None
    """When a scheduled resume is due (UTC), or None. Only set while pausing/paused."""
    reason: str | None = Field(default=None, max_length=1024)
    """Free text given with the last change that gave a reason or an actor (with ``actor``: one
    pair, never a reason beside someone who did not give it)."""
    actor: str | None = Field(default=None, max_length=256)
    """Who made the last change that gave a reason or an actor (paired with ``reason``)."""
    op_id: str | None = Field(default=None, max_length=64)
    """Id of the operation that last changed this status (docs/design.md §3.2)."""
    updated_at: UTCDateTime | None = None
    """When this status last changed (UTC)."""

    @property
    def paused(self) -> bool:
        """True when the desired state is paused (``pausing`` or ``paused``)."""
        return self.state.desired_paused

    # "A resume is due" is decided here and nowhere else (docs/time.md, "What is decided on
    # it"): the firers (the manager's fire_due_resumes, the sidecar's reconciler, an agent, the
    # check's repair) act on resume_due; what only reports (the check's overdue_resume, the
    # sidecar's gauges and page) uses resume_overdue.

    @property
    def scheduled_resume(self) -> datetime | None:
        """When this service's scheduled resume is due (aware UTC), or None when none is
        scheduled. A resume is scheduled only while the service is ``paused`` or ``pausing``,
        the states the FSM's ``resume_due`` event leaves (docs/fsm.md); a ``resume_at`` on a
        running or resuming service (no locstatus write leaves one; a hand edit can) would fire
        nothing, so it is neither due nor counted."""
        return self.resume_at if self.state in _DESIRED_PAUSED else None

    def resume_due(self, time: TimeSource) -> bool:
        """True when the scheduled resume must fire now: its time passed by the backend's time
        beyond doubt (``time.is_past``, docs/time.md): never early, whatever this host's clock,
        and never while ``time`` cannot tell the backend's time within its bound (it refuses
        and counts the refusal; docs/time.md, "When the bound cannot be met")."""
        at = self.scheduled_resume
        return at is not None and time.is_past(at)

    def resume_overdue(self, now: datetime) -> bool:
        """True when the scheduled resume's time is at or before ``now`` (aware UTC: the
        backend's time as this process estimates it, ``Manager.clock()``). For reporting
        only ("overdue", docs/time.md: reporting, not acting); whoever fires asks
        :meth:`resume_due`."""
        at = self.scheduled_resume
        return at is not None and at <= now


class LocationStatus(_Frozen):
    """All services of one location, stored as one record with one version."""

    location: LocationName
    """The location name."""
    services: Annotated[
        dict[ServiceName, ServiceStatus], _aliases_on_python_input(_service_aliases)
    ]
    """Status per service; only the services this location has (docs/design.md §5.2). Python input
    may use the ``crr`` alias as a key; stored JSON holds canonical names."""
    version: int = Field(default=0, ge=0, le=MAX_STORED_INT)
    """The backend's version of the record, for compare-and-set; the HTTP ETag. 0 = unsaved."""
    deleted_at: UTCDateTime | None = None
    """Tombstone (docs/design.md §3.5): when the location was removed, or None."""

    @property
    def deleted(self) -> bool:
        """True when the record is a tombstone."""
        return self.deleted_at is not None


class HistoryEntry(_Frozen):
    """One state change, written in the same atomic write as the change itself (docs/design.md
    §2)."""

    op_id: str
    """Id of the operation that wrote this entry."""
    at: UTCDateTime
    """When the change was made (UTC)."""
    location: LocationName
    service: str
    """Service name, or ``*`` for a record-level event (create, remove, restore)."""
    event: str
    """The state-machine event (pause, resume, settle, ...) or create/remove/restore."""
    from_state: State | None = None
    to_state: State | None = None
    generation: int = Field(default=0, le=MAX_STORED_INT)
    """The service's generation after the change."""
    actor: str | None = None
    reason: str | None = None
    resume_at: UTCDateTime | None = None
    """The scheduled resume after the change."""
    version: int = Field(default=0, le=MAX_STORED_INT)
    """The record version this write produced (set by the backend at commit)."""


TOMBSTONE_ACK = "_tombstone"
"""Pseudo-service name a worker acknowledges a tombstone with (docs/design.md §3.5)."""


def tombstone_generation(deleted_at: datetime) -> int:
    """The generation a worker acknowledges a tombstone with: ``deleted_at`` in milliseconds
    since the epoch, so an acknowledgement of an earlier removal (remove, restore, remove
    again) never counts for a later one."""
    return int(deleted_at.timestamp() * 1000)


class StuckHandler(_Frozen):
    """A worker's handler that has been running past the agent's ``handler_deadline``
    (docs/agent.md "Handlers"): where the worker is stuck."""

    event: str
    """What the handler applies: ``pause``, ``resume``, ``remove`` or ``fence``."""
    handler: str = Field(max_length=256)
    """The handler function (``module.qualname``)."""
    since: UTCDateTime
    """When it started (UTC, the manager's time source)."""


class WorkerInfo(_Frozen):
    """A registered worker process (docs/design.md §2) and its lease."""

    worker_id: WorkerId
    services: Annotated[tuple[ServiceName, ...], _aliases_on_python_input(_service_tuple)]
    """Services this worker applies."""
    locations: tuple[LocationName, ...] | None = None
    """Location filter; None means every location."""
    host: str = ""
    pid: int = 0
    instance: str | None = None
    """The writer's instance id (:func:`locstatus.instance.process_instance`), which tells
    apart two processes of one host name and pid (each pid 1 in its own pid namespace);
    None when unknown (a record of an older version, or an ordinary registration). Written on
    standing registrations only, and stored only when set, so an ordinary registration is
    stored exactly as before (docs/backbeat.md, "2. The bridge", One bridge publishes)."""
    started_at: UTCDateTime | None = None
    lease_expires_at: UTCDateTime | None = None
    """Heartbeat backends: the lease deadline (UTC). None: the lease is a session (ZooKeeper
    ephemeral node) and the worker is alive while it is listed."""
    errors: dict[str, str] = Field(default_factory=dict)
    """Last handler error per ``location/service`` (cleared on success). Stored bounded
    (docs/agent.md "Registrations are bounded"): at most 100, each cut to 1000 characters,
    the others counted under the key ``...``."""
    clock_offset_seconds: float | None = None
    """The worker process's wall clock minus the backend's time, in seconds, as it last
    measured it (docs/time.md); None when not measured. Reported, never trusted."""
    stuck: dict[str, StuckHandler] = Field(default_factory=dict)
    """Handlers running past the worker's handler deadline, per ``location/service``
    (docs/agent.md "Handlers"); cleared when they return."""
    standing: bool = False
    """A standing registration (docs/agent.md "Standing registrations"): a participant that
    stays counted while whoever holds it is away. It counts as live for every settle whatever
    its lease (:func:`~locstatus.manager.liveness.worker_live`); its lease (or, on ZooKeeper,
    its holder's session, :attr:`away`) only tells whether its holder is present. No backend
    drops it when its lease lapses; it ends only when retired (``Manager.retire_worker``).
    Stored only when true, so an ordinary registration is stored exactly as before."""
    away: bool = False
    """Set by a backend only, never stored: a standing registration no session holds any more
    (ZooKeeper: its holder's ephemeral node is gone). Heartbeat backends tell the same by the
    lease having lapsed (:func:`~locstatus.manager.liveness.holder_away`)."""
    corrupt: str | None = None
    """Set by a backend only, never stored: the stored registration of ``worker_id`` does not
    parse or validate (what is wrong). Such a worker is listed as a live worker that applies
    every service at every location (:meth:`applies`) and has acknowledged nothing of its
    registration's, while the lease read from what is left holds (docs/agent.md "Unreadable
    registrations and acknowledgements"): a settle never happens without it."""

    def alive(self, now: datetime) -> bool:
        """True while the lease holds at ``now`` (an aware datetime)."""
        return self.lease_expires_at is None or self.lease_expires_at > now

    def applies(self, location: str, service: str) -> bool:
        """True if this worker must acknowledge ``service`` at ``location``; always for a
        :attr:`corrupt` registration (what it applies cannot be read)."""
        if self.corrupt is not None:
            return True
        return service in self.services and (self.locations is None or location in self.locations)


class Hint(_Frozen):
    """A change hint from a backend. Hints may be coalesced or dropped; a ``resync`` hint
    (reconnect, lost session, overflow) means: re-read everything (docs/design.md §3.4)."""

    kind: str
    """``location`` | ``acks`` | ``workers`` | ``resync``."""
    location: str | None = None
    record: LocationStatus | None = None
    """For a ``location`` hint, the record as the backend read it while producing the hint
    (ZooKeeper reads it when it sets its watch again), or None. Subscribers may use it in place
    of a read of their own; it is never older than the change hinted."""
    session_lost: bool = False
    """For a ``resync`` hint: the backend's session was replaced by a new one (a ZooKeeper
    session expiry), so the acknowledgements it held for this process are gone; an agent
    acknowledges again what it applied."""


# -- stored records: only what was written is read ----------------------------------------------


def _every_field_required(node: Any) -> Any:
    """A copy of the core schema ``node`` in which no model field has a default."""
    if isinstance(node, dict):
        out = {k: _every_field_required(v) for k, v in node.items()}
        inner = out.get("schema")
        if out.get("type") == "model-field" and isinstance(inner, dict) and (
            inner.get("type") == "default"
        ):
            out["schema"] = inner["schema"]
        return out
    if isinstance(node, list):
        return [_every_field_required(v) for v in node]
    return node


_STORED_TIME = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T"
"""How every stored time starts (the encoder writes ISO 8601): a number, or a string of digits
(which pydantic would read as seconds since the epoch), is no stored time."""


def _strict(node: Any) -> Any:
    """A copy of the core schema ``node`` that takes only what the encoder writes: integers as
    JSON integers (not ``true``, ``"1"`` or ``1.0``), times as ISO 8601 text (not
    ``1700000000``, nor ``0`` for a 1970 tombstone), strings and states as JSON strings."""
    if isinstance(node, list):
        return [_strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "union" and node.get("custom_error_type") == "utc_datetime":
        # the text is checked first; then parsed from it (a str, hence not strictly)
        return core_schema.custom_error_schema(
            core_schema.chain_schema(
                [core_schema.str_schema(pattern=_STORED_TIME, strict=True), _lax_times(node)]
            ),
            custom_error_type="stored_datetime",
            custom_error_message=(
                "Input should be an ISO 8601 date and time with Z or an offset (as stored)"
            ),
        )
    out = {k: _strict(v) for k, v in node.items()}
    # (states stay lax: a strict enum takes only State instances from a decoded document,
    # and a lax one takes its values only, in either mode)
    if out.get("type") in ("int", "str", "dict", "bool", "float"):
        out["strict"] = True
    elif out.get("type") == "enum":
        out["strict"] = False
    if isinstance(out.get("config"), dict):
        out["config"] = {**out["config"], "strict": True}
    return out


def _lax_times(node: Any) -> Any:
    if isinstance(node, list):
        return [_lax_times(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _lax_times(v) for k, v in node.items()}
    if out.get("type") == "datetime":
        out["strict"] = False
    return out


STORED_RECORD = SchemaValidator(
    _strict(_every_field_required(LocationStatus.__pydantic_core_schema__)),
    # Build from the schema given, not from the models' own validators (which pydantic-core
    # would otherwise reuse for the nested model, defaults included).
    _use_prebuilt=False,
)
"""The validator of a record as a backend stores it: :class:`LocationStatus` with every field
of the record and of each :class:`ServiceStatus` required (``null`` where the field allows it),
so a stored record that leaves a field out is refused instead of being completed with defaults
(a service entry without ``state`` read as ``running``: Backbeat's BB-37). Every record any
version of locstatus stored carries every field, since the encoder writes them all, ``null``
included (docs/reliability.md, "What a stored record carries"). It builds the same instances
from the same hand-built field schemas, in one pass of pydantic-core, so a decode costs what a
decode with :class:`LocationStatus` costs. Values built in Python keep the defaults.

It is strict (the hostile review of issue 15: only what was written may be read): an integer
is a JSON integer (``true``, ``"1"`` and ``1.0`` are not 1), within :data:`MAX_STORED_INT`; a
time is ISO 8601 text with ``Z`` or an offset (``1700000000`` is no date, ``0`` no 1970
tombstone the check would purge). A decoded document (MongoDB's, ``validate_python``) is held
to the same rules as stored text: its times must be ISO 8601 strings too (a BSON date is no
stored value), its integers ints."""

