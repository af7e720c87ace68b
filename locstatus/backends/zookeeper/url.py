"""The ``zk://`` URL: hosts, chroot, credentials and the backend's parameters, checked before
anything connects (docs/zookeeper.md).

Why it is shaped so: the chroot becomes the prefix of every znode path, so each of its segments
follows the location-name rules (no ``.``/``..``, nothing under ``/zookeeper``); credentials come
from the URL's userinfo or ``LOCSTATUS_ZK_AUTH``; every number is declared once with its bounds
(:class:`~locstatus.backends.urls.Number`). Errors show the URL without its password.

Usage::

    params = parse_zk_url("zk://ops:secret@zk1:2181,zk2:2181/locstatus?timeout=5")
    params.hosts, params.chroot, params.auth    # "zk1:2181,zk2:2181", "/locstatus", ("ops", ...)
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import unquote

from locstatus.backends.urls import Number, query_params, redact_url, split_url
from locstatus.errors import InvalidInput

DEFAULT_CHROOT = "/locstatus"
DEFAULT_PORT = 2181
DEFAULT_MAX_BYTES = 1_000_000
"""Largest write sent to ZooKeeper: ``jute.maxbuffer`` is 1 048 575 bytes for the whole request."""
AUTH_ENV = "LOCSTATUS_ZK_AUTH"
"""Digest credentials ``user:password`` when the URL carries none."""

TIMEOUT = Number("timeout", 10.0, 0, 3600, low_open=True)
"""Seconds to connect, and to wait for an answer (a connection known down is not waited for
longer than :data:`~locstatus.backends.base.DOWN_GRACE`)."""
SESSION_TIMEOUT = Number("session_timeout", 10.0, 0.4, 3600)
"""ZooKeeper session timeout, in seconds (the server bounds it further)."""
MAX_BYTES = Number("max_bytes", DEFAULT_MAX_BYTES, 1024, 1_048_000, unit="bytes", integer=True)
"""Largest record + history write sent (``jute.maxbuffer`` is 1 MB per request)."""
_URL_PARAMS = frozenset({"timeout", "session_timeout", "world_read", "max_bytes"})
_SEGMENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_HOST_RE = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(\d{1,5}))?")


@dataclass(frozen=True)
class ZkParams:
    """A parsed ``zk://`` URL. ``hosts`` is kazoo's ``host:port,host:port`` string; ``chroot`` an
    absolute znode path; ``auth`` digest credentials or None; times in seconds."""

    hosts: str
    chroot: str
    auth: tuple[str, str] | None = None
    timeout: float = 10.0
    session_timeout: float = 10.0
    world_read: bool = True
    max_bytes: int = DEFAULT_MAX_BYTES


def parse_zk_url(url: str) -> ZkParams:
    """Parse ``zk://[user:pass@]host[:port][,host[:port]...][/chroot][?timeout=&session_timeout=
    &world_read=&max_bytes=]``. The chroot defaults to ``/locstatus``; each of its segments
    follows the location-name rules (no ``.``/``..``, nothing under ``/zookeeper``).

    Raises :class:`InvalidInput` naming the bad part.
    """
    where = redact_url(url)
    parts = split_url(url, "ZooKeeper", "zk://host:port/chroot", where=where, port=DEFAULT_PORT)
    if parts.scheme != "zk":
        raise InvalidInput(f"invalid ZooKeeper URL {where!r}: expected zk://host:port/chroot")
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    hosts: list[str] = []
    for item in hostlist.split(","):
        m = _HOST_RE.fullmatch(item.strip())
        if not m or (m.group(2) is not None and not 0 < int(m.group(2)) < 65536):
            raise InvalidInput(f"invalid ZooKeeper URL {where!r}: bad host {item!r}")
        hosts.append(f"{m.group(1)}:{m.group(2) or DEFAULT_PORT}")
    auth: tuple[str, str] | None = None
    if userinfo:
        user, sep, password = userinfo.partition(":")
        if not user or not sep:
            raise InvalidInput(f"invalid ZooKeeper URL {where!r}: expected user:password@")
        auth = (unquote(user), unquote(password))
    elif env := os.environ.get(AUTH_ENV):
        user, sep, password = env.partition(":")
        if not user or not sep:
            raise InvalidInput(f"invalid {AUTH_ENV}: expected user:password")
        auth = (user, password)
    chroot = parts.path.rstrip("/") or DEFAULT_CHROOT
    segments = chroot.split("/")[1:]
    for seg in segments:
        if not _SEGMENT_RE.fullmatch(seg) or seg in (".", ".."):
            raise InvalidInput(
                f"invalid ZooKeeper chroot {chroot!r} in {where!r}: segment {seg!r} must be "
                "1-128 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit"
            )
    if segments[0] == "zookeeper":
        raise InvalidInput(f"invalid ZooKeeper chroot {chroot!r}: /zookeeper is reserved")
    params = query_params(parts.query, known=_URL_PARAMS, kind="ZooKeeper", where=where)
    timeout = TIMEOUT.parse(params.get("timeout"), "ZooKeeper", where)
    session_timeout = SESSION_TIMEOUT.parse(params.get("session_timeout"), "ZooKeeper", where)
    max_bytes = int(MAX_BYTES.parse(params.get("max_bytes"), "ZooKeeper", where))
    world = params.get("world_read", "true").lower()
    if world not in ("true", "false", "1", "0", "yes", "no"):
        raise InvalidInput(f"invalid world_read={world!r}: true|false")
    return ZkParams(
        hosts=",".join(hosts),
        chroot=chroot,
        auth=auth,
        timeout=timeout,
        session_timeout=session_timeout,
        world_read=world in ("true", "1", "yes"),
        max_bytes=max_bytes,
    )
