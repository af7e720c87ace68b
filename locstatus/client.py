"""``connect(url)``: the entry point of the library (SPEC §5.1)."""

from __future__ import annotations

from collections.abc import Iterable

from locstatus.backend_clock import time_source_for
from locstatus.backends import open_backend
from locstatus.clock import Clock, TimeSource
from locstatus.manager import Manager, RetryPolicy
from locstatus.settings import Settings


def connect(
    url: str | None = None,
    *,
    services: Iterable[str] | None = None,
    clock: Clock | TimeSource | None = None,
    retry: RetryPolicy | None = None,
) -> Manager:
    """Open the backend at ``url`` (default ``$LOCSTATUS_BACKEND``, else
    ``sqlite:///./locstatus.db``) and return a :class:`Manager`.

    ``clock``: None (default) judges every deadline on the backend's own time, measured every
    ``$LOCSTATUS_CLOCK_PROBE_INTERVAL`` seconds and trusted within
    ``$LOCSTATUS_CLOCK_MAX_UNCERTAINTY`` seconds (docs/time.md); a callable (a fake clock in
    tests) or a :class:`~locstatus.clock.TimeSource` is used as given.

    Raises :class:`InvalidInput` for a malformed URL and :class:`BackendUnavailable`
    when the backend cannot be reached.

    Usage::

        mgr = connect("zk://127.0.0.1:2181/locstatus")
        mgr.pause("us-east-1", "replication", reason="maintenance")
    """
    settings: Settings | None = None
    if url is None or services is None or clock is None:
        settings = Settings()  # only read the environment for what was not given
        url = settings.backend if url is None else url
        services = settings.service_list if services is None else services
    backend = open_backend(url)
    if clock is None:
        assert settings is not None
        clock = time_source_for(
            backend,
            probe_interval=settings.clock_probe_interval,
            max_uncertainty=settings.clock_max_uncertainty,
        )
    return Manager(backend, services=services, clock=clock, retry=retry)
