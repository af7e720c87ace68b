"""The ``mongodb://`` URL: locstatus' own options taken out, checked, and the rest handed to
pymongo (docs/mongodb.md).

Why it is shaped so: pymongo ignores an option it does not know with a warning, and a bad
value of some of its own (``serverSelectionTimeoutMS``) with a 30 s wait, so every option
locstatus reads is declared once with its bounds (:class:`~locstatus.backends.urls.Number`) and
refused here, before anything connects; database and collection names are validated (they
become namespaces). Errors show the URL without its credentials
(:func:`~locstatus.backends.urls.redact_url`).

URL options of locstatus (removed before the URL reaches pymongo; every other option is
pymongo's): ``database`` (default: the URL path, else ``locstatus``), ``collection`` (default
``locations``), ``recent_history`` (writes embedded, 1-1000), ``maxTimeMS``, ``timeoutMS`` (the
deadline of one backend call, below), ``poll_interval`` (seconds, 0.05-60, default 1), ``hints``
(``auto`` | ``changestream`` | ``poll``), ``worker_ttl`` (seconds).

``timeoutMS`` is pymongo's name for its client-side operation timeout (one deadline shared by an
operation's server selection, connection set-up, command and retries). locstatus takes it out of
the URL and applies it per backend *call* instead (``Store.deadline``): every operation a call
sends (a compare-and-set's ``findAndModify``, its history insert, the driver's retries of each)
shares one deadline, so a call against a server that answers nothing fails within it, not after
a few rounds of ``serverSelectionTimeoutMS`` + ``connectTimeoutMS`` + ``socketTimeoutMS`` per
attempt (docs/mongodb.md, "Timeouts").

Usage::

    settings = parse_mongo_url("mongodb://u:pw@db1,db2/?replicaSet=rs&collection=locations")
    settings.where, settings.database, settings.client_url   # "db1,db2", "locstatus", ...
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlunsplit

from locstatus.backends.urls import Number, redact_url, split_url
from locstatus.errors import InvalidInput

_DB_RE = re.compile(r"[A-Za-z0-9_-]{1,63}")
_COLL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,47}")
_DEFAULT_CLIENT_OPTIONS: dict[str, Any] = {
    "serverSelectionTimeoutMS": 5000,
    "connectTimeoutMS": 5000,
    "socketTimeoutMS": 30000,
    "w": "majority",
    "journal": True,
    "wTimeoutMS": 10000,
    "readConcernLevel": "majority",
    "appname": "locstatus",
}
HINT_MODES = ("auto", "changestream", "poll")


@dataclass(frozen=True)
class MongoSettings:
    """What a ``mongodb://`` URL asks for. ``client_url`` is the URL without locstatus' own
    options; ``client_options`` are the defaults the URL did not override."""

    client_url: str
    where: str
    """Hosts, without credentials, for error messages."""
    database: str
    collection: str
    recent_history: int = 100
    max_time_ms: int = 10_000
    call_timeout: float = 10.0
    """Seconds: the deadline of one backend call (``timeoutMS``), shared by all its operations."""
    poll_interval: float = 1.0
    hints: str = "auto"
    worker_ttl: int = 3600
    server_selection_timeout: float = 5.0
    client_options: dict[str, Any] = field(default_factory=dict)


RECENT_HISTORY = Number("recent_history", 100, 1, 1000, unit="writes", integer=True)
"""Writes kept embedded in each record."""
MAX_TIME_MS = Number("maxTimeMS", 10_000, 1, 3_600_000, unit="ms", integer=True)
"""Server-side time budget of every read and findAndModify."""
TIMEOUT_MS = Number("timeoutMS", 10_000, 1, 3_600_000, unit="ms", integer=True)
"""The deadline of one backend call: every operation it sends, with the driver's retries, server
selection and connection set-up, ends within it (pymongo's client-side operation timeout).
Default: the smaller of ``socketTimeoutMS`` and ``maxTimeMS`` (10 s with their defaults), so a
call waits on a silent server no longer than one of its operations was allowed to before."""
SOCKET_TIMEOUT_MS = Number("socketTimeoutMS", 30_000, 0, 999_999_999, unit="ms")
"""pymongo's: how long one network read may wait (0: no limit); read here for the default of
``timeoutMS``."""
POLL_INTERVAL = Number("poll_interval", 1.0, 0.05, 60)
"""Seconds between polls when change streams are not available."""
WORKER_TTL = Number("worker_ttl", 3600, 0, 366 * 86400, integer=True)
"""Seconds after a lease ran out before the TTL monitor deletes a worker's document."""
SERVER_SELECTION_TIMEOUT_MS = Number(
    "serverSelectionTimeoutMS", 5000, 0, 999_999_999, unit="ms", low_open=True
)
"""pymongo's: how long to wait for a server to answer (pymongo's own bounds)."""


def parse_mongo_url(url: str) -> MongoSettings:
    """Split a ``mongodb://`` / ``mongodb+srv://`` URL into locstatus' options and the URL
    pymongo gets. Raises :class:`InvalidInput` naming the bad option or name."""
    parts = split_url(
        url, "MongoDB", "mongodb://host[:port]/database", where=redact_url(url), port=27017
    )
    if parts.scheme not in ("mongodb", "mongodb+srv") or not parts.netloc:
        raise InvalidInput(f"invalid MongoDB URL {url!r}: expected mongodb://host[:port]/...")
    mine: dict[str, str] = {}
    kept: list[str] = []
    present: set[str] = set()
    own = {"database", "collection", "recent_history", "maxtimems", "timeoutms", "poll_interval",
           "hints", "worker_ttl"}
    for segment in (s for s in parts.query.split("&") if s):
        key = unquote(segment.split("=", 1)[0])
        value = unquote(segment.split("=", 1)[1]) if "=" in segment else ""
        if key.lower() in own:
            mine[key.lower()] = value
        else:
            kept.append(segment)
            present.add(key.lower())
    path_db = unquote(parts.path.lstrip("/"))
    database = mine.get("database") or path_db or "locstatus"
    collection = mine.get("collection") or "locations"
    if not _DB_RE.fullmatch(database):
        raise InvalidInput(
            f"invalid MongoDB database name {database!r} in {redact_url(url)}: expected 1-63 "
            "characters of A-Z a-z 0-9 _ -"
        )
    if not _COLL_RE.fullmatch(collection) or collection.lower().startswith("system"):
        raise InvalidInput(
            f"invalid MongoDB collection name {collection!r} in {redact_url(url)}: expected 1-48 "
            "characters of A-Z a-z 0-9 _ -, starting with a letter or _, not system*"
        )
    hints = mine.get("hints", "auto").lower()
    if hints not in HINT_MODES:
        raise InvalidInput(f"invalid hints={hints!r} in {redact_url(url)}: auto|changestream|poll")
    where = redact_url(url)
    recent = int(RECENT_HISTORY.parse(mine.get("recent_history"), "MongoDB", where))
    max_time_ms = int(MAX_TIME_MS.parse(mine.get("maxtimems"), "MongoDB", where))
    poll = POLL_INTERVAL.parse(mine.get("poll_interval"), "MongoDB", where)
    worker_ttl = int(WORKER_TTL.parse(mine.get("worker_ttl"), "MongoDB", where))
    options = {k: v for k, v in _DEFAULT_CLIENT_OPTIONS.items() if k.lower() not in present}
    sst = 5.0
    socket_ms = SOCKET_TIMEOUT_MS.default
    for segment in kept:
        key, _, value = segment.partition("=")
        if unquote(key).lower() == "serverselectiontimeoutms":
            # pymongo's own option, read here for messages and waits: pymongo ignores a bad
            # value with a warning (and waits 30 s), so it is refused here instead
            sst = SERVER_SELECTION_TIMEOUT_MS.parse(unquote(value), "MongoDB", where) / 1000
        elif unquote(key).lower() == "sockettimeoutms":  # the same, for timeoutMS' default
            socket_ms = SOCKET_TIMEOUT_MS.parse(unquote(value), "MongoDB", where) or math.inf
    if "timeoutms" in mine:
        call_timeout = TIMEOUT_MS.parse(mine["timeoutms"], "MongoDB", where) / 1000
    else:
        call_timeout = min(socket_ms, max_time_ms) / 1000
    client_url = urlunsplit((parts.scheme, parts.netloc, parts.path, "&".join(kept), ""))
    return MongoSettings(
        client_url=client_url,
        where=parts.netloc.rpartition("@")[2],
        database=database,
        collection=collection,
        recent_history=recent,
        max_time_ms=max_time_ms,
        call_timeout=call_timeout,
        poll_interval=poll,
        hints=hints,
        worker_ttl=worker_ttl,
        server_selection_timeout=sst,
        client_options=options,
    )

