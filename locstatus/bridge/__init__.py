"""The Backbeat bridge: unmodified Backbeat processes follow locstatus (docs/backbeat.md,
"2. The bridge").

Backbeat's queue processors (replication, ingestion) take orders from a Redis channel and keep
their own state in a ZooKeeper node; its lifecycle processes read a MongoDB document. The
bridge makes them participants of locstatus's protocol without changing their code: it holds
a worker lease for each of them, publishes each flip on the processor's channel until the
processor's state node says it applied it, and acknowledges only then, so ``pausing`` settles
once Backbeat's consumer really stopped.

- :mod:`.legacy`: the Backbeat side (Redis publisher, ZooKeeper state nodes, the lifecycle
  document), each level-triggered and resynced on reconnect;
- :mod:`.bridge`: :class:`Bridge`, one agent per processor and the loop that keeps them agreed;
- :mod:`.holding`: who holds the bridge's registrations, so that one bridge publishes (a
  second one stands by);
- :mod:`.command`: ``locstatus bridge backbeat``.

The bridge sits above the manager and the agent (it consumes them, like any worker) and below
the CLI; the state format is :mod:`locstatus.backbeat_state`'s.
"""

from locstatus.bridge.bridge import Bridge, BridgeSettings

__all__ = ["Bridge", "BridgeSettings"]
