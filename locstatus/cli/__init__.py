"""The ``locstatus`` command line (docs/design.md §5.2): what an operator types during an incident.

Shaped so:

- **A thin layer over the Manager.** Every command validates its arguments (location and
  service names, dates, durations, waits) *before* it opens the backend, then makes one or a few
  :class:`~locstatus.Manager` calls. Nothing here reads or writes a backend directly, so the CLI
  cannot disagree with the library or the sidecar about what a pause means.
- **Errors decided once.** Every :class:`~locstatus.errors.LocstatusError` carries its exit code;
  one click group turns any of them into ``error: <message>`` on stderr and that exit code.
- **Scripts and humans.** ``--json`` prints the docs/design.md §2 pydantic models exactly as the
  library returns them; otherwise rich tables show the state coloured, the scheduled resume,
  generation, version, update time, reason and actor.

What lives here (each module imports only those listed after it):

- :mod:`.mutations`, :mod:`.reads`, :mod:`.locations`, :mod:`.features`: the commands by group
  (pause/resume/cancel-schedule; status/history/workers; locations sync/list; check, serve,
  demo, whose implementations are imported only when they run).
- :mod:`.app`: the typer app, global options, the Manager of one invocation, errors to exit
  codes, the shared option types.
- :mod:`.parsing`: argument parsing, pure. :mod:`.rendering`: tables, JSON, error lines.
- :mod:`.fit`: tables that fit a narrow terminal without cutting names.
  :mod:`.suggest`: "did you mean" for an unknown location.

Usage::

    locstatus locations sync config.json --location-config locationConfig.json
    locstatus pause us-east-1 --service replication --reason "target outage"
    locstatus resume us-east-1 --in 2h
    locstatus status --json
"""

from __future__ import annotations

import logging
import os
import signal

from . import features, locations, mutations, reads
from .app import app

__all__ = ["app", "main"]

_COMMANDS = (features, locations, mutations, reads)
"""The command modules: importing them registers their commands on :data:`app`."""


def main() -> None:
    """Console entry point (``locstatus``)."""
    if not os.environ.get("LOCSTATUS_DEBUG"):
        # kazoo logs every failed connection attempt on stderr; a one-shot command reports the
        # outcome in its own one line (docs/cli.md). ``serve`` turns them back on.
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    try:
        app(prog_name="locstatus")
    finally:
        # The command has reported and chosen its exit status; what is left is the interpreter's
        # teardown, which restores SIGINT's default action: a Ctrl-C landing there killed the
        # process (status -2, nothing printed) after it had reported success. Ignored from here.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
