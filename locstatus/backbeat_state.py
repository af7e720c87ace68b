"""Backbeat's own pause/resume state, as its processes store it (docs/backbeat.md, "What Backbeat
holds"): parsing it, and the names and places it lives under.

Why it is shaped so: the import (:mod:`locstatus.importers.backbeat`) reads this state once and
the bridge (:mod:`locstatus.bridge`) reads and writes it continuously; both must agree on what a
valid node or document is, and both must refuse the same bad data with the same clear message
(a node that is not JSON, a field missing or of the wrong type, a date that does not parse),
so the format is defined once, here, below both. Pure: no I/O.

- replication: ZooKeeper node ``<namespace>/state/<site>`` (namespace ``/backbeat/replication``),
  ingestion: ``/backbeat/ingestion/state/<location>``; JSON ``{"paused": bool,
  "scheduledResume": <ISO date> | null}`` (a node a processor just created may lack
  ``scheduledResume``: ``{"paused": false}``);
- lifecycle: MongoDB collection ``__locationStatusStore``, one document per location,
  ``{_id: <location>, value: {crr: null | {paused, scheduledResume}, ingestion: ...,
  lifecycle: ...}}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from locstatus.errors import InvalidInput

REPLICATION_NAMESPACE = "/backbeat/replication"
INGESTION_NAMESPACE = "/backbeat/ingestion"
STATE_PATH = "/state"
STATUS_COLLECTION = "__locationStatusStore"
"""Backbeat's lifecycle state collection (its ``lib/constants.js``)."""
DEFAULT_TOPICS = {"replication": "backbeat-replication", "ingestion": "backbeat-ingestion"}
"""``extensions.<service>.topic`` of Backbeat's sample config.json: the Redis channel of a
processor is ``<topic>-<location>``."""
DOCUMENT_KEYS = {"replication": "crr", "ingestion": "ingestion", "lifecycle": "lifecycle"}
"""locstatus service -> key under ``value`` of a ``__locationStatusStore`` document."""

_ISO = re.compile(
    r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?(Z|[+-]\d{2}:?\d{2})$"
)
_JS_STRING = re.compile(
    r"^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) "
    r"([0-9]{2}) ([0-9]{4}) ([0-9]{2}):([0-9]{2}):([0-9]{2}) GMT([+-])([0-9]{2})([0-9]{2})"
    r"(?: \([^()]*\))?$"
)
"""JavaScript's ``Date.prototype.toString``: ``Fri Jun 28 2030 07:40:20 GMT+0200 (Central
European Summer Time)``, what Backbeat's ``LocationStatus`` model stores as a lifecycle
document's ``scheduledResume`` (``date.toString()``)."""
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


@dataclass(frozen=True)
class LegacyState:
    """One location's state of one service as Backbeat holds it. ``scheduled_resume`` is an
    aware UTC datetime or None."""

    paused: bool
    scheduled_resume: datetime | None = None


def parse_date(value: object, where: str) -> datetime | None:
    """A ``scheduledResume`` value: None for null, else an ISO 8601 date with an offset (what
    JavaScript's ``Date`` serialises to in JSON: ``2018-06-28T05:40:20.600Z``, as the
    processors write their state nodes) or what its ``toString()`` writes (``Thu Jun 28 2018
    05:40:20 GMT+0000 (Coordinated Universal Time)``, as Backbeat's lifecycle documents hold
    it), as aware UTC. Raises :class:`InvalidInput` naming ``where`` for anything else (a
    number, a date without offset, which JavaScript reads in the processor's own time zone, a
    date that does not exist)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"{where}: scheduledResume must be a date string or null, "
                           f"got {type(value).__name__}")
    shown = value if len(value) <= 40 else value[:37] + "..."
    js = _JS_STRING.match(value)
    if js is not None:
        month, day, year, hh, mm, ss, sign, oh, om = js.groups()
        offset = (int(oh) * 60 + int(om)) * (-1 if sign == "-" else 1)
        try:
            return datetime(int(year), _MONTHS.index(month) + 1, int(day), int(hh), int(mm),
                            int(ss), tzinfo=timezone(timedelta(minutes=offset))).astimezone(UTC)
        except (ValueError, OverflowError):
            raise InvalidInput(f"{where}: scheduledResume {shown!r} is not a valid date") from None
    if not _ISO.match(value):
        raise InvalidInput(f"{where}: scheduledResume {shown!r} is not an ISO 8601 date with "
                           "an offset (such as 2018-06-28T05:40:20.600Z)")
    text = value[:-1] + "+00:00" if value.endswith("Z") else value
    frac = re.search(r"\.(\d+)", text)
    if frac and len(frac.group(1)) > 6:  # Python reads microseconds at most
        text = text.replace(frac.group(0), "." + frac.group(1)[:6])
    try:
        return datetime.fromisoformat(text).astimezone(UTC)
    except (ValueError, OverflowError):
        raise InvalidInput(f"{where}: scheduledResume {shown!r} is not a valid date") from None


def parse_state(data: Any, where: str) -> LegacyState:
    """A state object (decoded JSON): ``{"paused": bool, "scheduledResume"?: date | null}``;
    other members are kept by Backbeat and ignored here. Raises :class:`InvalidInput` naming
    ``where`` and what is wrong."""
    if not isinstance(data, Mapping):
        raise InvalidInput(f"{where}: expected a JSON object such as "
                           f'{{"paused": false}}, got {type(data).__name__}')
    if "paused" not in data:
        raise InvalidInput(f"{where}: the field 'paused' is missing")
    paused = data["paused"]
    if not isinstance(paused, bool):
        raise InvalidInput(f"{where}: 'paused' must be true or false, "
                           f"got {json.dumps(paused)[:40]}")
    return LegacyState(paused, parse_date(data.get("scheduledResume"), where))


def parse_node(raw: bytes, where: str) -> LegacyState:
    """A ZooKeeper state node's bytes. Raises :class:`InvalidInput` for bytes that are not a
    UTF-8 JSON object of the state's shape (:func:`parse_state`)."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        shown = raw[:40].decode("utf-8", "replace")
        raise InvalidInput(f"{where}: not JSON: {shown!r}") from None
    return parse_state(data, where)


