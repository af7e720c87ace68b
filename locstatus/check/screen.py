"""The scan's fast screen: which records need no further look (docs/check.md, "Cost").

Most records of a fleet are settled, have nothing due and agree with their history. The scan
reads each record with its newest history writes (``Backend.scan_with_history``); this screen
passes those records in a few comparisons, with no further read, and sends every other one
(tombstones, transitions, due resumes, location-list drift, a history that needs more writes
than the scan brought or disagrees, backends with two history copies) down the full path, which
reports it. It is only worth having if it never says "nothing to report" where the full path
reports something: ``tests/test_check_screen.py`` holds it to that, against the full path, over
random operator actions and random damage. Pure: no I/O, one call per record.
"""

from __future__ import annotations

from datetime import datetime

from locstatus.check.history import head_agrees
from locstatus.errors import CorruptRecord
from locstatus.models import HistoryEntry, LocationStatus

Newest = list[HistoryEntry] | CorruptRecord | None
"""The newest history writes read with a record (see ``Backend.scan_with_history``): their
entries newest first, the error that reading them raised, or None when the backend brings
none."""


class Screen:
    """Decides, per record, that the full path would find nothing in it.

    - ``now``: the instant ages are measured from (aware UTC, the backend's time as estimated);
      a scheduled resume at or before it is overdue, so not quiet.
    - ``wanted``: the expected location -> services, or None when no location list was given.
    - ``gaps_possible``: the backend keeps two history copies (MongoDB), so any record may
      have a ``history_gap``, which only the full path looks for.

    Usage::

        screen = Screen(now, wanted=None, gaps_possible=False)
        for rec, newest in backend.scan_with_history():
            if not screen.quiet(rec, newest):
                ...  # the full comparison
    """

    __slots__ = ("gaps_possible", "now", "wanted")

    def __init__(
        self, now: datetime, wanted: dict[str, tuple[str, ...]] | None, gaps_possible: bool
    ) -> None:
        self.now = now
        self.wanted = wanted
        self.gaps_possible = gaps_possible

    def quiet(self, rec: LocationStatus, head: Newest) -> bool:
        """True only when the full path would find nothing in ``rec``, decided from the record
        and ``head``, the newest history writes read with it."""
        if (
            type(head) is not list
            or not head
            or head[0].version != rec.version
            or rec.deleted_at is not None
            or self.gaps_possible
        ):
            return False
        services = rec.services
        if self.wanted is not None:
            want = self.wanted.get(rec.location)
            if want is None or any(s not in services for s in want):
                return False
        now = self.now
        for st in services.values():
            # resume_at first: most services have none, and a call per service is a cost here
            if st.state.transitional or (st.resume_at is not None and st.resume_overdue(now)):
                return False
        return head_agrees(services, head)
