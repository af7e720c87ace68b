"""Request and response bodies of the sidecar's v1 routes (docs/http.md), as pydantic models.

Kept apart from the routes so that what a client sends and gets is read in one place: the
OpenAPI document is generated from these models, and a body that breaks them is a 422 naming
the field before any route runs (free text is checked by :func:`~locstatus.names.check_text`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    model_validator,
)

from locstatus.errors import InvalidInput
from locstatus.names import MAX_ACTOR, MAX_REASON, check_text

from .problems import Problem

MAX_DELAY_SECONDS = 10 * 366 * 24 * 3600
"""Longest accepted scheduled-resume delay (about ten years), in seconds."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _free_text(field: str, limit: int) -> AfterValidator:
    """``check_text`` as a body validator: a control character is a 422 naming the field."""

    def check(value: str | None) -> str | None:
        try:
            return check_text(field, value, limit)
        except InvalidInput as exc:
            raise ValueError(exc.message) from None

    return AfterValidator(check)


def _iso_string(value: object) -> object:
    # JSON numbers would be taken as Unix times by pydantic; docs/http.md says ISO 8601.
    if not isinstance(value, str | datetime):
        raise ValueError(
            "at must be an ISO 8601 date and time with an offset, as a string, such as "
            f"2030-01-31T18:00:00Z (got {type(value).__name__} {str(value)[:40]}; a number is "
            "not read as a Unix time)"
        )
    return value


def _in_utc(value: datetime) -> datetime:
    try:
        return value.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59:59-01:00 is a datetime with no UTC time
        raise ValueError(
            f"at {value.isoformat()} is out of range: its UTC time is past year 9999 or before "
            "year 1"
        ) from None


Reason = Annotated[
    str | None,
    Field(max_length=MAX_REASON, description="Why (free text, no control characters)"),
    _free_text("reason", MAX_REASON),
]
Actor = Annotated[
    str | None,
    Field(max_length=MAX_ACTOR, description="Who (free text, no control characters)"),
    _free_text("actor", MAX_ACTOR),
]
ResumeTime = Annotated[
    AwareDatetime, BeforeValidator(_iso_string), AfterValidator(_in_utc)
]
"""An ISO 8601 string with an offset, in UTC range; stored in UTC."""


class PauseBody(_Body):
    """Body of ``POST .../pause`` (optional)."""

    reason: Reason = None
    actor: Actor = None
    wait: float | None = Field(
        default=None, ge=0, le=300,
        description="Seconds to wait until every live worker acknowledged (504 on timeout)",
    )


class ResumeBody(PauseBody):
    """Body of ``POST .../resume`` (optional): resume now, or schedule with ``at`` (an aware
    ISO datetime in the future) or ``in_seconds`` (positive), not both."""

    at: ResumeTime | None = Field(
        default=None, description="Scheduled resume time: ISO 8601 with an offset, a string"
    )
    in_seconds: float | None = Field(
        default=None, gt=0, le=MAX_DELAY_SECONDS, description="Schedule a resume this far ahead"
    )

    @model_validator(mode="after")
    def _one_time(self) -> ResumeBody:
        if self.at is not None and self.in_seconds is not None:
            raise ValueError("give at or in_seconds, not both")
        if self.wait is not None and (self.at is not None or self.in_seconds is not None):
            raise ValueError("wait applies to an immediate resume, not to a scheduled one")
        return self


class CancelBody(_Body):
    """Body of ``DELETE .../schedule`` (optional)."""

    reason: Reason = None
    actor: Actor = None


class BulkItem(BaseModel):
    """Outcome for one location of a bulk (``all``) operation: ``status`` or ``error``;
    ``rescheduled``: service -> the time (ISO, UTC) of the scheduled resume this operation
    moved, for a schedule that replaced an earlier one."""

    status: Any | None = None
    error: Problem | None = None
    rescheduled: dict[str, str] | None = None


class BulkResult(BaseModel):
    """Per-location results of a bulk operation that fully succeeded."""

    results: dict[str, BulkItem]


class Health(BaseModel):
    """``/healthz`` and ``/readyz`` answer: ``status`` ``ok``, or ``degraded`` (still ready)
    when this process's latest write found the store full, said in ``writes``; ``/healthz``
    also names the running ``version`` (docs/versioning.md)."""

    status: str
    version: str | None = None
    reconciler: str | None = None
    writes: str | None = None


class CheckView(BaseModel):
    """The last periodic consistency check (``GET /v1/check``)."""

    at: datetime
    duration_seconds: float
    result: Any

