"""``locstatus import backbeat``: take over the pause/resume state a running Backbeat holds
(docs/backbeat.md, "1. Import").

Why it is shaped so: the migration must start from Backbeat's truth, and be safe to run again
(a cron, a retried deployment step), so the import reads everything first, then plans, per
location and service, the fewest manager operations that make locstatus say what Backbeat says
(nothing when it already does: a second run writes nothing), and writes them through the
manager like any operator would (one history entry per change, ``actor`` naming the import),
never into a backend directly. Bad legacy data is per location: that location is reported and
left alone, the others are imported.

- replication and ingestion: the ZooKeeper state nodes (:mod:`locstatus.backbeat_state`);
- lifecycle: the ``value.lifecycle`` of each ``__locationStatusStore`` document (Backbeat keeps
  ``crr`` and ``ingestion`` there too, but its processors follow ZooKeeper for those).

``paused`` with a ``scheduledResume`` still ahead becomes a pause plus a scheduled resume at
that time; one already passed is what Backbeat's processor does with it at its next start (it
resumes), so it becomes a resume now (reported as ``due``). Locations Backbeat knows and
locstatus does not (``only_in_backbeat``), and the reverse (``only_in_locstatus``, for the
services whose source was read), are reported, never created or removed: the location list is
``locstatus locations sync``'s job.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel

from locstatus.backbeat_state import (
    DOCUMENT_KEYS,
    STATE_PATH,
    STATUS_COLLECTION,
    BackbeatConfig,
    LegacyState,
    node_path,
    parse_node,
    parse_state,
)
from locstatus.errors import BackendUnavailable, BridgeTookOver, InvalidInput, LocstatusError
from locstatus.manager import Manager
from locstatus.models import LocationStatus, WorkerInfo
from locstatus.names import check_location

ACTOR = "import:backbeat"
"""The ``actor`` of every change the import writes."""
ZK_SERVICES = ("replication", "ingestion")
TIMEOUT = 10.0
"""Seconds to wait for ZooKeeper or MongoDB to answer before the import gives up (exit 2)."""

Event = Literal["pause", "resume", "schedule_resume", "cancel_scheduled_resume"]
MAX_SCHEDULE = timedelta(hours=87_600)
"""Furthest ahead an imported ``scheduledResume`` may be: ten years, the bound the Backbeat
routes put on ``hours`` (docs/http.md, "Backbeat-compatible routes"); one further is bad data
(``9999-12-31T23:59:59.999Z`` is a pause for good spelled as a date), reported per location."""


@dataclass(frozen=True)
class Entry:
    """One location x service read from Backbeat: its state, or why it could not be read.
    ``source`` names where (``zk:/backbeat/replication/state/zenko``)."""

    location: str
    service: str
    source: str
    state: LegacyState | None = None
    error: str | None = None


class Change(BaseModel):
    """One manager operation the import makes (or would make, with ``--dry-run``)."""

    location: str
    service: str
    event: Event
    at: datetime | None = None
    due: bool = False
    """A resume because Backbeat's scheduled resume already passed."""
    error: str | None = None
    """Set when the operation was refused; the location's later changes are not made."""


class Problem(BaseModel):
    """A location that was not imported, and why."""

    location: str
    service: str
    source: str
    detail: str


class Report(BaseModel):
    """What one run found and did (``--json`` prints it)."""

    dry_run: bool
    changes: list[Change] = []
    unchanged: list[str] = []
    """``location/service`` already as Backbeat has it."""
    errors: list[Problem] = []
    only_in_backbeat: list[str] = []
    only_in_locstatus: list[str] = []
    passed: list[str] = []
    """``location/service`` (among ``unchanged``) Backbeat holds paused with a
    ``scheduledResume`` already passed while locstatus already has it running: nothing to
    write, but said, as for the ones it resumes (``due``)."""
    skipped: dict[str, str] = {}
    """Service -> why its source was not read (no MongoDB named for lifecycle, no ZooKeeper
    for replication and ingestion): nothing of it imported."""

    @property
    def changed(self) -> list[str]:
        """``location/service`` with at least one change (a pause and a schedule of one
        service are one service changed, two writes), in the order first changed."""
        return list(dict.fromkeys(f"{c.location}/{c.service}" for c in self.changes))

    @property
    def failed(self) -> bool:
        """True when something was not imported (bad legacy data, a refused change)."""
        return bool(self.errors) or any(c.error for c in self.changes)


