"""``zk://[user:pass@]host:port[,host:port...]/chroot``: ZooKeeper through kazoo (docs/design.md
§4, docs/zookeeper.md).

The package follows kazoo's own line between protocol and client, bottom up:

- ``url``: the ``zk://`` URL and its parameters (:func:`parse_zk_url`);
- ``layout``: the znode layout under the chroot, what each node holds, and how znode versions
  become locstatus versions (:class:`Layout`, :func:`split_version`);
- ``txn``: the labelled transaction, whose refusal names the operation that failed;
- ``multiread``: ZooKeeper's multiRead as a kazoo request (many nodes read per request);
- ``client``: the kazoo session and its one error edge (bounded retries, "outcome unknown"
  kept apart from "refused", credentials, request size);
- ``session``: the watcher's state machine, pure (connection changes, watches, resync), as
  steps a test can drive;
- ``freshness``: the copy of the worker list, served only as fresh as the records;
- ``records``, ``workers``, ``watcher``: the records and history, the registrations and
  acknowledgements, the watcher thread that performs the machine's steps;
- ``backend``: :class:`ZooKeeperBackend`, thin, over all of them.

URL query parameters: ``timeout`` (seconds to connect, and to wait for an answer before
:class:`~locstatus.errors.BackendUnavailable`; default 10; a connection known down fails a call
after :data:`~locstatus.backends.base.DOWN_GRACE` instead), ``session_timeout`` (seconds;
default 10), ``world_read`` (true|false, with credentials; default true), ``max_bytes``.
"""

from __future__ import annotations

from locstatus.backends.zookeeper.backend import ZooKeeperBackend
from locstatus.backends.zookeeper.layout import BUCKET, Layout, join_version, split_version
from locstatus.backends.zookeeper.url import DEFAULT_CHROOT, ZkParams, parse_zk_url

__all__ = [
    "BUCKET",
    "DEFAULT_CHROOT",
    "Layout",
    "ZkParams",
    "ZooKeeperBackend",
    "join_version",
    "parse_zk_url",
    "split_version",
]
