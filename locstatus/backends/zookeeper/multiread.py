"""ZooKeeper's ``multiRead`` (opcode 22, ZooKeeper 3.6 and later) as a kazoo request: many
``getData`` in one request, each node answered on its own (its data and stat, or its own error,
a missing node its ``NoNodeError``), which kazoo 2.11 has no client for.

Why it is shaped so: a bulk read of 100 000 records was one kazoo ``get_async`` each, about
100 us of kazoo's Python per request (its queue, its socket wake-up, its reply bookkeeping),
most of a bulk pause's client CPU (docs/benchmarks.md, "Bulk operations"). The server has
answered many reads per request since 3.6 (Java's ``ZooKeeper.multi`` of ``Op.getData``,
``MultiOperationRecord`` in, ``MultiResponse`` out), and unlike a multi-op of writes a
multiRead is not all-or-nothing: each read is the same as its own ``getData``, at the moment the
server handles the request.

:class:`MultiRead` speaks kazoo's own request protocol (what its ``Transaction`` is: a ``type``,
``serialize()``, ``deserialize(bytes, offset)``), so it goes through kazoo's connection like any
request (``KazooClient._call``: the one private name used, the one its transactions use):
ordered with the session's other requests, answered or lost with them. On the wire, as
``MultiOperationRecord`` writes it: per node a ``MultiHeader(type=getData, done=false, err=-1)``
and a ``GetDataRequest(path, watch=false)``, then ``MultiHeader(-1, true, -1)``; the answer per
node a ``MultiHeader`` and a ``GetDataResponse(data, stat)``, or ``type=-1`` and an
``ErrorResponse(err)``, until a header with ``done``.

A server older than 3.6 does not know the opcode: it answers ``UNIMPLEMENTED`` (kazoo's
:class:`~kazoo.exceptions.UnimplementedError`) and closes the connection (the session lives
on); :meth:`~locstatus.backends.zookeeper.client.ZkClient.get_many` then reads node by node.

:func:`requests` splits a list of paths into requests of at most :data:`PER_REQUEST` nodes and
at most a byte bound (a server drops the connection on a request above its ``jute.maxbuffer``
instead of answering). Usage::

    async_result = kazoo.handler.async_result()
    kazoo._call(MultiRead(["/a", "/b"]), async_result)
    [(data, stat), NoNodeError()] = async_result.get(timeout=10)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

from kazoo.exceptions import EXCEPTIONS, KazooException
from kazoo.protocol.serialization import GetData, int_struct, multiheader_struct, stat_struct
from kazoo.protocol.states import ZnodeStat

OPCODE = 22
"""``ZooDefs.OpCode.multiRead`` (ZooKeeper 3.6+)."""
PER_REQUEST = 200
"""Nodes per multiRead request (docs/benchmarks.md, "Bulk operations": how it was chosen)."""

_GET = GetData.type
_ERROR = -1
_OP_HEAD = multiheader_struct.pack(_GET, False, -1)
_END = multiheader_struct.pack(-1, True, -1)
_OVERHEAD: int = len(_END) + 8
"""Bytes of a request besides its nodes: the end header, the xid and the opcode."""
_HEAD: int = multiheader_struct.size
_STAT: int = stat_struct.size
_INT: int = int_struct.size
_unpack_head = multiheader_struct.unpack_from
_unpack_int = int_struct.unpack_from
_pack_int = int_struct.pack
_unpack_stat = stat_struct.unpack_from
_make_stat = ZnodeStat._make

Answer: TypeAlias = tuple[bytes, ZnodeStat] | KazooException
"""One node's answer: its data and stat, as ``get`` returns them, or its own error."""


def node_bytes(path: str) -> int:
    """What one node adds to a request: its header, the path's length and UTF-8, the watch flag."""
    return _HEAD + _INT + len(path.encode()) + 1


class MultiRead:
    """One multiRead request of ``paths`` (absolute, chroot included), for kazoo's connection:
    its answer is one :data:`Answer` per path, in order."""

    type = OPCODE
    __slots__ = ("paths",)

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = paths

    def __repr__(self) -> str:
        return f"MultiRead({len(self.paths)} nodes: {self.paths[0]!r}...)" if self.paths else (
            "MultiRead()"
        )

    def serialize(self) -> bytes:
        parts: list[bytes] = []
        for path in self.paths:
            raw = path.encode()
            parts += (_OP_HEAD, _pack_int(len(raw)), raw, b"\0")
        parts.append(_END)
        return b"".join(parts)

    @classmethod
    def deserialize(cls, buf: bytes, offset: int) -> list[Answer]:
        """The answers in ``buf`` from ``offset`` (kazoo's reply body). Raises ValueError for a
        type of answer a multiRead of reads cannot carry."""
        out: list[Answer] = []
        append = out.append
        while True:
            kind, done, _err = _unpack_head(buf, offset)
            offset += _HEAD
            if done:
                return out
            if kind == _GET:
                size = _unpack_int(buf, offset)[0]
                offset += _INT
                if size < 0:
                    data: Any = None  # a node holding null, as kazoo's get gives it
                else:
                    data = buf[offset : offset + size]
                    offset += size
                append((data, _make_stat(_unpack_stat(buf, offset))))
                offset += _STAT
            elif kind == _ERROR:
                code = _unpack_int(buf, offset)[0]
                offset += _INT
                append(EXCEPTIONS[code]())
            else:
                raise ValueError(f"multiRead answer of type {kind}")


def requests(paths: Sequence[str], max_bytes: int) -> list[Sequence[str]]:
    """``paths`` cut into runs of at most :data:`PER_REQUEST` nodes whose request stays within
    ``max_bytes`` (a path alone above it still goes alone: the server refuses it as it would
    refuse its ``get``)."""
    out: list[Sequence[str]] = []
    longest = 4 * max((len(p) for p in paths), default=0)  # UTF-8: at most 4 bytes a char
    if PER_REQUEST * (_HEAD + _INT + 1 + longest) + _OVERHEAD <= max_bytes:
        # the common case: no run of PER_REQUEST can reach the bound, cut by count alone
        return [paths[i : i + PER_REQUEST] for i in range(0, len(paths), PER_REQUEST)]
    start, used = 0, _OVERHEAD
    for i, path in enumerate(paths):
        size = node_bytes(path)
        if i > start and (used + size > max_bytes or i - start >= PER_REQUEST):
            out.append(paths[start:i])
            start, used = i, _OVERHEAD
        used += size
    if start < len(paths):
        out.append(paths[start:])
    return out
