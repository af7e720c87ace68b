"""The root of the ``locstatus`` command: the typer app, its global options, the per-invocation
state (the Manager opened on first use) and the one place errors become exit codes.

Every :class:`~locstatus.errors.LocstatusError` carries its exit code (0 done, including an
idempotent no-op; 1 refused; 2 usage or backend error); the root group (:class:`_Group`) turns
any of them into ``error: <message>`` on stderr and that exit code, never a traceback. The
command modules register their commands on :data:`app` and :data:`locations_app`, and share
the option types defined here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Annotated, Any, NoReturn

import typer
import typer.core
from pydantic import ValidationError

from locstatus import __version__
from locstatus.backends import DEFAULT_URL, missing_store
from locstatus.client import connect
from locstatus.errors import (
    BackendUnavailable,
    InvalidInput,
    LocstatusError,
)
from locstatus.manager import Manager
from locstatus.monotonic import check_monotonic
from locstatus.names import (
    DEFAULT_SERVICES,
)

from .parsing import (
    parse_number,
    parse_services,
    shown,
)
from .rendering import (
    escaped,
)

ALL = "all"
"""The bulk keyword accepted in place of a location by pause, resume and cancel-schedule."""


# -- errors and the click group that reports them ------------------------------------------


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: <message>`` on stderr and exit with ``code``."""
    typer.echo(f"error: {escaped(message)}", err=True)
    raise typer.Exit(code)



class _Group(typer.core.TyperGroup):
    """The root group: turns every :class:`LocstatusError` raised by any command into
    ``error: <message>`` on stderr and the error's exit code, never a traceback."""

    def invoke(self, ctx: Any) -> Any:  # Any: typer's vendored click Context
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise  # exits and usage errors: typer reports them itself
        except LocstatusError as exc:
            fail(exc.message, exc.exit_code)
        except ValidationError as exc:  # a model refused a value the CLI did not pre-check
            fail(f"invalid input: {short_validation(exc)}", 2)
        except OverflowError as exc:
            fail(f"invalid input: value out of range ({exc})", 2)
        except Exception as exc:
            if os.environ.get("LOCSTATUS_DEBUG"):
                raise
            fail(
                f"unexpected {type(exc).__name__}: {exc} (set LOCSTATUS_DEBUG=1 for a traceback)",
                2,
            )


def short_validation(exc: ValidationError) -> str:
    errs = exc.errors()
    parts = [
        f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']} "
        f"(got {shown(e.get('input'))})"
        for e in errs[:3]
    ]
    return "; ".join(parts)



# -- per-invocation state --------------------------------------------------------------------


@dataclass
class Options:
    """Global options, and the Manager opened on first use (closed when the command ends)."""

    backend: str
    backend_given: bool
    services: tuple[str, ...]
    ctx: typer.Context
    connect_timeout: float = 3.0
    _manager: Manager | None = field(default=None, repr=False)

    def manager(self, *, create: bool = False) -> Manager:
        """The Manager of ``--backend``. Unless ``create``, a store that does not exist (a SQLite
        file: :func:`~locstatus.backends.missing_store`) is refused instead of being created
        empty: a typo in a path (or a command run from another directory, with the default
        ``./locstatus.db``) must not look like an empty store."""
        if self._manager is None:
            missing = None if create else missing_store(self.backend)
            if missing is not None:
                raise InvalidInput(
                    f"no locstatus store at {missing} (from --backend "
                    f"{self.backend}): check the path or LOCSTATUS_BACKEND, or create it "
                    "with 'locstatus locations sync FILE'"
                )
            try:
                self._manager = connect(
                    self.backend, services=self.services, connect_timeout=self.connect_timeout
                )
            except BackendUnavailable as exc:  # say how to wait longer
                raise BackendUnavailable(
                    f"{exc.message}; --connect-timeout SECONDS (LOCSTATUS_CONNECT_TIMEOUT) sets "
                    "how long to try"
                ) from None
            except ValidationError as exc:  # another LOCSTATUS_* variable is malformed
                raise InvalidInput(
                    f"invalid LOCSTATUS_* environment: {short_validation(exc)}"
                ) from None
            self.ctx.call_on_close(self._manager.close)
        return self._manager


def options_of(ctx: typer.Context) -> Options:
    obj = ctx.find_root().obj
    assert isinstance(obj, Options)
    return obj



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
    connect_timeout: Annotated[
        str,
        typer.Option(
            "--connect-timeout",
            envvar="LOCSTATUS_CONNECT_TIMEOUT",
            metavar="SECONDS",
            help="Give up connecting to a ZooKeeper or MongoDB backend after this long "
            "(unless the URL sets its own timeout; 'serve' uses the URL's).",
        ),
    ] = "3",
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Global options."""
    check_monotonic()  # a faked monotonic clock would hang every --wait (docs/time.md)
    if not backend.strip():
        raise InvalidInput(f"invalid --backend {backend!r}: empty URL")
    timeout = parse_number(
        "--connect-timeout", connect_timeout, low=0, high=3600, low_inclusive=False
    )
    source = ctx.get_parameter_source("backend")
    ctx.obj = Options(
        backend=backend.strip(),
        backend_given=getattr(source, "name", None) == "COMMANDLINE",
        services=parse_services(services),
        ctx=ctx,
        connect_timeout=timeout,
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

