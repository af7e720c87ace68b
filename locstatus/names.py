"""Validation of location and service names (SPEC §2), shared by models, CLI and HTTP.

Names are checked before anything reaches a backend: a location name becomes a znode path, a
SQLite key and a Mongo ``_id``, so anything outside the pattern (``..``, ``/``, unicode, control
characters, 10 000 characters) is refused here with a message naming the value.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from locstatus.errors import InvalidInput

LOCATION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SERVICE_RE = re.compile(r"[a-z][a-z0-9_-]{0,63}")

BULK_LOCATION = "all"
"""Reserved: ``all`` addresses every location in the CLI and HTTP API (SPEC §5.3)."""

DEFAULT_SERVICES: tuple[str, ...] = ("replication", "lifecycle", "ingestion")
SERVICE_ALIASES: dict[str, str] = {"crr": "replication"}


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_location(name: object) -> str:
    """Return ``name`` if it is a valid location name, else raise :class:`InvalidInput`.

    Valid: ``^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`` and not ``.`` or ``..`` (SPEC §2).
    """
    if not isinstance(name, str):
        raise InvalidInput(f"location must be a string, got {_shown(name)}")
    if not LOCATION_RE.fullmatch(name) or name in (".", ".."):
        raise InvalidInput(
            f"invalid location name {_shown(name)}: expected 1-128 characters of "
            "A-Z a-z 0-9 . _ -, starting with a letter or digit"
        )
    if name == BULK_LOCATION:
        raise InvalidInput(f"{name!r} is reserved for bulk operations and cannot name a location")
    return name


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
