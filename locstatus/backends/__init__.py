"""Backends: versioned storage behind one contract (:class:`Backend`, docs/design.md §4).

:func:`open_backend` picks the implementation from the URL scheme, the way httpx picks a
transport. ZooKeeper and MongoDB backends are imported only when used, so their client
libraries stay optional extras (``locstatus[zk]``, ``locstatus[mongo]``).

What lives here, from the bottom up: the contract (``base``), the stored forms (``codec``), and
what every backend shares, written once: URLs and their redaction (``urls``), the version
scheme across a record's lives (``versions``), history pages (``history``), hint fan-out
(``hints``). Above them the backends, which never import one another: ``memory``, ``sqlite``,
and the packages ``zookeeper`` and ``mongo``. Front ends ask a backend what they need to know
about it (:attr:`Backend.local_reads`, :func:`missing_store`), never its URL scheme.
"""

from __future__ import annotations

import re
from typing import Protocol

from locstatus.backends.base import AckItem, AckMap, Backend, HintCallback, Unsubscribe
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


CONNECT_TIMEOUT_OPTIONS = {
    "zk": ("timeout", 1.0),
    "mongodb": ("serverSelectionTimeoutMS", 1000.0),
    "mongodb+srv": ("serverSelectionTimeoutMS", 1000.0),
}
"""Per scheme: the URL parameter that bounds connecting, and its unit in seconds."""


def with_connect_timeout(url: str, seconds: float) -> str:
    """``url`` with its backend's connect bound set to ``seconds`` (ZooKeeper ``timeout``,
    MongoDB ``serverSelectionTimeoutMS``) unless the URL already sets it; embedded backends
    (SQLite, memory) have nothing to connect to and are returned unchanged. Raises
    :class:`InvalidInput` unless ``0 < seconds <= 3600`` (docs/cli.md, "Global options")."""
    if not 0 < seconds <= 3600:
        raise InvalidInput(
            f"invalid connect timeout {seconds!r}: expected seconds, more than 0 and at most 3600"
        )
    match = _SCHEME_RE.match(url)
    option = CONNECT_TIMEOUT_OPTIONS.get(match.group(1).lower() if match else "")
    if option is None:
        return url
    name, unit = option
    base, _, fragment = url.partition("#")
    query = base.partition("?")[2]
    if any(p.split("=", 1)[0].lower() == name.lower() for p in query.split("&") if p):
        return url
    value = f"{seconds / unit:g}" if unit == 1.0 else str(max(1, round(seconds * 1000)))
    sep = "&" if query else ("" if base.endswith("?") else "?")
    return f"{base}{sep}{name}={value}" + (f"#{fragment}" if fragment else "")


def open_backend(url: str, *, connect_timeout: float | None = None) -> Backend:
    """Open the backend named by ``url`` (``memory://``, ``sqlite:///path``,
    ``zk://host:port[,host:port]/chroot``, ``mongodb://...``; parameters and their bounds:
    docs/cli.md, docs/zookeeper.md, docs/mongodb.md). ``connect_timeout`` (seconds): give up
    connecting after it unless the URL sets its own bound (:func:`with_connect_timeout`).

    Raises :class:`InvalidInput` for something that is not a URL string, an unknown scheme, a
    malformed URL or a parameter out of its bounds (naming it),
    :class:`BackendUnavailable` when the backend cannot be reached, and :class:`InvalidInput`
    naming the extra to install when its client library is missing.
    """
    cls = _backend_class(url)
    if connect_timeout is not None:
        url = with_connect_timeout(url, connect_timeout)
    backend: Backend = cls(url)
    return backend


def missing_store(url: str) -> str | None:
    """Where the store ``url`` names should be and is not, when opening it would create it
    empty (a SQLite file that does not exist: its absolute path); None when it exists or the
    backend keeps no such store (:meth:`Backend.missing_store`). A front end refuses to open a
    missing store unless asked to create one. Raises :class:`InvalidInput` as
    :func:`open_backend` does for a bad URL (nothing is opened)."""
    return _backend_class(url).missing_store(url)


class _BackendClass(Protocol):
    """A :class:`Backend` implementation as :func:`open_backend` uses it: opened by its URL."""

    def __call__(self, url: str) -> Backend: ...

    def missing_store(self, url: str) -> str | None: ...


def _backend_class(url: str) -> _BackendClass:
    """The :class:`Backend` implementation of ``url``'s scheme, imported. Raises
    :class:`InvalidInput` for something that is not a URL string, an unknown scheme, and
    naming the extra to install when the backend's client library is missing."""
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
    cls: _BackendClass = getattr(module, cls_name)
    return cls


__all__ = [
    "DEFAULT_URL",
    "AckItem",
    "AckMap",
    "Backend",
    "HintCallback",
    "Unsubscribe",
    "missing_store",
    "open_backend",
    "redact_url",
    "with_connect_timeout",
]
