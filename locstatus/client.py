"""``connect(url)``: the entry point of the library (SPEC §5.1)."""

from __future__ import annotations

from collections.abc import Iterable

from locstatus.backends import open_backend
from locstatus.clock import Clock
from locstatus.manager import Manager, RetryPolicy
from locstatus.models import utcnow
from locstatus.settings import Settings


def connect(
    url: str | None = None,
    *,
    services: Iterable[str] | None = None,
    clock: Clock = utcnow,
    retry: RetryPolicy | None = None,
) -> Manager:
    """Open the backend at ``url`` (default ``$LOCSTATUS_BACKEND``, else
    ``sqlite:///./locstatus.db``) and return a :class:`Manager`.

    Raises :class:`InvalidInput` for a malformed URL and :class:`BackendUnavailable` when the
    backend cannot be reached.

    Usage::

        mgr = connect("zk://127.0.0.1:2181/locstatus")
        mgr.pause("us-east-1", "replication", reason="maintenance")
    """
    if url is None or services is None:
        settings = Settings()  # only read the environment for what was not given
        url = settings.backend if url is None else url
        services = settings.service_list if services is None else services
    return Manager(open_backend(url), services=services, clock=clock, retry=retry)
