"""The znode layout under the chroot: where each thing lives, what each node holds, and how a
record's znode versions become locstatus versions (docs/zookeeper.md)::

    locations/<loc>                          record JSON (+ "incarnation"); CAS on its version
    history/<loc>                            incarnation counter: its data version = creates
    history/<loc>/<inc>/b<bucket>/<seq>      one node per write: the JSON entries of that write
    acks/<loc>                               created and deleted with the record; its data is
                                             touched by every ack (one watch per location)
    acks/<loc>/<worker_id>                   ephemeral {service: observed generation}
    workers                                  its data version counts registrations created
    workers/<worker_id>                      ephemeral WorkerInfo JSON (the session bounds the
                                             lease; lease_expires_at is kept as given)
    clock                                    empty; rewritten by every time probe, whose
                                             returned mtime is the leader's clock

Why it is shaped so: every name goes through the location-name check, so no path built here
leaves the chroot; history nodes are named by version and paged in ``b<bucket>`` folders of
:data:`BUCKET` (never one growing node, no children list beyond 1000 names), under a folder per
incarnation so what an interrupted purge leaves behind is never read as a later life's.

Versions (:data:`VERSIONS`): ``incarnation << 32 | (znode version + 1)``. The first life of a
record counts 1, 2, 3 ... like SQLite; a recreated record starts above every version of its
earlier lives; a compare-and-set is exactly ``expected + 1``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from locstatus.backends import codec
from locstatus.backends.versions import VersionScheme
from locstatus.errors import CorruptRecord, InvalidInput
from locstatus.models import LocationStatus
from locstatus.names import check_location

log = logging.getLogger(__name__)

BUCKET = 1000
"""History nodes per ``b<bucket>`` folder."""
VERSIONS = VersionScheme(shift=32)
"""A record's version: its incarnation (creations before this one) and znode version + 1."""
ACKS_HINT = b""
"""What every acknowledgement writes to ``acks/<loc>`` (the write itself is the signal)."""


def split_version(version: int) -> tuple[int, int]:
    """``(incarnation, seq)`` of an exposed version; seq is the znode version + 1."""
    return VERSIONS.split(version)


def join_version(incarnation: int, seq: int) -> int:
    """The exposed version of write ``seq`` (1-based) of life ``incarnation`` (0-based)."""
    return VERSIONS.join(incarnation, seq)


@dataclass(frozen=True)
class Layout:
    """Absolute znode paths under ``root``. Every name goes through the location-name check,
    so nothing built here can leave the chroot (``..``, ``/`` and the like raise
    :class:`InvalidInput`)."""

    root: str

    @property
    def locations(self) -> str:
        return f"{self.root}/locations"

    @property
    def histories(self) -> str:
        return f"{self.root}/history"

    @property
    def workers(self) -> str:
        return f"{self.root}/workers"

    @property
    def acks_root(self) -> str:
        return f"{self.root}/acks"

    @property
    def clock(self) -> str:
        return f"{self.root}/clock"

    def location(self, location: str) -> str:
        return f"{self.locations}/{_name(location)}"

    def history(self, location: str) -> str:
        return f"{self.histories}/{_name(location)}"

    def incarnation(self, location: str, incarnation: int) -> str:
        return f"{self.history(location)}/{incarnation:010d}"

    def bucket(self, location: str, incarnation: int, seq: int) -> str:
        return f"{self.incarnation(location, incarnation)}/b{seq // BUCKET:07d}"

    def entry(self, location: str, incarnation: int, seq: int) -> str:
        return f"{self.bucket(location, incarnation, seq)}/{seq:010d}"

    def worker(self, worker_id: str) -> str:
        return f"{self.workers}/{_worker_name(worker_id)}"

    def acks(self, location: str) -> str:
        return f"{self.acks_root}/{_name(location)}"

    def ack(self, location: str, worker_id: str) -> str:
        return f"{self.acks(location)}/{_worker_name(worker_id)}"


@lru_cache(maxsize=8192)
def _name(location: str) -> str:
    """``check_location`` once per name (a transition builds several paths; invalid names raise
    every time, exceptions are not cached)."""
    return check_location(location)


def _worker_name(worker_id: str) -> str:
    try:
        return _name(worker_id)
    except InvalidInput:
        raise InvalidInput(
            f"invalid worker id {worker_id!r}: same rules as location names"
        ) from None


# -- what the nodes hold -------------------------------------------------------------------------


def record_bytes(record: LocationStatus, incarnation: int) -> bytes:
    """The data of ``locations/<loc>``: the record's JSON with its ``incarnation`` appended."""
    return text_bytes(codec.encode_record(record), incarnation)


def text_bytes(text: str, incarnation: int) -> bytes:
    """:func:`record_bytes` of the record whose :func:`codec.encode_record` text is ``text``."""
    return (text[:-1] + f',"incarnation":{incarnation}}}').encode()


def decode_record(
    location: str, raw: bytes, znode_version: int, incarnation_of: Callable[[str], int]
) -> LocationStatus:
    """The record stored as ``raw`` at ``znode_version``. ``incarnation_of(location)`` is asked
    (a read) only for a record without an ``incarnation`` field (written by hand). Raises
    :class:`CorruptRecord`."""
    # Fast path: what record_bytes writes ends with ',"incarnation":N}'; cut it off and let
    # codec.decode_record validate the rest in one pass of pydantic's JSON parser.
    cut = raw.rfind(b',"incarnation":')
    if cut > 0 and raw.endswith(b"}") and raw[cut + 15 : -1].isdigit():
        incarnation = int(raw[cut + 15 : -1])
        version = join_version(incarnation, znode_version + 1)
        return codec.decode_record(location, version, raw[:cut] + b"}")
    data: dict[str, Any] = codec.parse_payload(location, raw)
    found = data.pop("incarnation", None)
    if found is None:
        found = incarnation_of(location)
    if not isinstance(found, int) or isinstance(found, bool) or found < 0:
        raise CorruptRecord(location, f"incarnation must be an integer >= 0, got {found!r}")
    return codec.decode_record(location, join_version(found, znode_version + 1), data)


def encode_acks(acked: dict[str, int]) -> bytes:
    """The data of ``acks/<loc>/<worker_id>``: service -> observed generation."""
    return json.dumps(acked).encode()


def decode_acks(raw: bytes) -> dict[str, int] | None:
    """What an acknowledgement node holds, or None (logged) when it does not read as
    service -> integer generation: an unreadable acknowledgement acknowledges nothing."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and type(v) is int for k, v in data.items()
    ):
        log.warning("ignoring an unreadable acknowledgement: %r", raw[:200])
        return None
    return data