BRIDGE_PREFIX = "backbeat."
"""The worker ids of the Backbeat bridge's standing registrations (docs/backbeat.md, "2. The
bridge")."""


def bridge_registrations(
    mgr: Manager, services: Iterable[str] | None = None
) -> list[WorkerInfo]:
    """The Backbeat bridge's standing registrations in ``mgr``'s store (ids ``backbeat.*``),
    of any of ``services`` (default: all): once one exists for a service, the bridge has taken
    it over and Backbeat's state nodes and documents for it say what locstatus said (it writes
    locstatus's state there), so they are no truth to import. Raises
    :class:`BackendUnavailable`."""
    wanted = None if services is None else set(services)
    return [w for w in mgr.workers()
            if w.standing and w.worker_id.startswith(BRIDGE_PREFIX)
            and (wanted is None or wanted & set(w.services))]


def refuse_after_bridge(mgr: Manager, services: Iterable[str] | None = None) -> None:
    """Raise :class:`BridgeTookOver` (exit 1) naming the bridge's registrations of any of
    ``services`` (default: all) when one exists (:func:`bridge_registrations`; a service the
    bridge does not bridge yet can still be imported): the import is a one-time step before
    the bridge (docs/backbeat.md, "1. Import"); run again after it, it would read locstatus's
    own state back with the scheduled resumes cleared, cancel them and undo resumes made
    while the bridge was down. Raises :class:`BackendUnavailable`."""
    found = bridge_registrations(mgr, services)
    if not found:
        return
    names = [w.worker_id for w in found]
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    raise BridgeTookOver(
        f"the Backbeat bridge has taken over ({len(names)} standing registration(s): {shown}): "
        "Backbeat's state nodes and documents are now a copy of locstatus's state, not the "
        "truth, and importing them would cancel scheduled resumes and undo decisions made "
        "since; nothing written. Use --force only if Backbeat's state is the truth again "
        "(docs/backbeat.md, \"1. Import\")"
    )


# -- reading Backbeat ---------------------------------------------------------------------------


