"""The ``locstatus import`` command group (docs/cli.md, "import backbeat"; docs/backbeat.md).

Why it is shaped so: the CLI registers this group with one line, and everything about reading
Backbeat lives here and in :mod:`.backbeat`; the manager comes from the root command's
``--backend`` (its context object's ``manager()``), so this module needs nothing of the CLI
module above it. Errors are :class:`~locstatus.errors.LocstatusError` and reach the root
command's handler (``error: ...`` and the error's exit code).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Annotated, Protocol

import typer

from locstatus.backbeat_state import BackbeatConfig, check_database, check_zookeeper
from locstatus.errors import InvalidInput, LocstatusError
from locstatus.manager import Manager

from .backbeat import (
    TIMEOUT,
    Report,
    read_backbeat,
    refuse_after_bridge,
    run_import,
    unread,
)

import_app = typer.Typer(
    help="Take over the state another system holds.", no_args_is_help=True, rich_markup_mode=None
)


class _Root(Protocol):
    def manager(self, *, create: bool = False) -> Manager: ...


def _manager(ctx: typer.Context) -> Manager:
    root = ctx.find_root().obj
    if root is None or not hasattr(root, "manager"):  # pragma: no cover - run without the CLI
        raise InvalidInput("locstatus import runs under the locstatus command")
    typed: _Root = root
    return typed.manager()


def require_extra(command: str, *modules: str) -> None:
    """Raise :class:`InvalidInput` (exit 2) naming the ``backbeat`` extra when one of
    ``modules`` (``kazoo``, ``pymongo``, ``redis``) cannot be imported, as the ``zk://``
    backend does for its own: ``pip install 'locstatus[backbeat]'`` (README, "Extras")."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise InvalidInput(
                f"'locstatus {command}' needs the backbeat extra (kazoo, pymongo, redis): "
                f"pip install 'locstatus[backbeat]' ({exc})"
            ) from None


def load_config(path: Path | None, **given: str | None) -> BackbeatConfig:
    """Backbeat's ``config.json`` at ``path`` (or none), with the options given on the
    command line in its place. Raises :class:`InvalidInput` for a file that cannot be read or
    is not JSON."""
    base = BackbeatConfig()
    if path is not None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise InvalidInput(f"cannot read {path}: {exc.strerror or exc}") from None
        except (UnicodeDecodeError, ValueError) as exc:
            raise InvalidInput(f"{path}: not JSON ({exc})") from None
        base = BackbeatConfig.from_config(data, str(path))
    namespaces = {
        service: value
        for service, value in (("replication", given.get("replication_namespace")),
                               ("ingestion", given.get("ingestion_namespace")))
        if value is not None
    }
    for name, value in namespaces.items():
        if not value.startswith("/"):
            raise InvalidInput(f"--{name}-namespace {value!r} must be a ZooKeeper path (/...)")
    if given.get("zookeeper"):
        check_zookeeper(str(given["zookeeper"]), "--zookeeper")
    if given.get("mongodb_database"):
        check_database(str(given["mongodb_database"]), "--mongodb-database")
    return BackbeatConfig(
        zookeeper=given.get("zookeeper") or base.zookeeper,
        mongodb=given.get("mongodb") or base.mongodb,
        mongodb_database=given.get("mongodb_database") or base.mongodb_database,
        redis=given.get("redis") or base.redis,
        redis_password=base.redis_password,
        redis_sentinels=base.redis_sentinels and not given.get("redis"),  # --redis: the master
        namespaces={**dict(base.namespaces or {}), **namespaces},
        topics=base.topics,
    )


ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", metavar="FILE", help="Backbeat's config.json (ZooKeeper, MongoDB, "
                 "Redis, topics); the options below replace what it says."),
]
ZkOpt = Annotated[
    str | None,
    typer.Option("--zookeeper", metavar="HOSTS", help="Backbeat's ZooKeeper, with its chroot "
                 "(127.0.0.1:2181/backbeat)."),
]
MongoOpt = Annotated[
    str | None,
    typer.Option("--mongodb", metavar="URI", help="Backbeat's MongoDB (lifecycle state)."),
]
MongoDbOpt = Annotated[
    str | None,
    typer.Option("--mongodb-database", metavar="NAME", help="Its database (default metadata)."),
]
ReplNsOpt = Annotated[
    str | None,
    typer.Option("--replication-namespace", metavar="PATH",
                 help="Default /backbeat/replication."),
]
IngNsOpt = Annotated[
    str | None,
    typer.Option("--ingestion-namespace", metavar="PATH", help="Default /backbeat/ingestion."),
]


