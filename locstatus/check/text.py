"""Plain-text pieces of the check's messages and evidence: times, ages and clock offsets.

Shared by the findings (their ``message`` and ``evidence`` are part of the JSON report) and the
rich rendering, so both write a time or an age the same way. Pure string formatting: no rich
here (markup is the renderer's), no I/O.
"""

from __future__ import annotations

from datetime import datetime


def iso(value: datetime | None) -> str | None:
    """``2030-01-01T09:00:00Z`` for an aware UTC datetime; None for None."""
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def human_age(seconds: float | None) -> str:
    """An age in seconds for a person: ``4.2s`` (tenths below ten seconds), ``42s``, ``3m7s``,
    ``2h5m``, ``3d4h``; ``""`` for None."""
    if seconds is None:
        return ""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    for unit, size, sub, subsize in (("d", 86400, "h", 3600), ("h", 3600, "m", 60)):
        if s >= size:
            return f"{s // size}{unit}{(s % size) // subsize}{sub}"
    return f"{s // 60}m{s % 60}s"


def offset_text(offset: float) -> str:
    """``10800.0s ahead of`` / ``3.2s behind``: a clock offset (seconds) for a sentence."""
    return f"{abs(offset):.1f}s {'ahead of' if offset > 0 else 'behind'}"
