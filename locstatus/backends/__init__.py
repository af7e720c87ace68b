"""Backends: versioned storage behind one contract (:class:`Backend`, docs/design.md §4).

:func:`open_backend` picks the implementation from the URL scheme, the way httpx picks a
transport. ZooKeeper and MongoDB backends are imported only when used, so their client
libraries stay optional extras (``locstatus[zk]``, ``locstatus[mongo]``).
"""

from __future__ import annotations

import re

from locstatus.backends.base import AckMap, Backend, HintCallback, Unsubscribe
from locstatus.backends.urls import check_url_text, redact_url
from locstatus.errors import InvalidInput

DEFAULT_URL = "sqlite:///./locstatus.db"
_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")

_SCHEMES = {
    "memory": "locstatus.backends.memory:MemoryBackend",
    "sqlite": "locstatus.backends.sqlite:SQLiteBackend",
    "zk": "locstatus.backends.zookeeper:ZooKeeperBackend",
    "mongodb": "locstatus.backends.mongo:MongoBackend",
    "mongodb+srv": "locstatus.backends.mongo:MongoBackend",
}


def open_backend(url: str) -> Backend:
    """Open the backend named by ``url`` (``memory://``, ``sqlite:///path``,
    ``zk://host:port[,host:port]/chroot``, ``mongodb://...``; parameters and their bounds:
    docs/cli.md, docs/zookeeper.md, docs/mongodb.md).

    Raises :class:`InvalidInput` for something that is not a URL string, an unknown scheme, a
    malformed URL or a parameter out of its bounds (naming it),
    :class:`BackendUnavailable` when the backend cannot be reached, and :class:`InvalidInput`
    naming the extra to install when its client library is missing.
    """
    import importlib

    check_url_text(url, "backend", "sqlite:///path/to/file.db", where=redact_url(url))
    match = _SCHEME_RE.match(url)
    scheme = match.group(1).lower() if match else ""
    target = _SCHEMES.get(scheme)
    if target is None:
        raise InvalidInput(
            f"unknown backend URL {url!r}: expected one of "
            "memory://, sqlite:///path, zk://host:port/chroot, mongodb://host:port/"
        )
    module_name, cls_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = "zk" if scheme == "zk" else "mongo"
        raise InvalidInput(
            f"backend {scheme}:// needs an extra: pip install 'locstatus[{extra}]' ({exc})"
        ) from exc
    backend: Backend = getattr(module, cls_name)(url)
    return backend


__all__ = [
    "DEFAULT_URL",
    "AckMap",
    "Backend",
    "HintCallback",
    "Unsubscribe",
    "open_backend",
    "redact_url",
]
