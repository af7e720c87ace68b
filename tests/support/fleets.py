"""Small SQLite stores of many locations for the bulk tests, some of them corrupt on purpose
(a half-written record: a failed location of a bulk operation, exit 2, a 500 result)."""

from __future__ import annotations

from collections.abc import Sequence

from locstatus import Manager
from locstatus.backends.sqlite import SQLiteBackend

HALF_WRITTEN = '{"location": "half-wr'


def sqlite_fleet(url: str, names: Sequence[str], corrupt: int = 0) -> None:
    """Store ``names`` (each with replication) at ``url``, the first ``corrupt`` of them then
    overwritten by a half-written record."""
    with Manager(SQLiteBackend(url)) as mgr:
        mgr.sync_locations({n: ["replication"] for n in names})
    backend = SQLiteBackend(url)
    try:
        for n in names[:corrupt]:
            backend.write_raw(n, HALF_WRITTEN)
    finally:
        backend.close()
