"""The one exception hierarchy of locstatus.

Every error a caller can see is a :class:`LocstatusError`. Each class carries, once, the CLI exit
code (docs/design.md §5.2: 1 refused, 2 usage or backend error) and the HTTP status (docs/design.md
§5.3) it maps to,
so the CLI and the sidecar never decide that twice. Messages always name the bad value.

Backends raise :class:`VersionConflict`, :class:`AlreadyExists`, :class:`NotFound`,
:class:`CorruptRecord` and :class:`BackendUnavailable`; the manager turns exhausted conflicts into
:class:`ConflictError` and refused events into :class:`InvalidTransition`.
"""

from __future__ import annotations


class LocstatusError(Exception):
    """Base class. ``exit_code`` is the CLI's, ``http_status`` the sidecar's."""

    exit_code: int = 2
    http_status: int = 500
    title: str = "locstatus error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidInput(LocstatusError, ValueError):
    """A location, service, date or body that does not validate. Nothing was written."""

    exit_code = 2
    http_status = 400
    title = "invalid input"


class InvalidTransition(LocstatusError):
    """The event is not allowed from the current state (docs/design.md §3), e.g. scheduling a
    resume of a running service. Nothing was written."""

    exit_code = 1
    http_status = 409
    title = "invalid transition"


class NotFound(LocstatusError, KeyError):
    """Unknown location, or a service the location does not have."""

    exit_code = 1
    http_status = 404
    title = "not found"

    def __str__(self) -> str:  # KeyError would quote the message
        return self.message


class AlreadyExists(LocstatusError):
    """A record was created twice (backend level; the manager treats it as a lost race)."""

    exit_code = 1
    http_status = 409
    title = "already exists"


class StandingRegistered(LocstatusError):
    """An ordinary unregistration or registration met a standing registration of the same id
    (docs/agent.md "Standing registrations"): only a retirement (``locstatus workers retire``,
    ``Manager.retire_worker``) ends it. The message names the registration and that command.
    Nothing was written."""

    exit_code = 1
    http_status = 409
    title = "standing registration"


class VersionConflict(LocstatusError):
    """Backend level: the record's version is not the expected one (compare-and-set failed).
    The manager re-reads and re-applies (docs/design.md §3.1); callers normally never see this."""

    exit_code = 1
    http_status = 409
    title = "version conflict"


class ConflictError(LocstatusError):
    """Compare-and-set kept failing: the retry budget of docs/design.md §3.1 is exhausted."""

    exit_code = 1
    http_status = 409
    title = "conflict"


class PreconditionFailed(LocstatusError):
    """An ``If-Match`` / expected version no longer matches the record (HTTP 412)."""

    exit_code = 1
    http_status = 412
    title = "precondition failed"


class HolderPresent(LocstatusError):
    """Refused because a standing registration's holder is present (docs/agent.md "Standing
    registrations"): retiring it, or taking over what it keeps in step, would act behind a
    running holder's back. The message names the holder (host, pid); ``force`` overrides.
    Nothing was written."""

    exit_code = 1
    http_status = 409
    title = "holder present"


class BridgeTookOver(LocstatusError):
    """``locstatus import backbeat`` refused: the Backbeat bridge's standing registrations
    (``backbeat.*``) exist, so Backbeat's state is a copy of locstatus's, not the truth to
    import (docs/backbeat.md, "1. Import"). The message names the registrations; ``--force``
    overrides. Nothing was written."""

    exit_code = 1
    http_status = 409
    title = "bridge took over"


class CorruptRecord(LocstatusError):
    """A stored record does not parse or validate. It is reported, never rewritten."""

    exit_code = 2
    http_status = 500
    title = "corrupt record"

    def __init__(self, location: str, detail: str) -> None:
        super().__init__(f"corrupt record for location {location!r}: {detail}")
        self.location = location
        self.detail = detail


class NewerFormat(CorruptRecord):
    """A stored record in a stored format newer than this version of locstatus reads
    (docs/versioning.md, "Stored format"): refused, never read as an older format, and never
    rewritten. Upgrade this process; ``format`` is the record's, ``newest`` the one read here."""

    title = "record in a newer stored format"

    def __init__(self, location: str, format: int, newest: int) -> None:
        super().__init__(
            location,
            f"stored format {format} was written by a newer locstatus; this one reads formats "
            f"up to {newest}: upgrade it (docs/versioning.md)",
        )
        self.format = format
        self.newest = newest


class BackendUnavailable(LocstatusError):
    """The backend cannot be reached or timed out. The outcome of an in-flight write is
    resolved by op_id (docs/design.md §3.2) before this reaches a caller."""

    exit_code = 2
    http_status = 503
    title = "backend unavailable"


class BackendFull(BackendUnavailable):
    """The backend's storage is full (SQLite: the filesystem holding the database or its
    write-ahead log, ``SQLITE_FULL``). Nothing was written, and the backend is usable again
    once space is freed. A :class:`BackendUnavailable` (same exit code, HTTP 503): callers
    retry it like an outage (an agent's heartbeat keeps trying), while its own class and title
    tell the operator to free space rather than look for a server that is down."""

    title = "backend full"


class AmbiguousCommit(BackendUnavailable):
    """Backend level: the connection failed after a write was sent, so it may or may not have
    been applied. The manager resolves it by looking for the op_id (docs/design.md §3.2)."""


class Unauthorized(LocstatusError):
    """Missing or wrong bearer token (HTTP 401)."""

    exit_code = 2
    http_status = 401
    title = "unauthorized"


class Forbidden(Unauthorized):
    """A bearer token was given but is not the right one (HTTP 403)."""

    http_status = 403
    title = "forbidden"


class HandlerPending(LocstatusError):
    """Raised by a worker's handler whose effect is not complete yet, a normal waiting state
    (the Backbeat bridge's processor has not written the state it was told to apply): the
    agent does not acknowledge and retries with backoff, as for any failure, but logs it as one
    info line without a traceback (docs/agent.md)."""


class SettleTimeout(LocstatusError, TimeoutError):
    """``wait=`` ran out before every live worker acknowledged the new generation."""

    exit_code = 1
    http_status = 504
    title = "timeout"

    def __init__(
        self,
        message: str,
        lagging: list[str] | None = None,
        stuck: dict[str, list[str]] | None = None,
    ) -> None:
        super().__init__(message)
        self.lagging = lagging or []
        self.stuck = stuck or {}
        """Lagging workers with a handler stuck past its deadline: worker id -> the
        ``location/service`` keys it is stuck at (docs/agent.md "Handlers")."""
