""""Did you mean ...?": an unknown location named on the command line is answered with the
closest stored one (difflib), so a typo (``us-est-1``) reads as one (docs/cli.md, "Exit codes").

Only the CLI suggests: a person typed the name, and the names are read once, on the error path.
The sidecar does not: every 404 would read every record.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from contextlib import contextmanager

from locstatus.errors import LocstatusError, NotFound
from locstatus.manager import Manager


def closest(mgr: Manager, location: str) -> str | None:
    """The stored location closest to ``location`` (difflib ratio 0.6 or more), or None: when
    none is close, when ``location`` is stored after all, or when the names cannot be read."""
    try:
        records, corrupt = mgr.listing()
    except LocstatusError:
        return None
    names = [r.location for r in records] + [c.location for c in corrupt]
    if location in names:
        return None
    found = difflib.get_close_matches(location, names, n=1, cutoff=0.6)
    return found[0] if found else None


@contextmanager
def suggesting(mgr: Manager, location: str) -> Iterator[None]:
    """Run the block; a :class:`NotFound` for an unknown ``location`` is raised again with
    ``; did you mean 'NAME'?`` added when a stored name is close (:func:`closest`). A
    :class:`NotFound` of a stored location (a service it does not have) passes unchanged."""
    try:
        yield
    except NotFound as exc:
        hint = closest(mgr, location)
        if hint is None:
            raise
        raise NotFound(f"{exc.message}; did you mean {hint!r}?") from None
