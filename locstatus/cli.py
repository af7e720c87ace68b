"""The ``locstatus`` command line (docs/design.md §5.2): what an operator types during an incident.

Shaped so:

- **A thin layer over the Manager.** Every command validates its arguments (location and
  service names, dates, durations, waits) *before* it opens the backend, then makes one or a few
  :class:`~locstatus.Manager` calls. Nothing here reads or writes a backend directly, so the CLI
  cannot disagree with the library or the sidecar about what a pause means.
- **Errors decided once.** Every :class:`~locstatus.errors.LocstatusError` carries its exit code
  (0 done, including an idempotent no-op; 1 refused; 2 usage or backend error). One click group
  (:class:`_Group`) turns any of them into ``error: <message>`` on stderr and that exit code,
  never a traceback; typer's own usage errors already exit with 2.
- **Scripts and humans.** ``--json`` prints the docs/design.md §2 pydantic models exactly as the
library
  returns them (so ``LocationStatus.model_validate_json`` reads them back); otherwise rich tables
  show the state coloured, the scheduled resume, generation, version, update time, reason and
  actor. Text that came from the store (reasons, actors) is printed as plain text, never as rich
  markup or terminal control codes.
- **``all`` is a bulk keyword** for ``pause``/``resume``/``cancel-schedule``: the operation runs
  per location (every location that is not removed) and reports one result per location; the
  exit code is the worst of them.
- ``check``, ``serve`` and ``demo`` live in their own modules, imported only when their command
  runs, so a missing optional dependency only breaks that command (exit 2, with the reason).

Usage::

    locstatus locations sync config.json --location-config locationConfig.json
    locstatus pause us-east-1 --service replication --reason "target outage"
    locstatus resume us-east-1 --in 2h
    locstatus status --json
"""

from __future__ import annotations

import getpass
import importlib
import json
import logging
import math
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
import typer.core
from pydantic import TypeAdapter, ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from locstatus import __version__
from locstatus.audit import history_by_actor
from locstatus.backends import DEFAULT_URL
from locstatus.backends.sqlite import parse_sqlite_url
from locstatus.client import connect
from locstatus.errors import (
    CorruptRecord,
    InvalidInput,
    InvalidTransition,
    LocstatusError,
    NotFound,
    SettleTimeout,
)
from locstatus.locations import load_locations, load_sample
from locstatus.manager import Manager, SyncReport, stuck_handlers, worker_live
from locstatus.models import (
    HistoryEntry,
    LocationStatus,
    ServiceStatus,
    State,
    WorkerInfo,
    new_op_id,
    utcnow,
)
from locstatus.names import (
    DEFAULT_SERVICES,
    MAX_ACTOR,
    MAX_REASON,
    SERVICE_ALIASES,
    SERVICE_RE,
    canonical_service,
    check_location,
    check_text,
    printable,
)

ALL = "all"
"""The bulk keyword accepted in place of a location by pause, resume and cancel-schedule."""

MAX_WAIT_SECONDS = 86_400.0
MAX_DELAY_SECONDS = 10 * 365 * 86_400.0
"""``--in`` longer than ten years is refused as a typo."""

_STATE_STYLE = {
    State.RUNNING: "green",
    State.PAUSING: "yellow",
    State.PAUSED: "bold red",
    State.RESUMING: "cyan",
}
_DURATION_RE = re.compile(r"(?:(\d{1,9})d)?(?:(\d{1,9})h)?(?:(\d{1,9})m)?(?:(\d{1,9})s)?")
_STATUS_LIST = TypeAdapter(list[LocationStatus])
_HISTORY_LIST = TypeAdapter(list[HistoryEntry])


# -- errors and the click group that reports them ------------------------------------------


