"""The bridge: each Backbeat processor is a locstatus worker, a standing registration the
bridge holds (docs/backbeat.md, "2. The bridge").

Why it is shaped so:

- **One agent per processor.** Backbeat runs one replication queue processor per site (and
  one ingestion processor per location); each is registered as its own worker
  (``backbeat.replication.<site>``), so ``locstatus workers`` and a ``wait=`` error name the
  processor that holds a pause up. Lifecycle's processes read one MongoDB collection: one
  worker, ``backbeat.lifecycle``, stands for them.
- **The processor's own write is the acknowledgement.** A handler publishes the order and
  returns only once the processor's state node, read afresh, says it applied it in a write
  made after the order was published (its ``version``/``mzxid`` against what the bridge saw
  when it published: a node that agreed already may be a processor stalled with the opposite
  order queued, docs/backbeat.md "What the bridge guarantees"); ``paused: true`` is written
  by the processor before it stops its consumer, and only when that write succeeded, and the
  agent acknowledges after the handler returns, so ``pausing`` cannot settle before that
  write. A processor already in the state writes nothing: it is sent a probe
  (``deleteScheduledResumeService``), whose single write acknowledges. A handler that waited
  ``ack_wait`` seconds in vain fails, naming what the node says; the agent retries it with
  backoff and publishes the error in the registration.
- **One order in flight per processor.** Nothing more is published to a processor until its
  order's writes came, or its copy may be lost (nobody received it, or a subscriber
  connection open when it was published closed since: Redis's ``PUBLISH`` count and
  ``CLIENT LIST``), or ``lost_after`` passed: its read-then-write chains must not interleave
  (several at once can leave its node disagreeing with its consumer), and a copy sent to a
  stalled processor whose connection still holds one would only queue behind it.
- **Level-triggered.** One loop compares, for every processor, the desired state (the agent's
  local copy) with its state node, and publishes again while they differ and the last copy
  may be lost (at most every ``republish_interval`` seconds per processor): a processor that
  was down, restarted or lost its Redis connection catches up. A reconnection to Redis or
  ZooKeeper re-reads every node and publishes at once wherever they differ.
- **Scheduled resumes stay locstatus data.** The agents fire due resumes; the bridge publishes
  a plain ``resumeService`` then, never a date (a date arms the processor's own timer), and
  disarms a timer a processor still has (``deleteScheduledResumeService``).
- **Standing registrations.** The processors' workers are standing (docs/agent.md "Standing
  registrations"): while the bridge is stopped or killed they stay counted, so a pause made
  then stays ``pausing`` until a bridge is back and the processor wrote ``paused``; Backbeat's
  consumers run on while the bridge is away, and locstatus says so. A processor whose location
  (or its service) is gone from locstatus has its registration retired by the bridge.
- **Self-fence.** When the bridge cannot renew its leases it does nothing to the processors
  (``on_fence`` is a no-op): pausing every Backbeat consumer because locstatus's store is
  unreachable would be an outage of its own; changes made meanwhile reach them once the
  bridge is back.
- **A newly added location is covered from its first instant.** Per bridged service one more
  standing registration, ``backbeat.<service>`` (every location), is held from the bridge's
  start: a pause of a location no processor registration exists for yet (``locations sync``
  then a pause within milliseconds, before the rescan) waits for it, and its handler registers
  that location's processor (``backbeat.<service>.<location>``) before it acknowledges, so
  the settle that follows counts the processor's own registration, which acknowledges only
  after the processor's write (a hostile review saw such a pause settle at once, up to the
  10 s rescan, while Backbeat's consumer ran: docs/backbeat.md "2. The bridge").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from locstatus.agent import Agent, HandlerRetry
from locstatus.backbeat_state import BackbeatConfig, node_path
from locstatus.client import Client
from locstatus.errors import (
    BackendUnavailable,
    HandlerPending,
    InvalidInput,
    LocstatusError,
    NotFound,
)
from locstatus.models import LocationStatus

from .holding import Holding, judge
from .legacy import (
    CANCEL,
    PAUSE,
    RESUME,
    LifecycleDocuments,
    NodeState,
    Publisher,
    StateNodes,
    action_for,
    agrees,
)

log = logging.getLogger("locstatus.bridge")

ZK_SERVICES = ("replication", "ingestion")


@dataclass(frozen=True)
class _Needs:
    """What bridging a service needs of :class:`~locstatus.backbeat_state.BackbeatConfig`:
    ``fields`` set, named ``name`` (and the options that give them, ``options``) in the
    refusal of an asked-for service and in the "not bridging" reason of one left alone."""

    fields: tuple[str, ...]
    name: str
    options: str

    def met(self, config: BackbeatConfig) -> bool:
        return all(getattr(config, f) for f in self.fields)


_ZK_REDIS = _Needs(("zookeeper", "redis"), "ZooKeeper and Redis", "--zookeeper, --redis")
NEEDS = {
    "replication": _ZK_REDIS,  # the queue processor's state node and its Redis channel
    "ingestion": _ZK_REDIS,
    "lifecycle": _Needs(("mongodb",), "MongoDB", "--mongodb"),  # __locationStatusStore
}
"""Each service the bridge can bridge, in the order it lists them, and what it needs."""


@dataclass(frozen=True)
class BridgeSettings:
    """Timings of the bridge, in seconds.

    - ``ack_wait``: how long one handler run waits for the processor's write before it fails
      (and is retried by the agent);
    - ``republish_interval``: a processor whose node still disagrees gets the order again
      after this long when its copy may be lost (nobody received it, or a connection that
      did closed since);
    - ``lost_after``: a copy a still-open connection received and the processor has not
      acted on is taken as lost after this long (its own write of the node failed, or it
      is stalled that long: docs/backbeat.md "What the bridge guarantees");
    - ``tick``: the loop's period when nothing wakes it (and how often Redis is probed while
      down, and the lifecycle documents compared);
    - ``rescan_interval``: how often locations added to locstatus get their processors;
    - ``lease_seconds``: the processors' worker leases (default ``LOCSTATUS_LEASE_SECONDS``).
    """

    ack_wait: float = 2.0
    republish_interval: float = 1.0
    lost_after: float = 10.0
    tick: float = 0.5
    rescan_interval: float = 10.0
    lease_seconds: float | None = None

    def __post_init__(self) -> None:
        for name in ("ack_wait", "republish_interval", "lost_after", "tick",
                     "rescan_interval"):
            value = getattr(self, name)
            if not 0 < value <= 3600:
                raise InvalidInput(f"bridge setting {name} must be in (0, 3600] s, got {value}")


class NotApplied(HandlerPending):
    """A processor has not (yet) written the state it was told to apply: the agent logs it as
    one info line and retries (a normal waiting state, never a traceback)."""


def _named(fn: Callable[[str], None], name: str) -> Callable[[str], None]:
    """``fn`` named ``Bridge.<name>``: the agent's logs and the stuck-handler report of
    ``locstatus workers`` name a handler by its qualified name (a lambda's says nothing)."""
    fn.__name__ = name
    fn.__qualname__ = f"Bridge.{name}"
    return fn


LIFECYCLE_RETRY = 5.0
"""Seconds after a failed read of the lifecycle documents (Backbeat's MongoDB down) before the
loop reads them again: each try costs the loop up to :data:`~.legacy.QUICK_TIMEOUT` while
it does not answer."""

QUIET = 0.1
"""Seconds without a write to a state node after which a processor that wrote more than the
order it was sent asks for is taken to have finished: the duplicates of an order republished
to a stalled processor run at once when it runs again, each its own read-then-write."""


def _expected(action: str) -> int:
    """The writes a processor makes to its node when it applies ``action``: ``paused`` then
    ``scheduledResume: null`` for a pause or a resume, one for a disarm (tests/node/
    legacy_processor.js, as Backbeat's QueueProcessor does)."""
    return 1 if action == CANCEL else 2


@dataclass
class _Order:
    """The order last published to one processor (docs/backbeat.md, "What the bridge
    guarantees").

    ``version``/``mzxid``: the state node as the bridge had seen it when it first published
    the order (-1: no node), the baseline its acknowledgement is counted from; ``copies``: how
    many of its publishes reached a subscriber (a republish keeps the baseline); ``probe``: a
    ``deleteScheduledResumeService`` sent only to make a processor that is already in the
    state write its node, acknowledged by exactly one write."""

    action: str
    paused: bool
    version: int
    mzxid: int
    last: float
    subscribers: int
    copies: int = 1
    probe: bool = False
    last_version: int = -1
    last_mzxid: int = -1
    """The node as seen when the last copy was published."""
    receivers: frozenset[str] = frozenset()
    """The subscriber connections open when the last copy was published (``id@addr``,
    :class:`~.legacy.Delivery`): while they all are, a copy received was not lost."""
    lost: bool = False
    """One of :attr:`receivers` closed since: what it had not read yet is gone."""

    @property
    def delivered(self) -> bool:
        """A copy reached a subscriber whose connection is still open: the processor has it,
        or has run it (a stall and a lost message no longer look alike)."""
        return self.subscribers > 0 and not self.lost

    def done_since_last(self, node: NodeState | None) -> bool:
        """Whether the node had, since the last copy was published, as many writes as one
        application of the order makes: the processor got past it (a heuristic: a chain
        that started before it could make them, docs/backbeat.md "What the bridge
        guarantees")."""
        if node is None or node.missing or node.mzxid <= self.last_mzxid:
            return False
        if self.last_version < 0 or node.version <= self.last_version:
            return True
        return node.version - self.last_version >= _expected(self.action)

    def writes(self, node: NodeState | None) -> int:
        """How many writes the node had since the order was published (a large number when
        they cannot be counted: the node was created, or created again, since)."""
        if node is None or node.missing or node.mzxid <= self.mzxid:
            return 0
        if self.version < 0 or node.version <= self.version:
            return 1_000_000
        return node.version - self.version

    @property
    def expected(self) -> int:
        """The writes the copies that reached a subscriber ask for (at least one copy's)."""
        return _expected(self.action) * max(1, self.copies)


@dataclass
class _Processor:
    service: str
    location: str
    channel: str
    path: str
    agent: Agent
    order: _Order | None = None
    other: _Order | None = None
    """An order for the other state the processor may still have queued (it was superseded
    before its writes came): while it is, no probe is sent (a probe's read-then-write would
    interleave with that order's chain and write back what it read before)."""
    subscribers: int | None = None
    """How many subscribers the last publish reached (None: none reached Redis yet), at
    ``subscribers_at`` (aware UTC)."""
    subscribers_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    changed_at: float = 0.0
    handed_over: bool = False
    """Set when this bridge stepped down (:meth:`Bridge._step_down`): a handler still running
    for it publishes nothing more and acknowledges nothing (a hostile review saw a stepped-down
    bridge's in-flight handler publish a resume for 0.8 s, over the other bridge's pause)."""
    changed: threading.Event = field(default_factory=threading.Event)
    """Set when this processor's state node changed (or every node may have): wakes its
    handler only, not the handlers of the other processors."""


@dataclass
class _Wake:
    """What woke the loop: ``paths``, the state nodes that changed since its last pass, and
    ``everything`` when every processor must be looked at (a reconnection, a stop)."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    force: bool = False
    pending: bool = False
    paths: set[str] = field(default_factory=set)
    everything: bool = False


class Bridge:
    """Keep Backbeat's processors in step with locstatus.

    ``client``: a :class:`~locstatus.client.Client` (``connect(url)``); ``config``: where
    Backbeat's Redis, ZooKeeper and MongoDB are (:class:`~locstatus.backbeat_state.BackbeatConfig`;
    ``redis`` and ``zookeeper`` are needed for replication and ingestion, ``mongodb`` for
    lifecycle); ``services``: which to bridge (default every one the client has of the three
    and whose stores are configured). Raises :class:`InvalidInput` for a service asked for
    whose store is not configured.

    Usage::

        with Bridge(connect(url), BackbeatConfig.from_config(json.load(f))):
            signal.pause()
    """

    def __init__(
        self,
        client: Client,
        config: BackbeatConfig,
        services: Iterable[str] | None = None,
        settings: BridgeSettings | None = None,
    ) -> None:
        self.client = client
        self.config = config
        self.settings = settings or BridgeSettings()
        available = [s for s in NEEDS if s in client.services]
        if config.redis_sentinels and config.zookeeper is not None and (
                services is None or any(s in ZK_SERVICES for s in services)):
            raise InvalidInput(
                "Backbeat's config.json names redis.sentinels (Redis Sentinel), which the "
                "bridge does not follow: give the current master with --redis "
                "redis://host:port (docs/backbeat.md \"2. The bridge\")")
        wanted = list(services) if services is not None else [
            s for s in available if NEEDS[s].met(config)]
        for s in wanted:
            if s not in available:
                raise InvalidInput(f"cannot bridge {s!r}: not a service of this store")
            if not NEEDS[s].met(config):
                need = NEEDS[s]
                raise InvalidInput(f"bridging {s} needs Backbeat's {need.name} ({need.options})")
        if not wanted:
            raise InvalidInput("nothing to bridge: give Backbeat's ZooKeeper and Redis, or MongoDB")
        self.services = wanted
        self.unbridged: dict[str, str] = {  # a pause of these settles with nothing following it
            s: f"no Backbeat {NEEDS[s].name} in the configuration ({NEEDS[s].options})"
            for s in available if s not in wanted and services is None
        }
        """Services of the store this bridge leaves alone because its configuration lacks what
        they need, with why (``--service`` narrowing is not listed): the command says so at
        start, since a pause of one settles at once with nothing of Backbeat's following it."""
        self._wake = _Wake()
        self._processors: dict[tuple[str, str], _Processor] = {}
        self._by_path: dict[str, _Processor] = {}
        self._lifecycle: Agent | None = None
        self._catch_all: dict[str, Agent] = {}
        """Per bridged ZooKeeper service, ``backbeat.<service>`` (every location): registers
        a new location's processor before it acknowledges (module docstring)."""
        self._adding = threading.Lock()  # one (rescan or catch-all handler) adds processors
        self._down = False  # stepped down: a catch-all handler still running adds nothing
        self._nodes: StateNodes | None = None
        self._publisher: Publisher | None = None
        self._docs: LifecycleDocuments | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._lifecycle_at = 0.0
        self._lifecycle_down: str | None = None
        self._listened_at = 0.0
        self._holding = Holding(client, self.services)
        self.standby = True
        """Another bridge holds its registrations: this one publishes nothing (docs/backbeat.md
        "2. The bridge", One bridge publishes); False once it holds them."""
        self._held_at = 0.0
        self.redis_error: str | None = None
        """Why Backbeat's Redis could not be used at start (refused, ``NOAUTH``,
        ``WRONGPASS``), None when it answered: the bridge runs on and publishes once it does
        (docs/backbeat.md "2. The bridge"); the command says so at start."""

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> Bridge:
        """Connect to Backbeat's stores, register a worker per processor, run every handler
        once and start the loop. Raises :class:`BackendUnavailable` when a store cannot be
        reached (nothing is left running). Idempotent while running."""
        if self._thread is not None:
            return self
        try:
            if any(s in ZK_SERVICES for s in self.services):
                assert self.config.zookeeper and self.config.redis
                self._publisher = Publisher(self.config.redis,
                                            password=self.config.redis_password)
                if not self._publisher.probe():  # run on: Redis may come later (level-triggered)
                    self.redis_error = self._publisher.error
                    log.warning("Backbeat's Redis at %s cannot be used: %s; bridging anyway, "
                                "publishing once it answers (pauses stay pausing meanwhile)",
                                self._publisher.url, self.redis_error)
                self._nodes = StateNodes(self.config.zookeeper, self._node_changed)
            if "lifecycle" in self.services:
                assert self.config.mongodb
                self._docs = LifecycleDocuments(self.config.mongodb,
                                                self.config.mongodb_database)
            self._hold()  # registers its agents, unless another bridge holds them
        except BaseException:
            self.stop()
            raise
        self._thread = threading.Thread(target=self._loop, name="backbeat-bridge", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the loop and every agent. The processors' registrations are left standing
        (docs/agent.md "Standing registrations"): they keep counting while no bridge runs, and
        the next bridge takes them over. Idempotent."""
        self._stop.set()
        self._node_changed(None)
        if self._thread is not None:
            self._thread.join(timeout=10)
        for agent in self._agents():
            agent.stop()
        for store in (self._nodes, self._publisher, self._docs):
            if store is not None:
                store.close()

    def __enter__(self) -> Bridge:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def workers(self) -> list[str]:
        """The worker ids the bridge holds (standing registrations): one per processor,
        ``backbeat.<service>`` per bridged ZooKeeper service and ``backbeat.lifecycle``."""
        return [a.worker_id for a in self._agents()]

    def _agents(self) -> list[Agent]:
        with self._lock:
            agents = [p.agent for p in self._processors.values()]
        agents += list(self._catch_all.values())
        return agents + ([self._lifecycle] if self._lifecycle is not None else [])

    # -- processors ---------------------------------------------------------------------------

    def _agent(self, worker_id: str, service: str, locations: list[str] | None) -> Agent:
        return self.client.agent(
            worker_id, services=[service], locations=locations,
            lease_seconds=self.settings.lease_seconds,
            handler_retry=HandlerRetry(base=0.2, cap=self.settings.republish_interval * 2),
            handler_deadline=max(30.0, self.settings.ack_wait * 3),
            standing=True,
        )

    def _rescan(self) -> None:
        """Give every (location, service) locstatus has a processor, once, and retire the
        standing registration of a processor whose location (or service) is gone. The
        catch-all registrations (``backbeat.<service>``) are registered first: a location
        added while the listing is read is covered by them."""
        with self._adding:
            self._down = False
            self._rescan_locked()

    def _rescan_locked(self) -> None:
        for service in self.services:
            if service in ZK_SERVICES and service not in self._catch_all:
                agent = self._catch_all_agent(service)
                self._catch_all[service] = agent
                # its handlers wait on ``_adding`` (held here) until the listing below added
                # every processor, so each location's first pass is this start's
                agent.start(wait=False)
        found = self.client.listing()
        records = [r for r in found.records if not r.deleted]
        # a record that does not read is not gone: which services it has is unknown, so its
        # processors keep their registrations (a hostile review saw one retired, and a pause
        # settle at once once the record read again)
        self._retire_gone(records, unreadable={c.location for c in found.corrupt})
        for service in self.services:
            if service == "lifecycle":
                continue
            assert self._nodes is not None
            for rec in records:
                if service in rec.services:
                    self._add(service, rec.location)
        if "lifecycle" in self.services and self._lifecycle is None:
            agent = self.client.agent(
                "backbeat.lifecycle", services=["lifecycle"],
                lease_seconds=self.settings.lease_seconds,
                handler_retry=HandlerRetry(base=0.2, cap=self.settings.republish_interval * 2),
                standing=True,
            )
            agent.on_pause("lifecycle")(_named(
                lambda loc: self._lifecycle_apply(loc, True), "pause_lifecycle_document"))
            agent.on_resume("lifecycle")(_named(
                lambda loc: self._lifecycle_apply(loc, False), "resume_lifecycle_document"))
            agent.on_fence("lifecycle")(_named(lambda loc: None, "fence_lifecycle_noop"))
            self._lifecycle = agent
            agent.start()

    def _add(self, service: str, location: str, *, wait: bool = True) -> bool:
        """Register and start the processor of ``service`` at ``location`` unless it has one
        (``_adding`` held); ``wait``: until its handlers ran once. False when it cannot be
        bridged (logged)."""
        assert self._nodes is not None
        if (service, location) in self._processors:
            return True
        proc = self._processor(service, location)
        if proc is None:
            return False
        with self._lock:
            self._processors[(service, location)] = proc
            self._by_path[proc.path] = proc
        self._nodes.watch(proc.path)
        proc.agent.start(wait=wait)
        return True

    def _catch_all_agent(self, service: str) -> Agent:
        """``backbeat.<service>``, watching every location: its handler (pause or resume)
        registers the location's processor before it returns, so that a location added since
        the last rescan is held up by its processor's registration, not settled without it
        (module docstring)."""
        agent = self._agent(f"backbeat.{service}", service, None)

        def register(location: str) -> None:
            with self._adding:
                if self._down or self._stop.is_set():
                    raise NotApplied(f"this bridge stood down for backbeat.{service}: "
                                     "another bridge holds its registration")
                known = (service, location) in self._processors
                # not waiting for the new processor's first pass: its registration, written
                # by start, is what the settle after this acknowledgement counts
                if not self._add(service, location, wait=False):
                    raise NotApplied(f"Backbeat's {service} processor for {location} cannot "
                                     "be bridged (logged by the bridge): its pauses stay "
                                     "pausing")
            if not known:
                log.info("bridge: registered backbeat.%s.%s (a location added since the last "
                         "rescan)", service, location)

        agent.on_pause(service)(_named(register, f"register_{service}_processor"))
        agent.on_resume(service)(_named(register, f"register_{service}_processor"))
        agent.on_fence(service)(_named(lambda loc: None, f"fence_{service}_catch_all_noop"))
        return agent

    def _retire_gone(self, records: list[LocationStatus], unreadable: set[str]) -> None:
        """Retire ``backbeat.<service>.<location>`` (a standing registration, this bridge's or
        one left by an earlier run) for every bridged service whose location is gone from
        locstatus or no longer has that service: nothing stands for that processor any more.
        A location of ``unreadable`` (its record is corrupt) is not gone: its registrations
        stay. A failure is logged; the next rescan tries again."""
        have = {(svc, r.location) for r in records for svc in r.services}
        bridged = [s for s in self.services if s in ZK_SERVICES]
        try:
            listed = self.client.workers()
        except LocstatusError as exc:
            log.warning("bridge: could not list workers to retire gone processors: %s", exc)
            return
        for w in listed:
            parts = w.worker_id.split(".", 2)
            if not (w.standing and len(parts) == 3 and parts[0] == "backbeat"
                    and parts[1] in bridged and (parts[1], parts[2]) not in have
                    and parts[2] not in unreadable):
                continue
            with self._lock:
                proc = self._processors.pop((parts[1], parts[2]), None)
            if proc is not None:
                proc.agent.stop()
            try:
                # its agent stopped above, its lease ended now (or it was an earlier run's):
                # its holder is not present. Not forced: a forced retirement would wait here
                # for a holder still present (its stop could not write the lease's end, or
                # another bridge holds it); refused, the next rescan tries again
                self.client.retire_worker(w.worker_id, actor="locstatus bridge backbeat")
            except NotFound:
                continue  # retired meanwhile
            except LocstatusError as exc:
                log.warning("bridge: could not retire %s: %s", w.worker_id, exc)
                continue
            log.info("bridge: retired %s: its location is gone from locstatus", w.worker_id)

    def _processor(self, service: str, location: str) -> _Processor | None:
        worker = f"backbeat.{service}.{location}"
        try:
            agent = self._agent(worker, service, [location])
        except InvalidInput as exc:
            log.error("cannot bridge %s at %s: %s", service, location, exc.message)
            return None
        proc = _Processor(service, location, f"{self.config.topic(service)}-{location}",
                          node_path(self.config.namespace(service), location), agent)
        agent.on_pause(service)(_named(
            lambda loc: self._converge(proc, True), f"pause_{service}_processor"))
        agent.on_resume(service)(_named(
            lambda loc: self._converge(proc, False), f"resume_{service}_processor"))
        agent.on_fence(service)(_named(lambda loc: None, f"fence_{service}_processor_noop"))
        return proc

    def _desired(self, proc: _Processor) -> bool | None:
        try:
            return proc.agent.is_paused(proc.location, proc.service)
        except NotFound:
            return None

    def _converge(self, proc: _Processor, paused: bool) -> None:
        """The handler: have the processor apply ``paused``; return once it acknowledged
        (:meth:`_acked`: its state node, read afresh, says so in a write made after the
        order was published), or the desired state moved on. Raises :class:`NotApplied`.

        It publishes through :meth:`_publish`, which sends nothing while the processor's
        previous order is in flight (the loop may have published this one already: a second
        ``pauseService`` makes the processor read and write its node a second time before it
        gets to the next site's, bench/bridge.py). It waits on its own processor's node
        changes only."""
        assert self._nodes is not None
        deadline = time.monotonic() + self.settings.ack_wait
        node: NodeState | None = None
        while not self._stop.is_set():
            if proc.handed_over:
                raise NotApplied(f"this bridge stood down for {proc.channel}: another bridge "
                                 "holds its registration")
            proc.changed.clear()  # before the look at the cache: a change after it wakes us
            self._publish(proc, paused)
            node = self._nodes.cached(proc.path)
            if self._acked(proc, node, paused):
                node = self._nodes.read(proc.path)  # the cache lags: read before trusting it
                if self._acked(proc, node, paused) and not proc.handed_over:
                    return
            if self._desired(proc) is not paused:
                return  # superseded: the agent runs the newer handler (and acks nothing old)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            proc.changed.wait(min(left, 0.05))
        what = node.describe() if node is not None else "its state node cannot be read"
        pub = self._publisher
        if pub is not None and not pub.healthy:  # the order may never have reached Redis
            what = (f"Backbeat's Redis at {pub.url} cannot be used ({pub.error or 'no answer'})"
                    f", so the order may not be published; {what}")
        order = proc.order
        if (order is not None and order.paused == paused and node is not None
                and agrees(node, paused) and not order.writes(node)):
            what += ", written before the order (no write of the processor since)"
        raise NotApplied(
            f"Backbeat's {proc.service} processor for {proc.location} has not applied "
            f"{'the pause' if paused else 'the resume'}: {what}{self._listeners(proc)}"
        )

    def _listeners(self, proc: _Processor) -> str:
        """The lag message's word on who listens on ``proc``'s channel: the count the last
        publish returned while Redis answers; while it does not, that count is stale (the
        processor may be gone since), so it is said to be unknown, with when it was last
        seen."""
        if proc.subscribers is None:
            return ""
        if self._publisher is not None and self._publisher.healthy:
            return f"; {proc.subscribers} subscriber(s) on {proc.channel}"
        seen = proc.subscribers_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        return (f"; subscriber(s) on {proc.channel} unknown: Redis unreachable "
                f"({proc.subscribers} seen at {seen})")

    @staticmethod
    def _acked(proc: _Processor, node: NodeState | None, paused: bool) -> bool:
        """Whether the processor acknowledged ``paused`` (docs/backbeat.md, "What the bridge
        guarantees"): its node agrees (:func:`agrees`) in a write made after the order for
        that state was published, and no more writes than that order asks for (more: another
        read-then-write ran meanwhile, so what the node says may be what one of them read
        before another wrote; a new order is sent once it is quiet). A probe counts only with
        exactly its own write. A bridge's first look, before it published anything, trusts a
        node that agrees (it knows of no order in flight), and a node that does not exist
        agrees with running then (no processor ever ran there, and one that starts creates
        it running); once an order was published, a missing node acknowledges nothing (a
        node deleted by hand is no write of the processor, which cannot apply a resume
        without it)."""
        order = proc.order
        if node is not None and node.missing and not paused:
            return order is None  # a node deleted after an order is no processor write
        if order is None:
            return agrees(node, paused)
        if order.paused != paused or not agrees(node, paused):
            return False
        n = order.writes(node)
        return n == 1 if order.probe else 1 <= n <= order.expected

    def _in_flight(self, proc: _Processor, order: _Order, node: NodeState | None,
                   now: float, force: bool) -> bool:
        """Whether ``order`` may still be acted on by the processor, so that nothing else is
        published to it yet (one order in flight per processor: its read-then-write chains
        must not interleave, docs/backbeat.md "What the bridge guarantees"). It is done once
        the writes it asks for came (more than that: once the node is quiet), or when
        ``republish_interval`` passed since its last copy with fewer (lost, ignored by a
        processor already in that state, or queued at a stalled processor: it is sent again,
        or a probe is). A resync (``force``) sends at once an order nobody received."""
        n = order.writes(node)
        quiet = now - proc.changed_at >= QUIET
        if n > order.expected:
            return not quiet
        if n == order.expected:
            return False
        if force and order.subscribers == 0:
            return False
        wait = (self.settings.lost_after if order.delivered
                else self.settings.republish_interval)
        return now - order.last < wait or not quiet

    def _lifecycle_apply(self, location: str, paused: bool) -> None:
        assert self._docs is not None
        if self._docs.apply(location, paused):
            log.info("lifecycle %s at %s", "paused" if paused else "resumed", location)

    # -- one bridge publishes (:mod:`.holding`) -----------------------------------------------

    def _hold(self, *, quiet: bool = False) -> None:
        """Judge who holds the registrations and act (:func:`.holding.judge`). Raises
        :class:`LocstatusError` when the store cannot be read, unless ``quiet`` (the loop's:
        nothing changes then, the next tick looks again)."""
        self._held_at = time.monotonic()
        try:
            self.standby = judge(self._holding, self.standby, take=self._rescan,
                                 step_down=self._step_down, retake=self._retake)
        except LocstatusError as exc:
            if not quiet:
                raise
            log.debug("bridge: could not read who holds its registrations: %s", exc)

    def _step_down(self) -> None:
        """Another bridge holds registrations of this one: stop every agent without writing
        (the other's registration stays as it wrote it); nothing is published from now on."""
        with self._lock:
            for proc in self._processors.values():
                proc.handed_over = True
                proc.changed.set()  # its handler, if one runs, sees it at once
            agents = [p.agent for p in self._processors.values()]
            self._processors.clear()
            self._by_path.clear()
            self._down = True
        agents += list(self._catch_all.values())
        self._catch_all = {}
        if self._lifecycle is not None:
            agents.append(self._lifecycle)
            self._lifecycle = None
        for agent in agents:
            agent.stop(handed_over=True)

    def _retake(self, worker_ids: list[str]) -> None:
        """Register ``worker_ids`` again, taking them back from a bridge this one outranks.
        Heartbeat backends: the next renewal rewrites them anyway; ZooKeeper: a renewal only
        pings, so the agent registers again (its holder node taken over)."""
        if not self.client.backend.session_leases:
            return
        for agent in self._agents():
            if agent.worker_id in worker_ids:
                agent.stop(handed_over=True)
                agent.start(wait=False)

    # -- the loop -----------------------------------------------------------------------------

    def _node_changed(self, path: str | None) -> None:
        """A state node changed (``path``), or every one may have (None: a reconnection):
        wake that processor's handler (every one's for None) and the loop. Kazoo's thread:
        records and returns."""
        with self._lock:
            procs = (list(self._by_path.values()) if path is None
                     else [p] if (p := self._by_path.get(path)) is not None else [])
        now = time.monotonic()
        for proc in procs:
            proc.changed_at = now
            proc.changed.set()
        self._kick(path)

    def _kick(self, path: str | None = None) -> None:
        """Wake the loop for the processor of the state node ``path`` (None: for every one)."""
        with self._wake.cond:
            self._wake.pending = True
            if path is None:
                self._wake.everything = True
            else:
                self._wake.paths.add(path)
            self._wake.cond.notify_all()

    def _publish(self, proc: _Processor, paused: bool, *, force: bool = False) -> None:
        """Publish what moves ``proc`` toward ``paused``, unless it acknowledged already or
        its previous order is in flight (:meth:`_in_flight`). A node that agrees but was not
        written since the order: the order again if the processor got none, else a probe
        (``deleteScheduledResumeService``: the processor writes its node back as it read it,
        ``paused`` unchanged), but never while an order for the other state may still be
        queued at it (``_Processor.other``). The loop and the handler both call it; the lock
        makes one of them publish."""
        assert self._publisher is not None and self._nodes is not None
        node = self._nodes.cached(proc.path)
        now = time.monotonic()
        with self._lock:
            if proc.handed_over:
                return  # stepped down: the other bridge publishes
            order, other = proc.order, proc.other
            if other is not None and other.done_since_last(node):
                proc.other = other = None
            if self._acked(proc, node, paused):
                return
            if order is not None and self._in_flight(proc, order, node, now, force):
                return
            agree = agrees(node, paused)
            gone = (order is not None and not order.delivered and order.writes(node) == 0
                    and node is not None and not node.missing)
            probe = (agree and order is not None and other is None and (
                gone or (order.paused == paused and not order.probe
                         and order.writes(node) == 0 and order.subscribers > 0)))
            if probe:
                action = CANCEL
            elif agree:
                action = PAUSE if paused else RESUME
            else:
                action = action_for(node, paused)
            if (order is not None and order.paused != paused and order.delivered
                    and order.writes(node) < order.expected):
                other = order  # superseded before its writes came: it may still be queued
            before = (proc.order, proc.other)
            version = node.version if node is not None else -1
            mzxid = node.mzxid if node is not None else -1
            if (order is not None and not probe and not order.probe
                    and (order.action, order.paused) == (action, paused)
                    and order.writes(node) == 0):
                sent = _Order(action, paused, order.version, order.mzxid, now,
                              0, copies=order.copies,
                              last_version=version, last_mzxid=mzxid)
            else:
                sent = _Order(action, paused, version, mzxid, now, 0, copies=0, probe=probe,
                              last_version=version, last_mzxid=mzxid)
            proc.order, proc.other = sent, other
        delivery = self._publisher.publish(proc.channel, action)
        with self._lock:
            if delivery is None:  # not sent: the next look publishes again
                if proc.order is sent:
                    proc.order, proc.other = before
                return
            count = delivery.count
            proc.subscribers, proc.subscribers_at = count, datetime.now(UTC)
            sent.subscribers, sent.receivers = count, delivery.connections
            if count > 0:
                sent.copies += 1
            if count == 0:
                proc.other = None  # nobody listens: what was queued went with its connection

    def _forget_lost(self, proc: _Processor, listening: frozenset[str]) -> None:
        """Mark ``proc``'s order lost when a subscriber connection open at its last copy
        closed since (``listening``: the ones open now): what that connection had not read
        is gone, so the order is published again (or, if the node agrees, probed) without
        waiting ``lost_after``; and forget an order for the other state it may have queued."""
        with self._lock:
            order, other = proc.order, proc.other
            if order is not None and order.delivered and not order.receivers <= listening:
                order.lost = True
            if other is not None and not other.receivers <= listening:
                proc.other = None

    def _loop(self) -> None:
        last_rescan = time.monotonic()
        last_full = 0.0
        changed: set[str] | None = None  # None: look at every processor
        while not self._stop.is_set():
            try:
                if time.monotonic() - self._held_at >= self.settings.tick:
                    self._hold(quiet=True)
                if time.monotonic() - last_full >= self.settings.tick:
                    changed = None  # once a tick every processor, whatever woke the loop
                if not self.standby:
                    self._pass(changed)
                    if changed is None:
                        last_full = time.monotonic()
            except Exception:  # the loop never dies; the next pass tries again
                log.exception("backbeat bridge pass failed")
            try:  # a failed pass must not keep new locations' processors unregistered
                if (not self.standby
                        and time.monotonic() - last_rescan >= self.settings.rescan_interval):
                    last_rescan = time.monotonic()
                    self._rescan()
            except Exception:
                log.exception("backbeat bridge rescan failed")
            with self._wake.cond:
                if not self._wake.pending and not self._stop.is_set():
                    self._wake.cond.wait(self.settings.tick)
                wake = self._wake
                changed = None if wake.everything or not wake.pending else wake.paths
                wake.pending, wake.everything, wake.paths = False, False, set()

    def _pass(self, changed: set[str] | None = None) -> None:
        """Publish wherever a processor's node disagrees with what locstatus wants. ``changed``:
        the state nodes that changed since the last pass, the only processors looked at
        (their handlers publish for the others; every tick, and after a reconnection, a pass
        looks at every processor, None): a pass at each write of a node looked at all 16
        processors of bench/bridge.py, 32 times a round, in the process that carries their
        handlers."""
        force = False
        if self._publisher is not None and not self._publisher.healthy:
            force = self._publisher.probe()  # back: publish everything that differs now
        if self._nodes is not None and self._nodes.reconnected.is_set():
            self._nodes.reconnected.clear()
            force = True
        with self._lock:
            procs = list(self._processors.values() if changed is None or force
                         else (p for path in changed if (p := self._by_path.get(path))))
        if force and self._nodes is not None:
            for proc in procs:
                self._nodes.read(proc.path)
        listening = None
        now = time.monotonic()
        if (self._publisher is not None and changed is None
                and now - self._listened_at >= self.settings.tick
                and any(p.order is not None or p.other is not None for p in procs)):
            self._listened_at = now  # once a tick, for every processor
            listening = self._publisher.listeners()
        for proc in procs:
            if listening is not None:
                self._forget_lost(proc, listening)
            if proc.agent.fenced:
                # its is_paused says paused everywhere while fenced: publishing that would
                # pause every Backbeat consumer because locstatus's store is unreachable (the
                # self-fence does nothing to the processors, module docstring)
                continue
            want = self._desired(proc)
            if want is not None and self._publisher is not None:
                self._publish(proc, want, force=force)
        now = time.monotonic()
        if self._docs is not None and self._lifecycle is not None and (
            force or now - self._lifecycle_at >= self.settings.tick
        ):
            self._lifecycle_at = now
            try:
                self._lifecycle_pass()
            except BackendUnavailable as exc:
                # Backbeat's MongoDB is lifecycle's alone: the other services' processors are
                # served meanwhile, and it is looked at again after a while (its handlers
                # keep retrying their own writes, so a lifecycle pause stays pausing)
                self._lifecycle_at = time.monotonic() + LIFECYCLE_RETRY
                if self._lifecycle_down is None:
                    log.warning("bridge: %s; lifecycle documents not kept in step until it "
                                "answers", exc.message)
                self._lifecycle_down = exc.message
            else:
                if self._lifecycle_down is not None:
                    log.warning("bridge: Backbeat's MongoDB answers again")
                self._lifecycle_down = None

    def _lifecycle_pass(self) -> None:
        assert self._docs is not None and self._lifecycle is not None
        docs: dict[str, Any] = self._docs.read()
        for location, state in docs.items():
            try:
                want = self._lifecycle.is_paused(location, "lifecycle")
            except NotFound:
                continue
            if state is None or isinstance(state, str):
                continue
            if state.paused != want or state.scheduled_resume is not None:
                self._docs.apply(location, want)
