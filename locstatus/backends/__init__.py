"""Backends: versioned storage behind one contract (:class:`Backend`, SPEC §4).

:func:`open_backend` picks the implementation from the URL scheme, the way httpx picks a
transport. ZooKeeper and MongoDB backends are imported only when used, so their client
libraries stay optional extras (``locstatus[zk]``, ``locstatus[mongo]``).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from locstatus.backends.base import AckMap, Backend, HintCallback, Unsubscribe
from locstatus.errors import InvalidInput

DEFAULT_URL = "sqlite:///./locstatus.db"

_SCHEMES = {
    "memory": "locstatus.backends.memory:MemoryBackend",
    "sqlite": "locstatus.backends.sqlite:SQLiteBackend",
    "zk": "locstatus.backends.zookeeper:ZooKeeperBackend",
    "mongodb": "locstatus.backends.mongo:MongoBackend",
    "mongodb+srv": "locstatus.backends.mongo:MongoBackend",
}


def open_backend(url: str) -> Backend:
    """Open the backend named by ``url`` (``memory://``, ``sqlite:///path``,
    ``zk://host:port[,host:port]/chroot``, ``mongodb://...``).

    Raises :class:`InvalidInput` for an unknown scheme or malformed URL,
    :class:`BackendUnavailable` when the backend cannot be reached, and :class:`InvalidInput`
    naming the extra to install when its client library is missing.
    """
    import importlib

    scheme = urlsplit(url).scheme
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


__all__ = ["DEFAULT_URL", "AckMap", "Backend", "HintCallback", "Unsubscribe", "open_backend"]
