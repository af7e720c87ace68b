"""Validation of names and free text (docs/design.md §2), shared by the FSM, manager, CLI and HTTP.

Names are checked before anything reaches a backend: a location name becomes a znode path, a
SQLite key and a Mongo ``_id``, so anything outside the pattern (``..``, ``/``, unicode, control
characters, 10 000 characters) is refused here with a message naming the value.

Free text (``reason``, ``actor``) is printed by ``locstatus status/history`` on operators'
terminals, so it may not carry control characters: ``ESC ]0;...`` retitles the window,
``ESC [2K`` and cursor moves rewrite what was printed above. :func:`check_text` refuses them on
input; :func:`printable` escapes what a record written by other means still holds, on output.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from locstatus.errors import InvalidInput

LOCATION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SERVICE_RE = re.compile(r"[a-z][a-z0-9_-]{0,63}")

BULK_LOCATION = "all"
"""Reserved: ``all`` addresses every location in the CLI and HTTP API (docs/design.md §5.3)."""

MAX_REASON = 1024
"""Longest ``reason``, in characters."""
MAX_ACTOR = 256
"""Longest ``actor``, in characters."""

_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""Control characters (Unicode category Cc): C0, DEL and C1."""

_BIDI_RE = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
"""Characters that reorder or break what a terminal shows without being Cc: the bidirectional
controls (U+061C, U+200E-U+200F, U+202A-U+202E embeddings and overrides, U+2066-U+2069
isolates: ``"\u202eemag"`` prints as ``game``, and the override runs on over what follows on
the line) and the line and paragraph separators (U+2028, U+2029: a newline by another name)."""

DEFAULT_SERVICES: tuple[str, ...] = ("replication", "lifecycle", "ingestion")
SERVICE_ALIASES: dict[str, str] = {"crr": "replication"}


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_name(value: object, kind: str, what: str) -> str:
    """The one rule location names and worker ids share (every backend keys records and
    registrations alike): ``value`` if valid, else :class:`InvalidInput` naming it as ``kind``
    (``"location"``, ``"worker id"``); ``what`` is how a reserved name is refused."""
    if not isinstance(value, str):
        raise InvalidInput(f"{kind} must be a string, got {_shown(value)}")
    if not LOCATION_RE.fullmatch(value) or value in (".", ".."):
        label = "location name" if kind == "location" else kind
        raise InvalidInput(
            f"invalid {label} {_shown(value)}: expected 1-128 characters of "
            "A-Z a-z 0-9 . _ -, starting with a letter or digit"
            + ("" if kind == "location" else " (see locstatus workers)")
        )
    if value == BULK_LOCATION:
        raise InvalidInput(f"{value!r} is reserved for bulk operations and cannot name {what}")
    return value


def check_location(name: object) -> str:
    """Return ``name`` if it is a valid location name, else raise :class:`InvalidInput`.

    Valid: ``^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`` and not ``.`` or ``..`` (docs/design.md §2).
    """
    return _check_name(name, "location", "a location")


def check_worker_id(worker_id: object) -> str:
    """Return ``worker_id`` if it is a valid worker id (the rules of location names, as every
    backend keys registrations like records), else raise :class:`InvalidInput` naming it as a
    worker id (docs/agent.md)."""
    return _check_name(worker_id, "worker id", "a worker")


def canonical_service(name: object, allowed: Iterable[str] | None = None) -> str:
    """Return the canonical service name (``crr`` -> ``replication``).

    Raises :class:`InvalidInput` when the name is malformed or not in ``allowed`` (the configured
    set, default :data:`DEFAULT_SERVICES`).
    """
    if not isinstance(name, str):
        raise InvalidInput(f"service must be a string, got {_shown(name)}")
    canon = SERVICE_ALIASES.get(name, name)
    if not SERVICE_RE.fullmatch(canon):
        raise InvalidInput(f"invalid service name {_shown(name)}")
    known = tuple(allowed) if allowed is not None else DEFAULT_SERVICES
    if canon not in known:
        raise InvalidInput(
            f"unknown service {_shown(name)}: expected one of {', '.join(known)} (or crr)"
        )
    return canon


def check_text(field: str, value: object, limit: int) -> str | None:
    """Return ``value`` if it is None or acceptable free text for ``field`` (``reason``,
    ``actor``): a string of at most ``limit`` characters, encodable as UTF-8, with no control
    character (U+0000-U+001F, U+007F-U+009F: a terminal acts on them, see the module docstring)
    and no bidirectional control or line separator (U+061C, U+200E-U+200F, U+202A-U+202E,
    U+2066-U+2069, U+2028-U+2029: they reorder or break the line a terminal shows).

    Raises :class:`InvalidInput` naming ``field`` and, for a control character, its code point
    and position.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be a string, got {_shown(value)}")
    if len(value) > limit:
        raise InvalidInput(f"{field} is {len(value)} characters long, at most {limit}")
    bad = _CONTROL_RE.search(value)
    if bad is not None:
        raise InvalidInput(
            f"{field} {_shown(value)} contains the control character "
            f"U+{ord(bad.group()):04X} at position {bad.start()}: control characters "
            "(tabs, newlines, escape sequences) are not allowed in free text"
        )
    bad = _BIDI_RE.search(value)
    if bad is not None:
        raise InvalidInput(
            f"{field} {_shown(value)} contains the control character "
            f"U+{ord(bad.group()):04X} at position {bad.start()}: bidirectional controls "
            "and line separators reorder or break what a terminal shows, and are not allowed "
            "in free text"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(
            f"{field} {_shown(value)} is not valid text (undecodable bytes?)"
        ) from None
    return value


def printable(text: str) -> str:
    """``text`` with every character a terminal could act on (control, format, separator and
    unassigned characters: whatever :meth:`str.isprintable` refuses, except the space) written
    as a Python escape (``\\x1b``, ``\\u202e``). For text that came from the store or from a
    handler's exception, which :func:`check_text` never saw."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else _escape(c) for c in text)


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
