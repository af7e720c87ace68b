"""``connect(url)``: the entry point of the library, and the :class:`Client` it returns.

The layers only look down: the manager combines the state machine with a backend, and the
agent (the worker side) is built on the manager. A caller of the library wants both from one
object (``connect(url).pause(...)``, ``connect(url).agent(...)``, docs/agent.md), so the object
``connect`` returns is a :class:`Client`: a :class:`~locstatus.manager.Manager` that can also
make agents, defined here, above both, so that the manager never imports the agent.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Unpack

from locstatus.agent import Agent
from locstatus.agent.worker import AgentSettings
from locstatus.backend_clock import time_source_for
from locstatus.backends import open_backend
from locstatus.clock import Clock, TimeSource
from locstatus.manager import Manager, RetryPolicy
from locstatus.settings import Settings

__all__ = ["Client", "connect"]


class Client(Manager):
    """A :class:`Manager` that also makes worker agents (what :func:`connect` returns).

    Build one from a backend like a manager (``Client(backend, services=..., clock=...)``);
    ``Agent(manager, ...)`` makes an agent on any manager.

    Usage::

        mgr = connect("sqlite:///./locstatus.db")
        agent = mgr.agent("worker-7", services=["replication"])
    """

    def agent(
        self,
        worker_id: str,
        services: Iterable[str] | None = None,
        locations: Iterable[str] | None = None,
        **settings: Unpack[AgentSettings],
    ) -> Agent:
        """A worker-side :class:`~locstatus.agent.Agent` bound to this manager (keyword
        settings as :class:`~locstatus.agent.Agent` takes them). Raises :class:`InvalidInput`
        for a bad worker id, service, location or setting."""
        return Agent(self, worker_id, services=services, locations=locations, **settings)


def connect(
    url: str | None = None,
    *,
    services: Iterable[str] | None = None,
    clock: Clock | TimeSource | None = None,
    retry: RetryPolicy | None = None,
    connect_timeout: float | None = None,
) -> Client:
    """Open the backend at ``url`` (default ``$LOCSTATUS_BACKEND``, else
    ``sqlite:///./locstatus.db``) and return a :class:`Client` (a :class:`Manager` that can
    also make agents).

    ``clock``: None (default) judges every deadline on the backend's own time, measured every
    ``$LOCSTATUS_CLOCK_PROBE_INTERVAL`` seconds and trusted within
    ``$LOCSTATUS_CLOCK_MAX_UNCERTAINTY`` seconds (docs/time.md); a callable (a fake clock in
    tests) or a :class:`~locstatus.clock.TimeSource` is used as given.

    ``connect_timeout`` (seconds, 0-3600): give up connecting to a network backend after it
    unless the URL sets its own bound (ZooKeeper ``timeout``, MongoDB
    ``serverSelectionTimeoutMS``); None keeps the backend's default (10 s, 5 s).

    Raises :class:`InvalidInput` for a malformed URL or a bad ``connect_timeout``, and
    :class:`BackendUnavailable` when the backend cannot be reached.

    Usage::

        mgr = connect("zk://127.0.0.1:2181/locstatus")
        mgr.pause("us-east-1", "replication", reason="maintenance")
    """
    settings: Settings | None = None
    if url is None or services is None or clock is None:
        settings = Settings()  # only read the environment for what was not given
        url = settings.backend if url is None else url
        services = settings.service_list if services is None else services
    backend = open_backend(url, connect_timeout=connect_timeout)
    if clock is None:
        assert settings is not None
        clock = time_source_for(
            backend,
            probe_interval=settings.clock_probe_interval,
            max_uncertainty=settings.clock_max_uncertainty,
        )
    return Client(backend, services=services, clock=clock, retry=retry)