def parse_document(doc: Mapping[str, Any], where: str) -> dict[str, LegacyState | None]:
    """A ``__locationStatusStore`` document -> ``{locstatus service: state or None}`` for the
    keys present under ``value`` (null: the location does not have that service). Raises
    :class:`InvalidInput` naming ``where`` for a document without an object ``value`` or with
    a service entry of the wrong shape."""
    value = doc.get("value")
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{where}: the field 'value' is missing or not an object")
    out: dict[str, LegacyState | None] = {}
    for service, key in DOCUMENT_KEYS.items():
        if key not in value:
            continue
        entry = value[key]
        out[service] = None if entry is None else parse_state(entry, f"{where}, value.{key}")
    return out


def node_path(namespace: str, location: str) -> str:
    """The ZooKeeper state node of ``location`` under ``namespace`` (``/backbeat/replication``)."""
    return f"{namespace.rstrip('/')}{STATE_PATH}/{location}"


def js_date(when: datetime) -> str:
    """A date as JavaScript's ``toISOString`` writes it: ``2018-06-28T05:40:20.600Z``."""
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class BackbeatConfig:
    """Where a Backbeat deployment keeps its state and its channels, from its ``config.json``
    (:meth:`from_config`) or given one by one.

    - ``zookeeper``: kazoo hosts string with Backbeat's chroot (``zookeeper.connectionString``,
      ``127.0.0.1:2181/backbeat``), or None to skip replication and ingestion;
    - ``mongodb``: a MongoDB URI for lifecycle's ``__locationStatusStore`` (None: skip it) and
      ``mongodb_database`` (``queuePopulator.mongo.database``, default ``metadata``);
    - ``redis``: ``redis://host:port`` of Backbeat's pub/sub (``redis.host`` / ``port``),
      ``redis_password`` its ``redis.password`` (None or empty: no AUTH), and
      ``redis_sentinels`` whether the file names ``redis.sentinels`` (Redis Sentinel, which the
      bridge refuses at start: docs/backbeat.md "2. The bridge");
    - ``namespaces`` and ``topics``: per service (replication, ingestion).
    """

    zookeeper: str | None = None
    mongodb: str | None = None
    mongodb_database: str = "metadata"
    redis: str | None = None
    redis_password: str | None = None
    redis_sentinels: bool = False
    namespaces: Mapping[str, str] | None = None
    topics: Mapping[str, str] | None = None

    def namespace(self, service: str) -> str:
        """The ZooKeeper namespace of ``service`` (replication or ingestion)."""
        given = dict(self.namespaces or {})
        default = REPLICATION_NAMESPACE if service == "replication" else INGESTION_NAMESPACE
        return given.get(service, default)

    def topic(self, service: str) -> str:
        """The topic whose ``<topic>-<location>`` Redis channel ``service``'s processors read."""
        return dict(self.topics or {}).get(service, DEFAULT_TOPICS[service])

    @classmethod
    def from_config(cls, data: Any, where: str = "config.json") -> BackbeatConfig:
        """Read Backbeat's ``config.json`` (decoded). Raises :class:`InvalidInput` naming the
        field that has the wrong type."""
        if not isinstance(data, Mapping):
            raise InvalidInput(f"{where}: expected a JSON object")

        def section(obj: Any, *keys: str) -> Mapping[str, Any]:
            for key in keys:
                obj = obj.get(key) if isinstance(obj, Mapping) else None
            return obj if isinstance(obj, Mapping) else {}

        def text(value: Any, name: str) -> str | None:
            if value is None:
                return None
            if not isinstance(value, str) or not value:
                raise InvalidInput(f"{where}: {name} must be a non-empty string")
            return value

        zk = text(section(data, "zookeeper").get("connectionString"), "zookeeper.connectionString")
        if zk is not None:
            check_zookeeper(zk, f"{where}: zookeeper.connectionString")
        redis_conf = section(data, "redis")
        redis = None
        if redis_conf.get("host") is not None:
            host = text(redis_conf.get("host"), "redis.host")
            port = redis_conf.get("port", 6379)
            if isinstance(port, bool) or not isinstance(port, int):
                raise InvalidInput(f"{where}: redis.port must be an integer")
            if not 1 <= port <= 65535:
                raise InvalidInput(f"{where}: redis.port {port} is not a TCP port (1-65535)")
            if host is not None and ":" in host and not host.startswith("["):
                host = f"[{host}]"  # an IPv6 address: redis://[::1]:6379
            redis = f"redis://{host}:{port}"
        password = redis_conf.get("password")
        if password is not None and not isinstance(password, str):
            raise InvalidInput(f"{where}: redis.password must be a string")
        sentinels = redis_conf.get("sentinels")
        if sentinels is not None and not isinstance(sentinels, (str, list)):
            raise InvalidInput(f"{where}: redis.sentinels must be a list or a string")
        topics = {}
        for service in DEFAULT_TOPICS:
            topic = text(section(data, "extensions", service).get("topic"),
                         f"extensions.{service}.topic")
            if topic is not None:
                topics[service] = topic
        mongo = section(data, "queuePopulator", "mongo")
        database = text(mongo.get("database"), "queuePopulator.mongo.database") or "metadata"
        check_database(database, f"{where}: queuePopulator.mongo.database")
        hosts = text(mongo.get("replicaSetHosts"), "queuePopulator.mongo.replicaSetHosts")
        uri = None
        if hosts is not None:
            rs = mongo.get("replicaSet")
            if rs is not None and (not isinstance(rs, str) or not rs):
                raise InvalidInput(f"{where}: queuePopulator.mongo.replicaSet must be a "
                                   "non-empty string")
            uri = f"mongodb://{hosts}/" + (f"?replicaSet={rs}" if rs else "")
        return cls(zookeeper=zk, mongodb=uri, mongodb_database=database, redis=redis,
                   redis_password=password or None, redis_sentinels=bool(sentinels),
                   topics=topics)