def _fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: <message>`` on stderr and exit with ``code``."""
    typer.echo(f"error: {_escaped(message)}", err=True)
    raise typer.Exit(code)


def _escaped(message: str) -> str:
    """A message for the terminal: control characters from stored or foreign text (a reason,
    a handler's error) escaped line by line (:func:`locstatus.names.printable`)."""
    return "\n".join(printable(line) for line in message.split("\n"))


def _plain(value: str | None, style: str = "") -> Text:
    """Stored or foreign text as a cell: plain (no markup), control characters escaped."""
    return Text(printable(value or ""), style=style)


class _Group(typer.core.TyperGroup):
    """The root group: turns every :class:`LocstatusError` raised by any command into
    ``error: <message>`` on stderr and the error's exit code, never a traceback."""

    def invoke(self, ctx: Any) -> Any:  # Any: typer's vendored click Context
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise  # exits and usage errors: typer reports them itself
        except LocstatusError as exc:
            _fail(exc.message, exc.exit_code)
        except ValidationError as exc:  # a model refused a value the CLI did not pre-check
            _fail(f"invalid input: {_short_validation(exc)}", 2)
        except OverflowError as exc:
            _fail(f"invalid input: value out of range ({exc})", 2)
        except Exception as exc:
            if os.environ.get("LOCSTATUS_DEBUG"):
                raise
            _fail(
                f"unexpected {type(exc).__name__}: {exc} (set LOCSTATUS_DEBUG=1 for a traceback)",
                2,
            )


def _short_validation(exc: ValidationError) -> str:
    errs = exc.errors()
    parts = [
        f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']} "
        f"(got {_shown(e.get('input'))})"
        for e in errs[:3]
    ]
    return "; ".join(parts)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- argument parsing (pure, testable, no I/O) --------------------------------------------


def parse_duration(value: str, *, option: str = "--in") -> float:
    """Seconds in a duration such as ``90s``, ``15m``, ``2h``, ``1d`` or ``1h30m`` (units in
    the order d, h, m, s, integers only). Raises :class:`InvalidInput` naming ``value`` when it
    does not parse, is zero or negative, or exceeds ten years."""
    text = value.strip().lower()
    match = _DURATION_RE.fullmatch(text)
    if not text or match is None:
        raise InvalidInput(
            f"invalid {option} {value!r}: expected a positive duration such as "
            "90s, 15m, 2h, 1d or 1h30m"
        )
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    total = float(days * 86_400 + hours * 3_600 + minutes * 60 + seconds)
    if total <= 0:
        raise InvalidInput(f"invalid {option} {value!r}: the duration must be positive")
    if total > MAX_DELAY_SECONDS:
        raise InvalidInput(f"invalid {option} {value!r}: longer than 10 years")
    return total


def parse_when(value: str, *, now: datetime | None = None) -> datetime:
    """An ``--at`` value: an ISO 8601 date and time with a timezone (``Z`` or ``+02:00``),
    returned as an aware UTC datetime. Raises :class:`InvalidInput` naming ``value`` when it
    does not parse, has no timezone, or is not in the future (relative to ``now``, default the
    current time)."""
    text = value.strip()
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(
            f"invalid --at {value!r}: expected an ISO 8601 date and time with a timezone, "
            "e.g. 2030-01-31T18:00:00Z or 2030-01-31T19:00:00+01:00"
        ) from None
    if when.tzinfo is None or when.utcoffset() is None:
        raise InvalidInput(
            f"--at {value!r} has no timezone: add Z for UTC or an offset such as +02:00 "
            "(a local time would be guessed differently on every host)"
        )
    try:
        when = when.astimezone(UTC)
    except OverflowError:
        raise InvalidInput(f"invalid --at {value!r}: out of range") from None
    current = now or utcnow()
    if when <= current:
        raise InvalidInput(
            f"--at {value!r} is not in the future (now {_iso(current)}): "
            "a scheduled resume must be later than now"
        )
    return when


def parse_services(value: str) -> tuple[str, ...]:
    """The configured service set from ``--services`` / ``LOCSTATUS_SERVICES``
    (comma-separated; ``crr`` means ``replication``). Raises :class:`InvalidInput`."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise InvalidInput(f"invalid --services {value!r}: no service name")
    canon: list[str] = []
    for name in names:
        c = SERVICE_ALIASES.get(name, name)
        if not SERVICE_RE.fullmatch(c):
            raise InvalidInput(
                f"invalid --services {value!r}: bad service name {_shown(name)} "
                "(lowercase letters, digits, _ and -)"
            )
        canon.append(c)
    return tuple(dict.fromkeys(canon))


def default_actor() -> str:
    """``$USER@hostname`` (the login name when ``$USER`` is unset)."""
    user = os.environ.get("USER") or ""
    if not user:
        try:
            user = getpass.getuser()
        except Exception:  # no passwd entry in some containers
            user = "unknown"
    host = socket.gethostname() or "localhost"
    return f"{user}@{host}"[:MAX_ACTOR]


def _check_text(option: str, value: str | None, limit: int) -> None:
    if value is None:
        return
    check_text(option, value, limit)  # length, control characters (locstatus.names)
    if option == "--actor" and not value.strip():
        raise InvalidInput(f"--actor must not be blank, got {value!r}")


def parse_number(
    option: str,
    value: str,
    *,
    low: float,
    high: float,
    integer: bool = False,
    low_inclusive: bool = True,
) -> float:
    """Parse a numeric option (typer's own messages do not repeat the bad value). Raises
    :class:`InvalidInput` naming ``option`` and ``value`` unless it is a finite number in
    ``low..high`` (``low`` excluded when ``low_inclusive`` is False), whole if ``integer``."""
    bounds = f"{'' if low_inclusive else 'more than '}{low:g}..{high:g}"
    try:
        number = int(value.strip()) if integer else float(value.strip())
    except ValueError:
        kind = "a whole number" if integer else "a number"
        raise InvalidInput(f"invalid {option} {value!r}: expected {kind} ({bounds})") from None
    too_low = number < low if low_inclusive else number <= low
    if not math.isfinite(number) or too_low or number > high:
        raise InvalidInput(f"invalid {option} {value!r}: expected {bounds}")
    return number


def _wait_seconds(wait: str | None) -> float | None:
    if wait is None:
        return None
    return parse_number("--wait", wait, low=0, high=MAX_WAIT_SECONDS)


def _interval(option: str, value: str | None) -> float | None:
    if value is None:
        return None
    return parse_number(option, value, low=0, high=MAX_DELAY_SECONDS, low_inclusive=False)


def _port(value: str) -> int:
    """A TCP port; 0 asks the OS for a free one (the server logs the port it got)."""
    return int(parse_number("--port", value, low=0, high=65_535, integer=True))


# -- per-invocation state --------------------------------------------------------------------


@dataclass
class _Options:
    """Global options, and the Manager opened on first use (closed when the command ends)."""

    backend: str
    backend_given: bool
    services: tuple[str, ...]
    ctx: typer.Context
    _manager: Manager | None = field(default=None, repr=False)

    def manager(self, *, create: bool = False) -> Manager:
        """The Manager of ``--backend``. Unless ``create``, a SQLite file that does not exist is
        refused instead of being created empty: a typo in a path (or a command run from another
        directory, with the default ``./locstatus.db``) must not look like an empty store."""
        if self._manager is None:
            if not create and self.backend.startswith("sqlite:"):
                path, _ = parse_sqlite_url(self.backend)
                if not Path(path).exists():
                    raise InvalidInput(
                        f"no locstatus store at {Path(path).resolve()} (from --backend "
                        f"{self.backend}): check the path or LOCSTATUS_BACKEND, or create it "
                        "with 'locstatus locations sync FILE'"
                    )
            try:
                self._manager = connect(self.backend, services=self.services)
            except ValidationError as exc:  # another LOCSTATUS_* variable is malformed
                raise InvalidInput(
                    f"invalid LOCSTATUS_* environment: {_short_validation(exc)}"
                ) from None
            self.ctx.call_on_close(self._manager.close)
        return self._manager


def _opts(ctx: typer.Context) -> _Options:
    obj = ctx.find_root().obj
    assert isinstance(obj, _Options)
    return obj


def _console() -> Console:
    """Tables for a terminal fit its width; piped into grep or a file (no terminal, no
    ``COLUMNS``), they are not cut at 80 columns: a location name must stay greppable."""
    width = None
    if not sys.stdout.isatty() and "COLUMNS" not in os.environ:
        width = _PIPE_WIDTH
    return Console(highlight=False, soft_wrap=False, width=width)


_PIPE_WIDTH = 240
"""Table width (characters) when stdout is not a terminal."""


def _print_json(text: str) -> None:
    typer.echo(text)


# -- the app ---------------------------------------------------------------------------------

app = typer.Typer(
    cls=_Group,
    name="locstatus",
    help="Pause, resume and schedule background services (replication, lifecycle, ingestion) "
    "per location, on a coordination backend shared by every worker.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
locations_app = typer.Typer(
    help="Import and list locations.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(locations_app, name="locations")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"locstatus {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    ctx: typer.Context,
    backend: Annotated[
        str,
        typer.Option(
            "--backend",
            envvar="LOCSTATUS_BACKEND",
            metavar="URL",
            help="Backend URL: sqlite:///path.db, zk://host:port/chroot, mongodb://..., memory://",
        ),
    ] = DEFAULT_URL,
    services: Annotated[
        str,
        typer.Option(
            "--services",
            envvar="LOCSTATUS_SERVICES",
            metavar="A,B,...",
            help="The configured service set (comma-separated).",
        ),
    ] = ",".join(DEFAULT_SERVICES),
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Global options."""
    if not backend.strip():
        raise InvalidInput(f"invalid --backend {backend!r}: empty URL")
    source = ctx.get_parameter_source("backend")
    ctx.obj = _Options(
        backend=backend.strip(),
        backend_given=getattr(source, "name", None) == "COMMANDLINE",
        services=parse_services(services),
        ctx=ctx,
    )


# Shared option types -------------------------------------------------------------------------

LocationArg = Annotated[
    str,
    typer.Argument(
        metavar="LOCATION",
        help=f"Location name, or '{ALL}' for every location.",
        show_default=False,
    ),
]
ServiceOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--service",
        "-s",
        metavar="NAME",
        help="Service (repeatable; crr = replication). Default: every service of the location.",
        show_default=False,
    ),
]
ReasonOpt = Annotated[
    str | None, typer.Option("--reason", help="Why (recorded in the status and history).")
]
ActorOpt = Annotated[
    str | None,
    typer.Option("--actor", help="Who (default $USER@hostname).", show_default=False),
]
WaitOpt = Annotated[
    str | None,
    typer.Option(
        "--wait",
        metavar="SECONDS",
        help="Block until every live worker has applied the change (exit 1 on timeout, "
        "naming the lagging workers).",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (docs/design.md §2 models).")]


# -- mutations -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Mutation:
    """One operator event, validated and ready to apply to a location."""

    kind: str  # pause | resume | schedule | cancel
    services: tuple[str, ...] | None
    reason: str | None
    actor: str
    wait: float | None
    at: datetime | timedelta | None = None

    @property
    def command(self) -> str:
        """The command line that made this mutation, for messages."""
        return {"schedule": "resume (scheduled)", "cancel": "cancel-schedule"}.get(
            self.kind, self.kind
        )

    def apply(
        self, mgr: Manager, location: str, services: Sequence[str] | None
    ) -> tuple[LocationStatus, list[str]]:
        """Apply to ``location``; return the stored record and the services this call changed
        (empty for an idempotent no-op)."""
        op_id = new_op_id()
        svc: list[str] | None = list(services) if services is not None else None
        if self.kind == "pause":
            rec = mgr.pause(location, svc, reason=self.reason, actor=self.actor, op_id=op_id)
        elif self.kind == "resume":
            rec = mgr.resume(location, svc, reason=self.reason, actor=self.actor, op_id=op_id)
        elif self.kind == "schedule":
            rec = mgr.resume(
                location, svc, at=self.at, reason=self.reason, actor=self.actor, op_id=op_id
            )
        else:
            rec = mgr.cancel_scheduled_resume(
                location, svc, reason=self.reason, actor=self.actor, op_id=op_id
            )
        changed = [s for s, st in sorted(rec.services.items()) if st.op_id == op_id]
        return rec, changed

    def describe(self, location: str, rec: LocationStatus, changed: list[str]) -> str:
        if changed:
            names = ", ".join(changed)
            if self.kind in ("pause", "resume"):
                # Say what the store says: a change waits in pausing/resuming until every live
                # worker applied it (docs/design.md §3); only then is the service paused/running.
                done = "paused" if self.kind == "pause" else "resumed"
                waiting = [s for s in changed if rec.services[s].state.transitional]
                if not waiting:
                    return f"{location}: {done} {names}"
                going = "pausing" if self.kind == "pause" else "resuming"
                settled = [s for s in changed if s not in waiting]
                return (
                    f"{location}: {going} {', '.join(waiting)} (until every live worker has "
                    "applied it; --wait SECONDS waits for that)"
                    + (f"; {done} {', '.join(settled)}" if settled else "")
                )
            if self.kind == "schedule":
                when = rec.services[changed[0]].resume_at
                return f"{location}: resume of {names} scheduled at {_iso(when)}"
            return f"{location}: scheduled resume of {names} cancelled"
        targets = self.services or tuple(sorted(rec.services))
        states = ", ".join(
            f"{s} {rec.services[s].state.value}" for s in targets if s in rec.services
        )
        return f"{location}: no change ({states})"


def _mutation(
    kind: str,
    services: list[str] | None,
    reason: str | None,
    actor: str | None,
    wait: str | None,
    configured: Sequence[str],
    at: datetime | timedelta | None = None,
) -> _Mutation:
    svcs: tuple[str, ...] | None = None
    if services:
        svcs = tuple(dict.fromkeys(canonical_service(s, configured) for s in services))
    _check_text("--reason", reason, MAX_REASON)
    _check_text("--actor", actor, MAX_ACTOR)
    return _Mutation(kind, svcs, reason, actor or default_actor(), _wait_seconds(wait), at)


def _run_mutation(ctx: typer.Context, location: str, m: _Mutation, as_json: bool) -> None:
    if location != ALL:
        check_location(location)
    mgr = _opts(ctx).manager()
    if location == ALL:
        _run_bulk(mgr, m, as_json)
        return
    rec, changed = m.apply(mgr, location, m.services)
    if m.wait is not None:
        rec = mgr.wait_settled(location, list(m.services) if m.services else None, timeout=m.wait)
    if as_json:
        _print_json(rec.model_dump_json(indent=2))
        return
    console = _console()
    console.print(_plain(m.describe(location, rec, changed)))
    console.print(_location_table(rec, mgr.clock(), only=m.services))


@dataclass
class _BulkResult:
    location: str
    result: str  # changed | unchanged | skipped | error
    detail: str
    exit_code: int = 0
    status: LocationStatus | None = None


def _run_bulk(mgr: Manager, m: _Mutation, as_json: bool) -> None:
    results: list[_BulkResult] = []
    pending: list[tuple[_BulkResult, list[str] | None]] = []
    for item in mgr.scan():
        if isinstance(item, CorruptRecord):
            results.append(_BulkResult(item.location, "error", item.message, item.exit_code))
            continue
        if item.deleted:
            continue
        loc = item.location
        targets: list[str] | None = None
        if m.services is not None:
            targets = [s for s in m.services if s in item.services]
            if not targets:
                results.append(
                    _BulkResult(loc, "skipped", f"has no {', '.join(m.services)}", 0, item)
                )
                continue
        try:
            rec, changed = m.apply(mgr, loc, targets)
        except InvalidTransition as exc:
            if m.kind == "schedule":  # running locations simply have nothing to schedule
                results.append(_BulkResult(loc, "skipped", "nothing paused to schedule", 0, item))
                continue
            results.append(_BulkResult(loc, "error", exc.message, exc.exit_code))
            continue
        except LocstatusError as exc:
            results.append(_BulkResult(loc, "error", exc.message, exc.exit_code))
            continue
        res = _BulkResult(
            loc,
            "changed" if changed else "unchanged",
            m.describe(loc, rec, changed).split(": ", 1)[1],
            0,
            rec,
        )
        results.append(res)
        pending.append((res, targets))
    if m.wait is not None:
        deadline = time.monotonic() + m.wait
        for res, targets in pending:
            try:
                res.status = mgr.wait_settled(
                    res.location, targets, timeout=max(0.0, deadline - time.monotonic())
                )
            except SettleTimeout as exc:
                res.result, res.detail, res.exit_code = "error", exc.message, exc.exit_code
    results.sort(key=lambda r: r.location)
    if not results:
        raise NotFound("no locations: import them first with 'locstatus locations sync FILE'")
    if as_json:
        _print_json(
            json.dumps(
                [
                    {
                        "location": r.location,
                        "result": r.result,
                        "detail": r.detail,
                        "status": None if r.status is None else r.status.model_dump(mode="json"),
                    }
                    for r in results
                ],
                indent=2,
            )
        )
    else:
        table = Table(title=f"{m.command} {ALL}", title_justify="left")
        for col in ("Location", "Result", "Detail"):
            table.add_column(col)
        style = {"changed": "green", "unchanged": "", "skipped": "dim", "error": "bold red"}
        for r in results:
            table.add_row(Text(r.location), Text(r.result, style=style[r.result]), _plain(r.detail))
        _console().print(table)
    errors = [r for r in results if r.result == "error"]
    for r in errors:
        typer.echo(f"error: {_escaped(r.detail)}", err=True)
    if errors:
        raise typer.Exit(max(r.exit_code for r in errors))
    if all(r.result == "skipped" for r in results):
        what = ", ".join(m.services) if m.services else "service"
        _fail(
            f"{m.command} {ALL}: no location had a {what} to act on (every location was skipped)",
            1,
        )


@app.command()
def pause(
    ctx: typer.Context,
    location: LocationArg,
    service: ServiceOpt = None,
    reason: ReasonOpt = None,
    actor: ActorOpt = None,
    wait: WaitOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Pause services at a location (a pause of a paused service cancels its scheduled
    resume; otherwise it is a no-op, exit 0)."""
    m = _mutation("pause", service, reason, actor, wait, _opts(ctx).services)
    _run_mutation(ctx, location, m, as_json)


@app.command()
def resume(
    ctx: typer.Context,
    location: LocationArg,
    at: Annotated[
        str | None,
        typer.Option(
            "--at",
            metavar="ISO",
            help="Schedule the resume at this time (ISO 8601 with Z or an offset).",
        ),
    ] = None,
    in_: Annotated[
        str | None,
        typer.Option(
            "--in", metavar="DURATION", help="Schedule the resume after 90s, 15m, 2h, 1d, 1h30m."
        ),
    ] = None,
    service: ServiceOpt = None,
    reason: ReasonOpt = None,
    actor: ActorOpt = None,
    wait: WaitOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Resume services now, or schedule the resume with --at or --in (only paused services
    take a schedule)."""
    when: datetime | timedelta | None = None
    if at is not None and in_ is not None:
        raise InvalidInput(f"give --at or --in, not both (got --at {at!r} and --in {in_!r})")
    if at is not None:
        # "in the future" by the backend's time, not this host's (docs/time.md)
        when = parse_when(at, now=_opts(ctx).manager().clock())
    elif in_ is not None:
        when = timedelta(seconds=parse_duration(in_))
    if when is not None and wait is not None:
        raise InvalidInput(
            f"--wait {wait!r} cannot be combined with a scheduled resume: a schedule changes "
            "no state, so there is nothing to settle"
        )
    m = _mutation(
        "schedule" if when is not None else "resume",
        service,
        reason,
        actor,
        wait,
        _opts(ctx).services,
        at=when,
    )
    _run_mutation(ctx, location, m, as_json)


@app.command("cancel-schedule")
def cancel_schedule(
    ctx: typer.Context,
    location: LocationArg,
    service: ServiceOpt = None,
    reason: ReasonOpt = None,
    actor: ActorOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel a scheduled resume (no-op, exit 0, when none is scheduled)."""
    m = _mutation("cancel", service, reason, actor, None, _opts(ctx).services)
    _run_mutation(ctx, location, m, as_json)


# -- reads -----------------------------------------------------------------------------------


@app.command()
def status(
    ctx: typer.Context,
    location: Annotated[
        str | None,
        typer.Argument(
            metavar="[LOCATION]", help="One location (default: all).", show_default=False
        ),
    ] = None,
    as_json: JsonOpt = False,
    include_removed: Annotated[
        bool, typer.Option("--include-removed", help="Also list removed locations.")
    ] = False,
) -> None:
    """Show the status of one location or of every location."""
    if location is not None and location != ALL:
        check_location(location)
        mgr = _opts(ctx).manager()
        rec = mgr.status(location)
        if as_json:
            _print_json(rec.model_dump_json(indent=2))
        else:
            _console().print(_location_table(rec, mgr.clock()))
        return
    mgr = _opts(ctx).manager()
    records, corrupt = mgr.listing(include_removed=include_removed)
    if as_json:
        _print_json(_STATUS_LIST.dump_json(records, indent=2).decode())
    elif not records and not corrupt:
        _console().print("no locations: import them with 'locstatus locations sync FILE'")
    else:
        _console().print(_status_table(records, corrupt, mgr.clock()))
    _report_corrupt(corrupt)


@app.command()
def history(
    ctx: typer.Context,
    location: Annotated[str, typer.Argument(metavar="LOCATION", show_default=False)],
    limit: Annotated[
        str, typer.Option("--limit", metavar="N", help="Newest entries to show (1..10000).")
    ] = "50",
    as_json: JsonOpt = False,
    actor: Annotated[
        str | None,
        typer.Option("--actor", metavar="NAME", help="Only the changes of this actor (audit)."),
    ] = None,
) -> None:
    """Show the history of a location, newest first."""
    check_location(location)
    count = int(parse_number("--limit", limit, low=1, high=10_000, integer=True))
    mgr = _opts(ctx).manager()
    try:
        mgr.status(location)  # unknown location: refused (exit 1)
    except CorruptRecord as exc:  # the history of a corrupt record is what one wants to see
        typer.echo(f"warning: {_escaped(exc.message)}", err=True)
    entries = (
        mgr.history(location, limit=count)
        if actor is None
        else history_by_actor(mgr, location, actor, limit=count)
    )
    if as_json:
        _print_json(_HISTORY_LIST.dump_json(entries, indent=2).decode())
        return
    table = Table(title=f"history of {location}", title_justify="left")
    for col in (
        "At",
        "Version",
        "Service",
        "Event",
        "From -> to",
        "Gen",
        "Resume at",
        "Actor",
        "Reason",
    ):
        table.add_column(col)
    for e in entries:
        move = ""
        if e.from_state is not None or e.to_state is not None:
            move = f"{_state_name(e.from_state)} -> {_state_name(e.to_state)}"
        table.add_row(
            _iso(e.at),
            str(e.version),
            _plain(e.service),
            _plain(e.event),
            move,
            str(e.generation),
            _iso(e.resume_at),
            _plain(e.actor),
            _plain(e.reason),
        )
    _console().print(table)


@app.command()
def workers(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List registered workers: lease, clock offset, services, location filter, lag, stuck
    handlers (past the agent's handler deadline) and handler errors. A lease counts as expired
    only once it passed by the backend's time beyond doubt; the clock offset is the one each
    worker published (its host's clock minus the backend's). A record that cannot be read is
    named where its lag is unknown, and a registration that cannot be read is listed as the
    live worker it counts as; both are errors (exit 2)."""
    mgr = _opts(ctx).manager()
    now = mgr.clock()
    infos = mgr.workers()
    records, corrupt = mgr.listing()
    acks = mgr.backend.all_acks()
    rows: list[tuple[WorkerInfo, bool, list[dict[str, Any]], list[str]]] = []
    for w in infos:
        alive = worker_live(w, mgr.time)
        lag: list[dict[str, Any]] = []
        for rec in records:
            for svc, st in sorted(rec.services.items()):
                if not w.applies(rec.location, svc):
                    continue
                acked = acks.get(rec.location, {}).get(w.worker_id, {}).get(svc, 0)
                if acked < st.generation:
                    lag.append(
                        {
                            "location": rec.location,
                            "service": svc,
                            "acked": acked,
                            "generation": st.generation,
                        }
                    )
        unknown = [  # its lag there cannot be told: the record does not read
            bad.location
            for bad in corrupt
            if w.corrupt is not None or w.locations is None or bad.location in w.locations
        ]
        rows.append((w, alive, lag, unknown))
    if as_json:
        _print_json(
            json.dumps(
                [
                    {**w.model_dump(mode="json"), "alive": alive, "lagging": lag,
                     "lag_unknown": unknown}
                    for w, alive, lag, unknown in rows
                ],
                indent=2,
            )
        )
    elif not rows:
        _console().print("no workers registered")
    else:
        _console().print(_workers_table(rows, now, mgr.time.offset_seconds()))
    _report_corrupt_workers([w for w in infos if w.corrupt is not None], bool(corrupt))
    _report_corrupt(corrupt)


def _workers_table(
    rows: Sequence[tuple[WorkerInfo, bool, list[dict[str, Any]], list[str]]],
    now: datetime,
    own: float | None,
) -> Table:
    """The ``workers`` table; ``own``: this host's clock minus the backend's (seconds)."""
    table = Table(
        title="workers",
        title_justify="left",
        caption=None if own is None else f"this host's clock minus the backend's: {_offset(own)}",
        caption_justify="left",
    )
    for col in (
        "Worker", "Host/pid", "Lease", "Clock", "Services", "Locations", "Lagging", "Stuck",
        "Errors",
    ):
        table.add_column(col)
    for w, alive, lag, unknown in rows:
        if w.lease_expires_at is None:
            lease = Text("alive (session)", style="green") if alive else Text("expired")
        elif alive:
            lease = Text(f"alive ({_ago(w.lease_expires_at, now)})", style="green")
        else:
            lease = Text(f"expired ({_ago(w.lease_expires_at, now)})", style="bold red")
        lagging = Text(", ".join(
            f"{x['location']}/{x['service']} ({x['acked']}<{x['generation']})" for x in lag
        ), style="yellow")
        for loc in unknown:
            lagging.append(", " if len(lagging) else "")
            lagging.append(f"{loc}/? (record corrupt)", style="bold red")
        errors = "; ".join(f"{k}: {v}" for k, v in sorted(w.errors.items()))
        if w.corrupt is not None:
            errors = f"registration corrupt: {w.corrupt}"
        stuck = stuck_handlers([w], [w.worker_id], now).get(w.worker_id, "")
        table.add_row(
            Text(w.worker_id),
            _plain(f"{w.host}/{w.pid}" if w.corrupt is None else "?"),
            lease,
            _offset_cell(w.clock_offset_seconds),
            Text(", ".join(w.services) if w.corrupt is None else "all (unreadable)"),
            Text("all" if w.locations is None else ", ".join(w.locations)),
            lagging if len(lagging) else Text("-"),
            _plain(stuck or "-", style="bold red" if stuck else ""),
            _plain(errors or "-", style="red" if errors else ""),
        )
    return table


def _report_corrupt_workers(corrupt: Sequence[WorkerInfo], more: bool) -> None:
    """Name every unreadable registration on stderr; exit 2 unless ``more`` errors (corrupt
    records, reported next) will."""
    if not corrupt:
        return
    for w in corrupt:
        what = f"worker {w.worker_id!r}: registration does not parse ({w.corrupt})"
        typer.echo(
            f"error: {_escaped(what)}; counted as a live worker applying every service at "
            "every location",
            err=True,
        )
    typer.echo(
        f"error: {len(corrupt)} corrupt worker registration(s); run 'locstatus check' for details",
        err=True,
    )
    if not more:
        raise typer.Exit(2)


# -- locations -------------------------------------------------------------------------------


@locations_app.command("sync")
def locations_sync(
    ctx: typer.Context,
    file: Annotated[
        str | None,
        typer.Argument(
            metavar="FILE",
            help="Plain list (one name per line), Backbeat config.json or locationConfig.json.",
            show_default=False,
        ),
    ] = None,
    location_config: Annotated[
        str | None,
        typer.Option(
            "--location-config",
            metavar="FILE",
            help="Backbeat locationConfig.json (its keys get lifecycle).",
        ),
    ] = None,
    keep_missing: Annotated[
        bool, typer.Option("--keep-missing", help="Do not remove locations absent from FILE.")
    ] = False,
    sample: Annotated[
        bool,
        typer.Option(
            "--sample",
            help="Use the packaged sample config.json and locationConfig.json instead of FILE.",
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would change; write nothing.")
    ] = False,
    actor: ActorOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Make the stored locations match a location list: add missing locations and services,
    restore removed ones, and remove (tombstone) locations the list no longer has."""
    configured = _opts(ctx).services
    _check_text("--actor", actor, MAX_ACTOR)
    if sample:
        if file is not None or location_config is not None:
            raise InvalidInput(f"--sample takes no FILE or --location-config (got {file!r})")
        wanted = load_sample(configured)
    elif file is None:
        raise InvalidInput("missing FILE (or --sample)")
    else:
        wanted = load_locations(file, location_config, services=configured)
    mgr = _opts(ctx).manager(create=True)
    existing: dict[str, LocationStatus] = {}
    for item in mgr.scan():
        if isinstance(item, CorruptRecord):
            if item.location in wanted:
                raise CorruptRecord(
                    item.location, f"{item.detail} (repair it with 'locstatus check' first)"
                )
            continue
        existing[item.location] = item
    if dry_run:
        report = _plan_sync(existing, wanted, remove_missing=not keep_missing)
    else:
        report = mgr.sync_locations(
            wanted, actor=actor or default_actor(), remove_missing=not keep_missing
        )
    if as_json:
        _print_json(
            json.dumps(
                {
                    "dry_run": dry_run,
                    "added": report.added,
                    "restored": report.restored,
                    "removed": report.removed,
                    "services_added": report.services_added,
                    "unchanged": report.unchanged,
                    "locations": {k: list(v) for k, v in wanted.items()},
                },
                indent=2,
            )
        )
        return
    table = Table(
        title="locations sync" + (" (dry run: nothing written)" if dry_run else ""),
        title_justify="left",
    )
    for col in ("Location", "Services", "Change"):
        table.add_column(col)
    for loc, svcs in wanted.items():
        if loc in report.added:
            change = Text("added", style="green")
        elif loc in report.restored:
            change = Text("restored", style="green")
        elif loc in report.services_added:
            change = Text("services added: " + ", ".join(report.services_added[loc]), style="green")
        else:
            change = Text("unchanged", style="dim")
        table.add_row(Text(loc), Text(", ".join(svcs)), change)
    for loc in report.removed:
        table.add_row(Text(loc), "", Text("removed", style="yellow"))
    _console().print(table)
    kept = (
        sorted(loc for loc, rec in existing.items() if loc not in wanted and not rec.deleted)
        if keep_missing
        else []
    )
    if kept:
        _console().print(Text(f"kept (not in the list): {', '.join(kept)}"))


def _plan_sync(
    existing: dict[str, LocationStatus],
    wanted: dict[str, tuple[str, ...]],
    *,
    remove_missing: bool,
) -> SyncReport:
    """What :meth:`Manager.sync_locations` would do, computed without writing."""
    report = SyncReport()
    for loc, svcs in wanted.items():
        rec = existing.get(loc)
        if rec is None:
            report.added.append(loc)
            continue
        if rec.deleted:
            report.restored.append(loc)
        missing = [s for s in svcs if s not in rec.services]
        if missing:
            report.services_added[loc] = missing
        if not rec.deleted and not missing:
            report.unchanged.append(loc)
    if remove_missing:
        report.removed = sorted(
            loc for loc, rec in existing.items() if loc not in wanted and not rec.deleted
        )
    return report


@locations_app.command("list")
def locations_list(
    ctx: typer.Context,
    as_json: JsonOpt = False,
) -> None:
    """List every stored location (removed ones included) with its services."""
    mgr = _opts(ctx).manager()
    records, corrupt = mgr.listing(include_removed=True)
    if as_json:
        _print_json(_STATUS_LIST.dump_json(records, indent=2).decode())
    else:
        table = Table(title="locations", title_justify="left")
        for col in ("Location", "Services", "Version", "Removed"):
            table.add_column(col)
        for rec in records:
            table.add_row(
                Text(rec.location),
                Text(", ".join(sorted(rec.services))),
                str(rec.version),
                Text(_iso(rec.deleted_at), style="yellow") if rec.deleted else "",
            )
        for bad in corrupt:
            table.add_row(Text(bad.location), Text("CORRUPT", style="bold red"), "", "")
        _console().print(table)
    _report_corrupt(corrupt)


# -- commands implemented in other modules (imported lazily) -------------------------------


def _feature(
    module: str, command: str, *names: str, extra: str | None = None
) -> list[Callable[..., Any]]:
    """Import ``names`` from ``module`` for ``command``; a failed import of a command that needs
    a package extra (``server``) says which one to install."""
    try:
        mod = importlib.import_module(module)
        return [getattr(mod, n) for n in names]
    except (ImportError, AttributeError) as exc:
        hint = (
            f" (install the {extra} extra: pip install 'locstatus[{extra}]')"
            if extra is not None and isinstance(exc, ImportError)
            else ""
        )
        _fail(f"'locstatus {command}' is not available: cannot import {module} ({exc}){hint}", 2)


@app.command()
def check(
    ctx: typer.Context,
    repair: Annotated[bool, typer.Option("--repair", help="Fix what is safe to fix.")] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Plan the repairs --repair would make; write nothing."),
    ] = False,
    as_json: JsonOpt = False,
    stuck_after: Annotated[
        str,
        typer.Option(
            "--stuck-after", metavar="DURATION", help="Report pausing/resuming older than this."
        ),
    ] = "5m",
    tombstone_ttl: Annotated[
        str,
        typer.Option(
            "--tombstone-ttl", metavar="DURATION", help="Purge removed locations older than this."
        ),
    ] = "24h",
    locations: Annotated[
        str | None,
        typer.Option(
            "--locations", metavar="FILE", help="Expected location list (as for 'locations sync')."
        ),
    ] = None,
    location_config: Annotated[
        str | None,
        typer.Option(
            "--location-config",
            metavar="FILE",
            help="Backbeat locationConfig.json for --locations.",
        ),
    ] = None,
    metrics_file: Annotated[
        str | None,
        typer.Option(
            "--metrics-file", metavar="PATH", help="Write Prometheus metrics (textfile collector)."
        ),
    ] = None,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="No progress bar.")] = False,
    max_skew: Annotated[
        float,
        typer.Option(
            "--max-skew",
            metavar="SECONDS",
            min=0.0,
            help="Report a worker (or this host) whose clock is off the backend's by more.",
        ),
    ] = 1.0,
) -> None:
    """Consistency check (docs/design.md §5.4): exit 0 clean, 1 findings left, 2 could not run."""
    stuck = parse_duration(stuck_after, option="--stuck-after")
    ttl = parse_duration(tombstone_ttl, option="--tombstone-ttl")
    if location_config is not None and locations is None:
        raise InvalidInput(
            f"--location-config {location_config!r} needs --locations (the Backbeat config.json)"
        )
    expected = (
        load_locations(locations, location_config, services=_opts(ctx).services)
        if locations is not None
        else None
    )
    if metrics_file is not None:
        _check_writable(metrics_file, "--metrics-file")  # before the scan, not after it
    run_check, render_report, write_metrics = _feature(
        "locstatus.check", "check", "run_check", "render_report", "write_metrics"
    )
    mgr = _opts(ctx).manager()
    report = run_check(
        mgr,
        repair=repair,
        dry_run=dry_run,
        stuck_after=stuck,
        expected=expected,
        tombstone_ttl=ttl,
        progress=not no_progress and not as_json,
        max_skew=max_skew,
    )
    if as_json:
        _print_json(json.dumps(report.as_dict()))
    else:
        render_report(report, _console())
    if metrics_file is not None:
        write_metrics(report, metrics_file)
    raise typer.Exit(int(report.exit_code))


def _check_writable(path: str, option: str) -> None:
    """Refuse (InvalidInput, exit 2) a file that cannot be written: its directory is missing or
    not writable, or it is a directory itself."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise InvalidInput(f"{option} {path!r} is a directory")
    if not os.path.isdir(directory):
        raise InvalidInput(f"{option} {path!r}: directory {directory!r} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InvalidInput(f"{option} {path!r}: directory {directory!r} is not writable")


@app.command()
def serve(
    ctx: typer.Context,
    host: Annotated[str, typer.Option("--host", help="Address to bind.")] = "127.0.0.1",
    port: Annotated[str, typer.Option("--port", metavar="PORT")] = "8080",
    insecure: Annotated[
        bool, typer.Option("--insecure", help="Allow a non-loopback bind without a token.")
    ] = False,
    reconcile_interval: Annotated[
        str,
        typer.Option(
            "--reconcile-interval",
            metavar="SECONDS",
            help="How often to fire due resumes and settle.",
        ),
    ] = "1.0",
    check_interval: Annotated[
        str | None,
        typer.Option(
            "--check-interval", metavar="SECONDS", help="Run the consistency check this often."
        ),
    ] = None,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-host",
            metavar="NAME",
            help="Without a token, also serve requests for this Host name (repeatable); "
            "loopback names are always served.",
        ),
    ] = None,
) -> None:
    """Run the HTTP sidecar (docs/design.md §5.3); the token comes from $LOCSTATUS_API_TOKEN."""
    logging.getLogger("kazoo").setLevel(logging.WARNING)  # a long-running process logs them
    port_number = _port(port)
    reconcile = _interval("--reconcile-interval", reconcile_interval)
    check_every = _interval("--check-interval", check_interval)
    (serve_fn,) = _feature("locstatus.api.server", "serve", "serve", extra="server")
    serve_fn(
        _opts(ctx).backend,
        host=host,
        port=port_number,
        token=os.environ.get("LOCSTATUS_API_TOKEN") or None,
        insecure=insecure,
        reconcile_interval=reconcile,
        check_interval=check_every,
        allowed_hosts=tuple(allow_host or ()),
    )


@app.command()
def demo(
    ctx: typer.Context,
    keep: Annotated[bool, typer.Option(
            "--keep",
            help="Stay up after the scenario (sidecar and workers) until Ctrl-C; keeps the "
            "demo's files.",
        ),] = False,
    workers: Annotated[
        str, typer.Option("--workers", metavar="N", help="Worker processes (1..64).")
    ] = "3",
    duration: Annotated[str, typer.Option("--duration", metavar="SECONDS")] = "20",
    port: Annotated[str, typer.Option("--port", metavar="PORT")] = "8080",
) -> None:
    """A self-contained demo: workers, a sidecar and scripted operator actions. Uses its own
    temporary store unless --backend is given on the command line."""
    n_workers = int(parse_number("--workers", workers, low=1, high=64, integer=True))
    seconds = _interval("--duration", duration)
    port_number = _port(port)
    (run_demo,) = _feature("locstatus.demo", "demo", "run_demo", extra="server")
    opts = _opts(ctx)
    raise SystemExit(
        run_demo(
            backend_url=opts.backend if opts.backend_given else None,
            keep=keep,
            workers=n_workers,
            duration=seconds,
            port=port_number,
            services=opts.services,
        )
    )


# -- rendering -------------------------------------------------------------------------------


def _iso(when: datetime | None) -> str:
    if when is None:
        return ""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


SKEW_SHOWN = 1.0
"""Seconds of clock offset above which ``workers`` shows a worker's offset in red (the check
job's default ``--max-skew``)."""


def _offset(seconds: float) -> str:
    """``+0.012s`` / ``+3h0m (+10800s)``: a clock offset to the backend (positive: ahead)."""
    if abs(seconds) < 60:
        return f"{seconds:+.3f}s"
    return f"{'+' if seconds > 0 else '-'}{_span(abs(seconds))} ({seconds:+.0f}s)"


def _offset_cell(seconds: float | None) -> Text:
    if seconds is None:
        return Text("-", style="dim")
    return Text(_offset(seconds), style="bold red" if abs(seconds) > SKEW_SHOWN else "")


def _ago(when: datetime, now: datetime) -> str:
    delta = (when - now).total_seconds()
    text = _span(abs(delta))
    return f"in {text}" if delta >= 0 else f"{text} ago"


def _span(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    parts = [(s // 86_400, "d"), (s % 86_400 // 3_600, "h"), (s % 3_600 // 60, "m")]
    return "".join(f"{v}{u}" for v, u in parts if v) or "0m"


def _state_name(state: State | None) -> str:
    return state.value if state is not None else "-"


def _state_text(st: ServiceStatus) -> Text:
    return Text(st.state.value, style=_STATE_STYLE[st.state])


def _resume_text(st: ServiceStatus, now: datetime) -> Text:
    if st.resume_at is None:
        return Text("")
    return Text(f"{_iso(st.resume_at)} ({_ago(st.resume_at, now)})", style="cyan")


def _who(st: ServiceStatus) -> Text:
    parts = [p for p in (st.reason, f"by {st.actor}" if st.actor else None) if p]
    return _plain(" ".join(parts))


def _location_table(rec: LocationStatus, now: datetime, only: Sequence[str] | None = None) -> Table:
    title = f"{rec.location}  version {rec.version}"
    if rec.deleted:
        title += f"  REMOVED {_iso(rec.deleted_at)}"
    table = Table(title=Text(title), title_justify="left")
    for col in ("Service", "State", "Scheduled resume", "Gen", "Updated", "Reason / actor"):
        table.add_column(col)
    for svc, st in sorted(rec.services.items()):
        if only is not None and svc not in only:
            continue
        table.add_row(
            Text(svc),
            _state_text(st),
            _resume_text(st, now),
            str(st.generation),
            _iso(st.updated_at),
            _who(st),
        )
    return table


def _status_table(
    records: Sequence[LocationStatus], corrupt: Sequence[CorruptRecord], now: datetime
) -> Table:
    table = Table(title="locations", title_justify="left")
    for col in (
        "Location",
        "Service",
        "State",
        "Scheduled resume",
        "Gen",
        "Version",
        "Updated",
        "Reason / actor",
    ):
        table.add_column(col)
    rows: list[tuple[str, list[Any]]] = []
    for rec in records:
        first = True
        for svc, st in sorted(rec.services.items()):
            name = rec.location + (" (removed)" if rec.deleted else "")
            rows.append(
                (
                    rec.location,
                    [
                        Text(name if first else ""),
                        Text(svc),
                        _state_text(st),
                        _resume_text(st, now),
                        str(st.generation),
                        str(rec.version) if first else "",
                        _iso(st.updated_at),
                        _who(st),
                    ],
                )
            )
            first = False
    for bad in corrupt:
        rows.append(
            (
                bad.location,
                [
                    Text(bad.location),
                    "",
                    Text("CORRUPT", style="bold red"),
                    "",
                    "",
                    "",
                    "",
                    Text("see 'locstatus check'"),
                ],
            )
        )
    for _, row in sorted(rows, key=lambda r: r[0]):
        table.add_row(*row)
    return table


def _report_corrupt(corrupt: Sequence[CorruptRecord]) -> None:
    """Name every corrupt record on stderr and exit 2 after the readable ones were shown."""
    if not corrupt:
        return
    for bad in corrupt:
        typer.echo(f"error: {_escaped(bad.message)}", err=True)
    typer.echo(
        f"error: {len(corrupt)} corrupt record(s); run 'locstatus check' for details", err=True
    )
    raise typer.Exit(2)


def main() -> None:
    """Console entry point (``locstatus``)."""
    if not os.environ.get("LOCSTATUS_DEBUG"):
        # kazoo logs every failed connection attempt on stderr; a one-shot command reports the
        # outcome in its own one line (docs/cli.md). ``serve`` turns them back on.
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    app(prog_name="locstatus")


if __name__ == "__main__":  # pragma: no cover
    main()