def read_zookeeper(hosts: str, namespaces: dict[str, str],
                   timeout: float = TIMEOUT) -> list[Entry]:
    """Every state node under each ``namespaces[service] + "/state"``, read with kazoo. A
    namespace without a state node is no entry, unless the chroot of ``hosts`` does not exist
    (:class:`InvalidInput`: a typo); a node that vanishes between the listing and its read,
    or that does not parse, is an entry with ``error``. Raises
    :class:`BackendUnavailable` when ZooKeeper does not answer within ``timeout`` seconds."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import KazooException, NoNodeError
    from kazoo.handlers.threading import KazooTimeoutError

    client = KazooClient(hosts=hosts, timeout=timeout, connection_retry=None)
    try:
        try:
            with warnings.catch_warnings():
                # kazoo warns (on stderr, a Python traceback-like line) when the chroot does not
                # exist; the import says so itself below, in one line naming the chroot.
                warnings.filterwarnings("ignore", message="No chroot path exists",
                                        category=UserWarning)
                client.start(timeout=timeout)
        except KazooTimeoutError:
            raise BackendUnavailable(
                f"Backbeat's ZooKeeper at {hosts} did not answer within {timeout:g} s"
            ) from None
        out: list[Entry] = []
        missing = False
        for service, namespace in namespaces.items():
            parent = namespace.rstrip("/") + STATE_PATH
            try:
                children = sorted(client.get_children(parent))
            except NoNodeError:
                missing = True
                continue
            for name in children:
                path = node_path(namespace, name)
                where = f"zk:{path}"
                try:
                    raw, _stat = client.get(path)
                except NoNodeError:
                    out.append(Entry(name, service, where,
                                     error=f"{where}: the node vanished while it was read"))
                    continue
                out.append(_entry(name, service, where, lambda r=raw, w=where: parse_node(r, w)))
        if missing and client.chroot and client.exists("/") is None:
            # A chroot that does not exist is a typo, not a Backbeat without state: read as "no
            # state", it listed every location as only in locstatus, exit 0 (a new-user review).
            raise InvalidInput(
                f"no Backbeat state in ZooKeeper at {hosts}: its chroot {client.chroot} does "
                "not exist (a typo in --zookeeper?); nothing imported"
            )
        return out
    except KazooException as exc:
        raise BackendUnavailable(f"reading Backbeat's ZooKeeper at {hosts}: {exc}") from None
    finally:
        client.stop()
        client.close()


def read_mongodb(uri: str, database: str, timeout: float = TIMEOUT) -> list[Entry]:
    """The lifecycle state of every ``__locationStatusStore`` document. Raises
    :class:`BackendUnavailable` when MongoDB does not answer within ``timeout`` seconds."""
    import pymongo
    from pymongo.errors import PyMongoError

    ms = int(timeout * 1000)
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
        uri, serverSelectionTimeoutMS=ms, connectTimeoutMS=ms, socketTimeoutMS=ms
    )
    try:
        docs = list(client[database][STATUS_COLLECTION].find({}))
    except PyMongoError as exc:
        raise BackendUnavailable(
            f"reading Backbeat's {database}.{STATUS_COLLECTION}: {mongo_reason(exc, timeout)}"
        ) from None
    finally:
        client.close()
    out = []
    key = DOCUMENT_KEYS["lifecycle"]
    for doc in docs:
        name = doc.get("_id")
        where = f"mongodb:{database}.{STATUS_COLLECTION}/{name!s:.80}"
        if not isinstance(name, str):
            out.append(Entry(str(name)[:80], "lifecycle", where,
                             error=f"{where}: _id must be a location name (a string)"))
            continue

        def parse(doc: dict[str, Any] = doc, where: str = where) -> LegacyState | None:
            value = doc.get("value")
            if not isinstance(value, dict):
                raise InvalidInput(f"{where}: the field 'value' is missing or not an object")
            if key not in value:
                raise InvalidInput(f"{where}: the field 'value.{key}' is missing")
            entry = value[key]
            return None if entry is None else parse_state(entry, f"{where}, value.{key}")

        out.append(_entry(name, "lifecycle", where, parse))
    return out


def mongo_reason(exc: Exception, timeout: float) -> str:
    """One line for a pymongo error: a server that did not answer is named with its first
    reason (``127.0.0.1:27017: [Errno 111] Connection refused``), without the topology
    description pymongo appends (several lines of every server's state)."""
    from pymongo.errors import ServerSelectionTimeoutError

    text = str(exc)
    if isinstance(exc, ServerSelectionTimeoutError):
        first = text.split(", Timeout:")[0].split(" (configured timeouts")[0]
        return f"no MongoDB server answered within {timeout:g} s ({first})"
    return text.splitlines()[0] if text else type(exc).__name__


def _entry(name: str, service: str, where: str, parse: Any) -> Entry:
    try:
        check_location(name)
    except InvalidInput as exc:
        return Entry(name[:80], service, where, error=f"{where}: {exc.message}")
    try:
        state = parse()
    except InvalidInput as exc:
        return Entry(name, service, where, error=exc.message)
    if state is None:  # null in a document: the location has no such service in Backbeat
        return Entry(name, service, where)
    return Entry(name, service, where, state=state)


def unread(config: BackbeatConfig, services: Iterable[str]) -> dict[str, str]:
    """Service -> why :func:`read_backbeat` will not read it: of ``services``, the ones whose
    source ``config`` does not name (the import says so, as the bridge's ``not bridging``
    does, rather than leaving them out silently)."""
    out: dict[str, str] = {}
    for svc in services:
        if svc in ZK_SERVICES and config.zookeeper is None:
            out[svc] = ("no ZooKeeper named (zookeeper.connectionString of config.json, or "
                        "--zookeeper)")
        elif svc == "lifecycle" and config.mongodb is None:
            out[svc] = ("no MongoDB named (queuePopulator.mongo of config.json, or "
                        "--mongodb)")
    return out


def read_backbeat(
    config: BackbeatConfig, services: Iterable[str], timeout: float = TIMEOUT
) -> tuple[list[Entry], set[str]]:
    """Every entry of the services asked for, and the services whose source was read (each
    source given ``timeout`` seconds to answer); the others are :func:`unread`'s."""
    wanted = set(services)
    entries: list[Entry] = []
    read: set[str] = set()
    zk_services = {s: config.namespace(s) for s in ZK_SERVICES if s in wanted}
    if config.zookeeper is not None and zk_services:
        entries += read_zookeeper(config.zookeeper, zk_services, timeout)
        read |= set(zk_services)
    if config.mongodb is not None and "lifecycle" in wanted:
        entries += read_mongodb(config.mongodb, config.mongodb_database, timeout)
        read.add("lifecycle")
    return entries, read


# -- planning and writing ---------------------------------------------------------------------


def plan(rec: LocationStatus, service: str, legacy: LegacyState, now: datetime) -> list[Change]:
    """The operations that make ``rec``'s ``service`` say what ``legacy`` says (none when it
    already does). Pure."""
    svc = rec.services[service]
    loc = rec.location
    at = legacy.scheduled_resume
    if legacy.paused and at is not None and at <= now:
        due = Change(location=loc, service=service, event="resume", due=True)
        return [due] if svc.paused else []
    if not legacy.paused:
        return [Change(location=loc, service=service, event="resume")] if svc.paused else []
    out = []
    if not svc.paused:
        out.append(Change(location=loc, service=service, event="pause"))
    if at is not None:
        if svc.resume_at != at or not svc.paused:
            out.append(Change(location=loc, service=service, event="schedule_resume", at=at))
    elif svc.resume_at is not None and svc.paused:
        out.append(Change(location=loc, service=service, event="cancel_scheduled_resume"))
    return out


def _apply(mgr: Manager, change: Change) -> None:
    loc, svc = change.location, change.service
    if change.event == "pause":
        mgr.pause(loc, svc, actor=ACTOR, reason="imported from Backbeat: paused")
    elif change.event == "schedule_resume":
        mgr.resume(loc, svc, at=change.at, actor=ACTOR,
                   reason="imported from Backbeat: scheduled resume")
    elif change.event == "cancel_scheduled_resume":
        mgr.cancel_scheduled_resume(loc, svc, actor=ACTOR,
                                    reason="imported from Backbeat: no scheduled resume")
    else:
        why = "its scheduled resume passed" if change.due else "running"
        mgr.resume(loc, svc, actor=ACTOR, reason=f"imported from Backbeat: {why}")


def run_import(mgr: Manager, entries: Sequence[Entry], read: set[str], *,
               dry_run: bool = False) -> Report:
    """Plan and (unless ``dry_run``) write the import of ``entries`` (from
    :func:`read_backbeat`); ``read``: the services whose Backbeat source was read (for
    ``only_in_locstatus``). A refused change is recorded on it and stops that location's
    later changes; the other locations go on. Raises :class:`BackendUnavailable` when
    locstatus's own backend does not answer."""
    report = Report(dry_run=dry_run)
    seen: set[tuple[str, str]] = set()
    records = {r.location: r for r in mgr.statuses()}
    now = mgr.clock()
    for entry in sorted(entries, key=lambda e: (e.location, e.service)):
        key = f"{entry.location}/{entry.service}"
        if entry.state is None and entry.error is None:
            continue  # null in a document: Backbeat has no such service there
        seen.add((entry.location, entry.service))
        if entry.error is not None:
            report.errors.append(Problem(location=entry.location, service=entry.service,
                                         source=entry.source, detail=entry.error))
            continue
        assert entry.state is not None
        at = entry.state.scheduled_resume
        if entry.state.paused and at is not None and at > now + MAX_SCHEDULE:
            report.errors.append(Problem(
                location=entry.location, service=entry.service, source=entry.source,
                detail=f"{entry.source}: scheduledResume {at.isoformat()} is more than ten "
                       "years ahead (the Backbeat routes' bound, 87600 hours): fix it in "
                       "Backbeat, or decide by hand with locstatus pause/resume",
            ))
            continue
        rec = records.get(entry.location)
        if rec is None or entry.service not in rec.services:
            report.only_in_backbeat.append(key)
            continue
        changes = plan(rec, entry.service, entry.state, now)
        if not changes:
            report.unchanged.append(key)
            if entry.state.paused and at is not None and at <= now:
                report.passed.append(key)  # its scheduled resume passed; running already
        for change in changes:
            report.changes.append(change)
            if dry_run:
                continue
            try:
                _apply(mgr, change)
            except BackendUnavailable:
                raise
            except LocstatusError as exc:
                change.error = exc.message
                break
    for rec in records.values():
        for service in sorted(rec.services):
            if service in read and (rec.location, service) not in seen:
                report.only_in_locstatus.append(f"{rec.location}/{service}")
    return report
