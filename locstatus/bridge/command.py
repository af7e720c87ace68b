"""The ``locstatus bridge`` command group: ``locstatus bridge backbeat`` runs the bridge until
SIGINT/SIGTERM (docs/backbeat.md, "2. The bridge"; docs/cli.md).

Why it is shaped so: as :mod:`locstatus.importers.command`, registered by the CLI with one
line, with the backend from the root command's ``--backend`` and Backbeat's stores from its
``config.json`` and the same options as ``locstatus import backbeat``.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Annotated

import typer

from locstatus.backbeat_state import redact_url
from locstatus.client import Client, connect
from locstatus.importers.command import (
    ConfigOpt,
    IngNsOpt,
    MongoDbOpt,
    MongoOpt,
    ReplNsOpt,
    ZkOpt,
    load_config,
    require_extra,
)

from .bridge import Bridge, BridgeSettings

bridge_app = typer.Typer(
    help="Keep other systems' processes in step with locstatus.", no_args_is_help=True,
    rich_markup_mode=None,
)


@bridge_app.command("backbeat")
def backbeat(
    ctx: typer.Context,
    config: ConfigOpt = None,
    zookeeper: ZkOpt = None,
    redis: Annotated[
        str | None,
        typer.Option("--redis", metavar="URL", help="Backbeat's Redis (redis://host:port)."),
    ] = None,
    mongodb: MongoOpt = None,
    mongodb_database: MongoDbOpt = None,
    replication_namespace: ReplNsOpt = None,
    ingestion_namespace: IngNsOpt = None,
    service: Annotated[
        list[str] | None,
        typer.Option("--service", metavar="NAME",
                     help="Bridge only this service (repeatable; default every configured one)."),
    ] = None,
    ack_wait: Annotated[
        float, typer.Option("--ack-wait", metavar="SECONDS", min=0.01, max=3600,
                            help="How long a handler waits for a processor's write.")
    ] = BridgeSettings.ack_wait,
    republish: Annotated[
        float, typer.Option("--republish-interval", metavar="SECONDS", min=0.01, max=3600,
                            help="Publish again this often while a processor disagrees "
                                 "and its copy may be lost (nobody received it, or the "
                                 "connection that did closed).")
    ] = BridgeSettings.republish_interval,
    lost_after: Annotated[
        float, typer.Option("--lost-after", metavar="SECONDS", min=0.01, max=3600,
                            help="Take a copy a still-open connection received, and the "
                                 "processor has not acted on, as lost after this long.")
    ] = BridgeSettings.lost_after,
) -> None:
    """Make Backbeat's replication and ingestion queue processors and its lifecycle processes
    follow locstatus: each flip is published on the processor's Redis channel until its
    ZooKeeper state node says it applied it (lifecycle: its __locationStatusStore document is
    kept in step), and a pause settles only then. Runs until interrupted."""
    cfg = load_config(config, zookeeper=zookeeper, mongodb=mongodb,
                      mongodb_database=mongodb_database, redis=redis,
                      replication_namespace=replication_namespace,
                      ingestion_namespace=ingestion_namespace)
    require_extra("bridge backbeat", "kazoo", "redis",
                  *(["pymongo"] if cfg.mongodb is not None else []))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    root = ctx.find_root().obj
    opened = root.manager() if hasattr(root, "manager") else None  # a missing store refused
    if isinstance(opened, Client):  # (a typo in --backend created an empty one, bridged idle)
        client = opened
    else:  # pragma: no cover - run without the CLI's root command
        url: str | None = getattr(root, "backend", None)
        services: tuple[str, ...] | None = getattr(root, "services", None)
        client = connect(url, services=services or None)
    stop = threading.Event()

    def on_signal(_sig: int, _frame: FrameType | None) -> None:
        stop.set()

    # The process's handlers are put back however the command ends (a refused configuration
    # too): run in-process (CliRunner, an embedding program), a handler left behind would turn
    # every later Ctrl-C of that process into a call that sets this dead command's event.
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        bridge = Bridge(client, cfg, services=service or None,
                        settings=BridgeSettings(ack_wait=ack_wait, republish_interval=republish,
                                                lost_after=lost_after))
        with bridge:
            if bridge.standby:  # docs/backbeat.md "2. The bridge", One bridge publishes
                typer.echo(f"standing by: another bridge holds the registrations of "
                           f"{', '.join(bridge.services)} (logged above); this one takes "
                           "them over once it is away", err=True)
            else:
                typer.echo(f"bridging {', '.join(bridge.services)} for "
                           f"{len(bridge.workers)} Backbeat worker(s)", err=True)
            if bridge.redis_error is not None:
                typer.echo(f"Backbeat's Redis at {redact_url(cfg.redis or '')} cannot be used: "
                           f"{bridge.redis_error}; bridging anyway, publishing once it "
                           "answers (a pause stays pausing meanwhile)", err=True)
            for svc, why in bridge.unbridged.items():
                typer.echo(f"not bridging {svc}: {why}; nothing of Backbeat's follows its "
                           "pauses", err=True)
            stop.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        client.close()

