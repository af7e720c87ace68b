"""locstatus: coordination-backed pause/resume status per location and service.

The whole public API is re-exported here::

    from locstatus import connect, LocationStatus, State

Beneath it, layers that only look down (README, "Architecture"; import contracts in
``pyproject.toml``): the front ends (:mod:`.cli`, :mod:`.demo`, :mod:`.api`, :mod:`.check`) over
:mod:`.client` over :mod:`.agent` and :mod:`.reconciler` over :mod:`.manager` over :mod:`.fsm`
and :mod:`.backends` over :mod:`.models`, :mod:`.clock`, :mod:`.names` and :mod:`.errors`.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _package_version

from locstatus.backends import Backend, open_backend
from locstatus.client import Client, connect
from locstatus.errors import (
    AlreadyExists,
    AmbiguousCommit,
    BackendFull,
    BackendUnavailable,
    ConflictError,
    CorruptRecord,
    Forbidden,
    HolderPresent,
    InvalidInput,
    InvalidTransition,
    LocstatusError,
    NewerFormat,
    NotFound,
    PreconditionFailed,
    SettleTimeout,
    StandingRegistered,
    Unauthorized,
    VersionConflict,
)
from locstatus.manager import (
    BulkInterrupted,
    BulkItem,
    BulkReport,
    Listing,
    Manager,
    Operation,
    Outcome,
    RetryPolicy,
    SyncReport,
)
from locstatus.models import (
    Hint,
    HistoryEntry,
    LocationStatus,
    ServiceStatus,
    State,
    WorkerInfo,
)
from locstatus.names import DEFAULT_SERVICES


def _version() -> str:
    try:
        return _package_version("locstatus")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


__version__ = _version()
"""The installed package's version (its metadata, from ``pyproject.toml``): the one place
``locstatus --version``, ``/healthz`` and the OpenAPI document read it from (docs/versioning.md)."""

__all__ = [
    "DEFAULT_SERVICES",
    "AlreadyExists",
    "AmbiguousCommit",
    "Backend",
    "BackendFull",
    "BackendUnavailable",
    "BulkInterrupted",
    "BulkItem",
    "BulkReport",
    "Client",
    "ConflictError",
    "CorruptRecord",
    "Forbidden",
    "Hint",
    "HistoryEntry",
    "HolderPresent",
    "InvalidInput",
    "InvalidTransition",
    "Listing",
    "LocationStatus",
    "LocstatusError",
    "Manager",
    "NewerFormat",
    "NotFound",
    "Operation",
    "Outcome",
    "PreconditionFailed",
    "RetryPolicy",
    "ServiceStatus",
    "SettleTimeout",
    "StandingRegistered",
    "State",
    "SyncReport",
    "Unauthorized",
    "VersionConflict",
    "WorkerInfo",
    "__version__",
    "connect",
    "open_backend",
]
