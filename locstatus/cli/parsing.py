"""Argument parsing of the CLI: durations, times, service sets, numbers, free text (docs/cli.md).

Pure and without I/O, so it is tested directly; every function raises
:class:`~locstatus.errors.InvalidInput` naming the option and the bad value (typer's own
messages do not repeat it), before any backend is opened.
"""

from __future__ import annotations

import getpass
import math
import os
import re
import socket
from datetime import UTC, datetime

from locstatus.errors import (
    InvalidInput,
)
from locstatus.models import (
    utcnow,
)
from locstatus.names import (
    MAX_ACTOR,
    SERVICE_ALIASES,
    SERVICE_RE,
    check_text,
)

from .rendering import (
    iso,
)

MAX_WAIT_SECONDS = 86_400.0
MAX_DELAY_SECONDS = 10 * 365 * 86_400.0
"""``--in`` longer than ten years is refused as a typo."""

_DURATION_RE = re.compile(r"(?:(\d{1,9})d)?(?:(\d{1,9})h)?(?:(\d{1,9})m)?(?:(\d{1,9})s)?")


def shown(value: object) -> str:
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
            f"--at {value!r} is not in the future (now {iso(current)}): "
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
                f"invalid --services {value!r}: bad service name {shown(name)} "
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


def check_option_text(option: str, value: str | None, limit: int) -> None:
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
    unit: str = "",
) -> float:
    """Parse a numeric option (typer's own messages do not repeat the bad value). Raises
    :class:`InvalidInput` naming ``option`` and ``value`` unless it is a finite number in
    ``low..high`` (``low`` excluded when ``low_inclusive`` is False), whole if ``integer``;
    the message says the bounds in words (``unit``: what the number counts, e.g. seconds)."""
    kind = ("a whole number" if integer else "a number") + (f" of {unit}" if unit else "")
    expected = f"{kind} {bounds_text(low, high, low_inclusive=low_inclusive, unit=unit)}"
    try:
        number = int(value.strip()) if integer else float(value.strip())
    except ValueError:
        raise InvalidInput(f"invalid {option} {value!r}: expected {expected}") from None
    too_low = number < low if low_inclusive else number <= low
    if not math.isfinite(number) or too_low or number > high:
        raise InvalidInput(f"invalid {option} {value!r}: expected {expected}")
    return number


def bounds_text(low: float, high: float, *, low_inclusive: bool = True, unit: str = "") -> str:
    """``from 0 to 300``, ``more than 0 and at most 31536000 (365 days)``: bounds in words,
    whole numbers written out (never ``3.1536e+08``)."""
    def number(x: float) -> str:
        text = str(int(x)) if float(x).is_integer() else f"{x:f}".rstrip("0")
        if unit == "seconds" and x >= 86_400 and x % 86_400 == 0:
            days = int(x // 86_400)
            text += f" ({days} day{'s' if days != 1 else ''})"
        return text

    if low_inclusive:
        return f"from {number(low)} to {number(high)}"
    return f"more than {number(low)} and at most {number(high)}"


def wait_seconds(wait: str | None) -> float | None:
    if wait is None:
        return None
    return parse_number("--wait", wait, low=0, high=MAX_WAIT_SECONDS, unit="seconds")


def interval_seconds(option: str, value: str | None) -> float | None:
    if value is None:
        return None
    return parse_number(
        option, value, low=0, high=MAX_DELAY_SECONDS, low_inclusive=False, unit="seconds"
    )


def parse_port(value: str) -> int:
    """A TCP port; 0 asks the OS for a free one (the server logs the port it got)."""
    return int(parse_number("--port", value, low=0, high=65_535, integer=True))