def redact_url(url: str) -> str:
    """``url`` with the password it carries (``redis://:PASSWORD@host:port``) shown as
    ``***``: what messages and logs name, never the secret."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, hostport = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{hostport}"


def check_database(name: str, where: str) -> None:
    """Refuse a MongoDB database name MongoDB refuses (one of ``/\\. "$`` or NUL in it),
    which pymongo reports only once the import or the bridge reads it. Raises
    :class:`InvalidInput` naming ``where`` (the field or option)."""
    bad = sorted({c for c in name if c in '/\\. "$\x00'})
    if bad:
        raise InvalidInput(f"{where}: {name[:80]!r} is not a MongoDB database name (it has "
                           f"{' '.join(repr(c) for c in bad)})")


def check_zookeeper(hosts: str, where: str) -> None:
    """Refuse a ZooKeeper connection string kazoo would refuse with a bare ``ValueError`` when
    the client is made: ``host:port,...`` with ports in 1-65535, then an optional absolute
    chroot without empty, ``.`` or ``..`` segments. Raises :class:`InvalidInput` naming
    ``where`` (the field or option) and what is wrong."""
    servers, slash, chroot = hosts.partition("/")
    for server in servers.split(","):
        host, colon, port = server.strip().rpartition(":")
        if not colon or server.strip().endswith("]"):  # no port; [::1] alone
            host, port = server.strip(), "2181"
        if not host:
            raise InvalidInput(f"{where}: {hosts!r} has an empty host")
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise InvalidInput(f"{where}: port {port!r} of {server.strip()!r} is not a TCP port "
                               "(1-65535)")
    if slash and chroot:
        parts = chroot.rstrip("/").split("/")
        bad = [p for p in parts if p in ("", ".", "..")]
        if bad:
            raise InvalidInput(f"{where}: the chroot /{chroot} has a {bad[0]!r} segment "
                               "(a ZooKeeper path is absolute, without empty, . or .. parts)")
