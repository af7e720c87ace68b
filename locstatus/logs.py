"""Log output of the long-running processes (the sidecar, worker agents, the check job):
``text`` for people, ``json`` for log pipelines (docs/http.md "Logs").

Why it is shaped so: every log call of the package stays a plain :mod:`logging` call; what an
event is about travels as record attributes, named once here (:data:`FIELDS`): ``location``,
``service``, ``op_id``, ``actor``, ``worker``. A call passes them with ``extra=`` where it
knows them, and :func:`log_context` sets them for everything logged inside a block (a request,
a handler run), so a line logged deep in a call still says which location it was about. The
JSON lines are python-json-logger's: one object per line with ``time`` (ISO 8601 UTC),
``level``, ``logger``, ``message``, the fields that apply, and ``exc_info`` for a traceback.

Usage::

    configure_logging("json")                 # once, in main()
    log.info("fired", extra={"location": "us-east-1", "service": "replication"})
    with log_context(location="us-east-1", op_id=op_id):
        ...                                   # every record logged here carries both
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import IO

from locstatus.errors import InvalidInput

LOG_FORMATS = ("text", "json")
"""The values of ``--log-format`` (``LOCSTATUS_LOG_FORMAT``)."""
FIELDS = ("location", "service", "op_id", "actor", "worker")
"""What an event is about, as record attributes (and JSON members) where they apply."""
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_context: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "locstatus_log_context", default=None
)


def check_log_format(value: str, option: str = "--log-format") -> str:
    """``value`` if it is one of :data:`LOG_FORMATS` (case-insensitive, returned lower-case);
    else :class:`InvalidInput` naming ``option``."""
    fmt = value.strip().lower()
    if fmt not in LOG_FORMATS:
        raise InvalidInput(f"invalid {option} {value!r}: expected one of {', '.join(LOG_FORMATS)}")
    return fmt


@contextlib.contextmanager
def log_context(**fields: str | None) -> Iterator[None]:
    """Within the block (this thread or task), every record carries ``fields`` (those of
    :data:`FIELDS` that are not None) unless the call gives its own. Raises
    :class:`ValueError` for a name outside :data:`FIELDS`."""
    bad = set(fields) - set(FIELDS)
    if bad:
        raise ValueError(f"unknown log field(s) {sorted(bad)}: expected {FIELDS}")
    current = _context.get() or {}
    token = _context.set({**current, **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


class ContextFilter(logging.Filter):
    """Copies the :func:`log_context` fields onto each record that does not set them."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in (_context.get() or {}).items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


def json_formatter() -> logging.Formatter:
    """python-json-logger's formatter, one object per line: ``time``, ``level``, ``logger``,
    ``message``, then every ``extra`` attribute (the :data:`FIELDS` among them)."""
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter(
        "{levelname}{name}{message}",
        style="{",
        rename_fields={"levelname": "level", "name": "logger"},
        timestamp="time",
    )


def formatter(fmt: str) -> logging.Formatter:
    """The formatter of ``fmt`` (``text`` or ``json``; :func:`check_log_format`)."""
    return json_formatter() if check_log_format(fmt) == "json" else logging.Formatter(TEXT_FORMAT)


def configure_logging(
    fmt: str,
    *,
    level: int = logging.INFO,
    stream: IO[str] | None = None,
    loggers: Sequence[str] = ("",),
) -> logging.Handler:
    """Send the records of ``loggers`` (default: the root logger, so every library's too) to
    ``stream`` (default stderr) in ``fmt``, replacing the handlers they had; returns the
    handler. Raises :class:`InvalidInput` for an unknown format."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter(fmt))
    handler.addFilter(ContextFilter())
    for name in loggers:
        lg = logging.getLogger(name)
        for old in list(lg.handlers):
            lg.removeHandler(old)
        lg.addHandler(handler)
        lg.setLevel(level)
    return handler


__all__ = [
    "FIELDS",
    "LOG_FORMATS",
    "ContextFilter",
    "check_log_format",
    "configure_logging",
    "formatter",
    "json_formatter",
    "log_context",
]