def _print(report: Report) -> None:
    verb = "would" if report.dry_run else "did"
    for c in report.changes:
        when = f" at {c.at.isoformat()}" if c.at is not None else ""
        due = " (its scheduled resume passed)" if c.due else ""
        failed = f": REFUSED: {c.error}" if c.error else ""
        typer.echo(f"{verb} {c.event} {c.location}/{c.service}{when}{due}{failed}")
    for p in report.errors:
        typer.echo(f"not imported: {p.location}/{p.service}: {p.detail}", err=True)
    for key in report.only_in_backbeat:
        typer.echo(f"only in Backbeat (not a locstatus location/service): {key}")
    for key in report.only_in_locstatus:
        typer.echo(f"only in locstatus (no Backbeat state): {key}")
    for key in report.passed:
        typer.echo(f"unchanged {key} (its scheduled resume passed; running already)")
    for svc, why in report.skipped.items():
        typer.echo(f"not importing {svc}: {why}; nothing of it imported", err=True)
    writes = len(report.changes)
    typer.echo(
        f"{len(report.changed)} service(s) {'to change' if report.dry_run else 'changed'} "
        f"({writes} write(s)), {len(report.unchanged)} unchanged, "
        f"{len(report.errors)} not imported" + (" (dry run: nothing written)"
                                                 if report.dry_run else "")
    )


@import_app.command("backbeat")
def backbeat(
    ctx: typer.Context,
    config: ConfigOpt = None,
    zookeeper: ZkOpt = None,
    mongodb: MongoOpt = None,
    mongodb_database: MongoDbOpt = None,
    replication_namespace: ReplNsOpt = None,
    ingestion_namespace: IngNsOpt = None,
    timeout: Annotated[
        float, typer.Option("--timeout", metavar="SECONDS", min=0.1, max=600,
                            help="How long each source may take to answer (default 10).")
    ] = TIMEOUT,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Plan; write nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    service: Annotated[
        list[str] | None,
        typer.Option("--service", metavar="NAME",
                     help="Import only this service (repeatable; default every one of the "
                     "store): e.g. lifecycle, added to a bridge that already bridges the others."),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Import even though the Backbeat bridge has taken "
                           "over (its backbeat.* registrations exist). Dangerous: Backbeat's "
                           "state is then locstatus's own copy; only when it is the truth "
                           "again.")
    ] = False,
) -> None:
    """Import Backbeat's pause/resume state (ZooKeeper state nodes for replication and
    ingestion, MongoDB __locationStatusStore for lifecycle) through the manager: one history
    entry per change (actor import:backbeat); a second run writes nothing. Exit 0 all
    imported, 1 some location not imported (bad legacy data, a refused change) or the bridge has
    taken over (its standing registrations backbeat.* exist: refused, nothing written, unless
    --force), 2 a source or the backend unreachable. With --json a refusal is also a JSON
    object on stdout (:func:`_json_error`)."""
    try:
        _backbeat(ctx, config, zookeeper, mongodb, mongodb_database, replication_namespace,
                  ingestion_namespace, timeout, dry_run, as_json, service, force)
    except LocstatusError as exc:
        if as_json:
            _json_error(exc)
        raise


def _json_error(exc: LocstatusError) -> None:
    """A refusal with ``--json``: ``{"error": {"type", "title", "message", "exit_code"}}`` on
    stdout, so a script reading stdout sees why (the root command still prints ``error: ...``
    on stderr and exits with the error's code: docs/cli.md, "import backbeat")."""
    typer.echo(json.dumps({"error": {"type": type(exc).__name__, "title": exc.title,
                                     "message": exc.message, "exit_code": exc.exit_code}},
                          indent=2))


def _backbeat(
    ctx: typer.Context, config: Path | None, zookeeper: str | None, mongodb: str | None,
    mongodb_database: str | None, replication_namespace: str | None,
    ingestion_namespace: str | None, timeout: float, dry_run: bool, as_json: bool,
    service: list[str] | None, force: bool,
) -> None:
    cfg = load_config(config, zookeeper=zookeeper, mongodb=mongodb,
                      mongodb_database=mongodb_database,
                      replication_namespace=replication_namespace,
                      ingestion_namespace=ingestion_namespace)
    if cfg.zookeeper is None and cfg.mongodb is None:
        raise InvalidInput("nothing to import from: give --config, --zookeeper or --mongodb")
    require_extra("import backbeat", *(["kazoo"] if cfg.zookeeper is not None else []),
                  *(["pymongo"] if cfg.mongodb is not None else []))
    mgr = _manager(ctx)
    services = list(mgr.services)
    if service:
        unknown = [s for s in service if s not in services]
        if unknown:
            raise InvalidInput(f"--service {unknown[0]!r}: not a service of this store "
                               f"(it has {', '.join(services)})")
        services = [s for s in services if s in service]
    if not force:
        refuse_after_bridge(mgr, services)
    entries, read = read_backbeat(cfg, services, timeout)
    report = run_import(mgr, entries, read, dry_run=dry_run)
    report.skipped = unread(cfg, services)
    if as_json:
        typer.echo(report.model_dump_json(indent=2))
    else:
        _print(report)
    if report.failed:
        raise typer.Exit(1)
