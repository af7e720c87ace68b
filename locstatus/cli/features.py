"""``check``, ``serve``, ``demo`` and ``tokens``: commands implemented in other modules,
imported only when they run, so a missing optional dependency only breaks that command (exit
2, with the reason). The ``import`` and ``bridge`` groups (Backbeat, docs/backbeat.md) are
defined in their own packages and registered here; they import their drivers (kazoo, pymongo,
redis) only when run.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from collections.abc import Callable
from typing import Annotated, Any

import typer
import typer.core

from locstatus.bridge.command import bridge_app
from locstatus.errors import (
    InvalidInput,
)
from locstatus.importers.command import import_app
from locstatus.locations import load_locations
from locstatus.logs import check_log_format, configure_logging

from .app import (
    JsonOpt,
    app,
    fail,
    options_of,
)
from .parsing import (
    interval_seconds,
    parse_duration,
    parse_number,
    parse_port,
)
from .rendering import (
    new_console,
    print_json,
)


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
        fail(f"'locstatus {command}' is not available: cannot import {module} ({exc}){hint}", 2)


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
    log_format: Annotated[
        str | None,
        typer.Option(
            "--log-format",
            envvar="LOCSTATUS_LOG_FORMAT",
            metavar="text|json",
            help="json: also log every finding and repair as one JSON object per line on "
            "stderr (location, service, worker, kind); text: the report only.",
        ),
    ] = None,
) -> None:
    """Consistency check (docs/design.md §5.4): exit 0 clean, 1 findings left, 2 could not run."""
    fmt = check_log_format(log_format) if log_format is not None else None
    stuck = parse_duration(stuck_after, option="--stuck-after")
    ttl = parse_duration(tombstone_ttl, option="--tombstone-ttl")
    if location_config is not None and locations is None:
        raise InvalidInput(
            f"--location-config {location_config!r} needs --locations (the Backbeat config.json)"
        )
    expected = (
        load_locations(locations, location_config, services=options_of(ctx).services)
        if locations is not None
        else None
    )
    if metrics_file is not None:
        _check_writable(metrics_file, "--metrics-file")  # before the scan, not after it
    run_check, render_report, write_metrics = _feature(
        "locstatus.check", "check", "run_check", "render_report", "write_metrics"
    )
    if fmt == "json":
        configure_logging(fmt)
    mgr = options_of(ctx).manager()
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
        print_json(json.dumps(report.as_dict()))
    else:
        render_report(report, new_console())
    if metrics_file is not None:
        write_metrics(report, metrics_file)
    if fmt == "json":
        (log_report,) = _feature("locstatus.check", "check", "log_report")
        log_report(report)
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
    backbeat_trust: Annotated[
        list[str] | None,
        typer.Option(
            "--backbeat-trust",
            metavar="CIDR",
            help="Peers in this network (repeatable) may call the Backbeat-route mutations "
            "without the token: where CloudServer connects from (docs/http.md).",
        ),
    ] = None,
    location_series: Annotated[
        str,
        typer.Option(
            "--location-series",
            metavar="N",
            help="At most N per-location series in /metrics: the services not running that "
            "changed longest ago (0: none; fleet-wide series are always there).",
        ),
    ] = "1000",
    log_format: Annotated[
        str,
        typer.Option(
            "--log-format",
            envvar="LOCSTATUS_LOG_FORMAT",
            metavar="text|json",
            help="json: one JSON object per line (location, service, op_id, actor when known).",
        ),
    ] = "text",
) -> None:
    """Run the HTTP sidecar (docs/design.md §5.3); the token comes from $LOCSTATUS_API_TOKEN."""
    logging.getLogger("kazoo").setLevel(logging.WARNING)  # a long-running process logs them
    port_number = parse_port(port)
    reconcile = interval_seconds("--reconcile-interval", reconcile_interval)
    check_every = interval_seconds("--check-interval", check_interval)
    series = int(parse_number("--location-series", location_series, low=0, high=1_000_000,
                              integer=True))
    log_format = check_log_format(log_format)
    (serve_fn,) = _feature("locstatus.api.server", "serve", "serve", extra="server")
    serve_fn(
        options_of(ctx).backend,
        host=host,
        port=port_number,
        token=os.environ.get("LOCSTATUS_API_TOKEN") or None,
        insecure=insecure,
        reconcile_interval=reconcile,
        check_interval=check_every,
        allowed_hosts=tuple(allow_host or ()),
        backbeat_trust=tuple(backbeat_trust or ()),
        location_series=series,
        log_format=log_format,
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
    seconds = interval_seconds("--duration", duration)
    port_number = parse_port(port)
    (run_demo,) = _feature("locstatus.demo", "demo", "run_demo", extra="server")
    opts = options_of(ctx)
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


tokens_app = typer.Typer(
    help="Tokens of the sidecar's callers (docs/http.md, \"Callers and roles\").",
    no_args_is_help=True, rich_markup_mode=None,
)


@tokens_app.command("new")
def tokens_new(
    name: Annotated[str, typer.Argument(help="The caller's name: the actor of its changes.")],
    role: Annotated[str, typer.Argument(help="read, worker, operator or admin.")],
    forward_actor: Annotated[
        bool,
        typer.Option("--forward-actor", help="The caller may name another actor (a proxy)."),
    ] = False,
) -> None:
    """Print a fresh token (give it to the caller; it is shown once) and its entry for the
    tokens file (LOCSTATUS_API_TOKENS_FILE), which holds only the token's SHA-256."""
    (new_token,) = _feature("locstatus.api.principals", "tokens new", "new_token", extra="server")
    token, entry = new_token(name, role, forward_actor=forward_actor)
    typer.echo(f"token (give it to {name}, it is shown once): {token}")
    typer.echo(f"entry for LOCSTATUS_API_TOKENS_FILE: {json.dumps(entry)}")


@tokens_app.command("hash")
def tokens_hash() -> None:
    """Print the SHA-256 of an existing token read from stdin (at least 16 characters), for a
    tokens-file entry's "sha256"."""
    check_secret, hash_token = _feature(
        "locstatus.api.principals", "tokens hash", "check_secret", "hash_token", extra="server"
    )
    token = typer.get_text_stream("stdin").readline().rstrip("\n")
    typer.echo(hash_token(check_secret(token, "the token")))


app.add_typer(import_app, name="import")
app.add_typer(bridge_app, name="bridge")
app.add_typer(tokens_app, name="tokens")
