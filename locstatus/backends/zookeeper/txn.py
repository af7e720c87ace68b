"""The labelled transaction: a ZooKeeper multi-op whose operations carry a label, so that the
one that refused the transaction can be named and turned into exactly one domain error.

Why it is shaped so: kazoo's ``transaction().commit()`` does not raise for a refused multi-op,
it returns one result per operation, the failing one an exception and the others
``RolledBackError`` (or ``RuntimeInconsistency``). Every write of this backend is one multi-op
(docs/zookeeper.md), so every write asks the same question: which of my operations failed,
and what does that mean? A :class:`Transaction` records a label with each operation
(``"incarnation"``, ``"location"``, ``"history"``, ``"acks"`` ...) and :func:`refusal` returns
the label and error of the operation that failed. The caller then matches on it, one case per
label and error, each naming one domain error::

    match client.commit("compare-and-set of us-east-1", txn):
        case None:
            ...                                              # applied
        case Refusal("location", NoNodeError()):
            raise NotFound(...)
        case Refusal("location", BadVersionError()):
            raise VersionConflict(...)

The operations are encoded as they are added, in ZooKeeper's own ``MultiOperationRecord``
form (the bytes kazoo's ``Transaction.serialize`` writes for the same operations), and sent
through kazoo's connection as kazoo's own transactions are (:class:`MultiOp`): kazoo builds a
named tuple per operation, normalises its path and serializes it piece by piece on its
connection thread, about five times the client CPU of this for a bulk write's three operations
per location (docs/benchmarks.md, "Bulk operations").

A commit has three outcomes, kept apart (``ZkClient.commit``): applied (None), **refused**
(a :class:`Refusal`: nothing was applied, the server said why), and **outcome unknown** (the
connection was lost after sending: :class:`~locstatus.errors.AmbiguousCommit`, raised, never a
refusal). A request that was never sent is :class:`~locstatus.errors.BackendUnavailable`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from kazoo.client import KazooClient
from kazoo.exceptions import RolledBackError, RuntimeInconsistency
from kazoo.protocol.paths import _prefix_root
from kazoo.protocol.serialization import (
    CheckVersion,
    Create,
    Delete,
    SetData,
    int_struct,
    multiheader_struct,
)
from kazoo.protocol.serialization import Transaction as KazooTransaction
from kazoo.security import OPEN_ACL_UNSAFE

_int: Callable[[int], bytes] = int_struct.pack
_CHECK: bytes = multiheader_struct.pack(CheckVersion.type, False, -1)
_SET: bytes = multiheader_struct.pack(SetData.type, False, -1)
_CREATE: bytes = multiheader_struct.pack(Create.type, False, -1)
_DELETE: bytes = multiheader_struct.pack(Delete.type, False, -1)
_END: bytes = multiheader_struct.pack(-1, True, -1)


class Refusal(NamedTuple):
    """Why a transaction was refused: the label of the operation that failed and its error
    (``"transaction"`` when the server refused the request as a whole)."""

    label: str
    error: Exception
    at: int = -1
    """The index of the failed operation in the transaction (-1: none named)."""


class Transaction:
    """A ZooKeeper multi-op whose operations carry a label (see the module docstring); sent
    with ``txn.tx.commit_async()`` (:class:`MultiOp`), answered as kazoo answers its own."""

    def __init__(self, client: KazooClient) -> None:
        self.tx = MultiOp(client)
        self.labels: list[str] = []

    def check(self, label: str, path: str, version: int) -> None:
        self.tx.add(_CHECK, self.tx.path(path), _int(version))
        self.labels.append(label)

    def set_data(self, label: str, path: str, data: bytes, version: int = -1) -> None:
        self.tx.add(_SET, self.tx.path(path), _int(len(data)), data, _int(version))
        self.labels.append(label)

    def create(self, label: str, path: str, data: bytes = b"", *, ephemeral: bool = False) -> None:
        tx = self.tx
        tx.add(_CREATE, tx.path(path), _int(len(data)), data, tx.acl, _int(1 if ephemeral else 0))
        self.labels.append(label)

    def delete(self, label: str, path: str, version: int = -1) -> None:
        self.tx.add(_DELETE, self.tx.path(path), _int(version))
        self.labels.append(label)

    @property
    def size(self) -> int:
        """Bytes of the request so far (what the server measures against its
        ``jute.maxbuffer``), its opcode and end included."""
        return self.tx.size + len(_END) + 8

    def mark(self) -> tuple[int, int, int]:
        """Where the operations end now, for :meth:`undo`."""
        return len(self.tx.parts), len(self.labels), self.tx.size

    def undo(self, mark: tuple[int, int, int]) -> None:
        """Take out the operations added since ``mark`` (a batch moving a location whose
        operations would make the request too large to the next one)."""
        parts, labels, self.tx.size = mark
        del self.tx.parts[parts:]
        del self.labels[labels:]


class MultiOp:
    """The operations of one multi-op, encoded, and its sending: what kazoo's
    ``TransactionRequest`` is, without its per-operation named tuples (same bytes on the wire,
    same answer). Paths are taken as the layout builds them (absolute and normalised: names
    checked); a kazoo chroot, if any, is prefixed as kazoo does."""

    def __init__(self, client: KazooClient) -> None:
        self.client = client
        self.parts: list[bytes] = []
        self.size = 0
        """Bytes of ``parts``."""
        self.committed = False
        self.root: str = client.chroot or ""
        acl = client.default_acl or OPEN_ACL_UNSAFE
        self.acl = b"".join([_int(len(acl))] + [
            _int(a.perms) + _string(a.id.scheme) + _string(a.id.id) for a in acl
        ])
        """The ACL of every create: the client's default ACL, as kazoo's create gives it."""

    def path(self, path: str) -> bytes:
        return _string(str(_prefix_root(self.root, path)) if self.root else path)

    def add(self, *parts: bytes) -> None:
        self.parts += parts
        self.size += sum(map(len, parts))

    def commit_async(self) -> Any:
        """Send the multi-op (once); its kazoo async result: one result per operation, as
        kazoo's ``TransactionRequest.commit_async`` gives them."""
        if self.committed:
            raise ValueError("Transaction already committed")
        self.committed = True
        result = self.client.handler.async_result()
        self.client._call(_Request(self.parts), result)
        return result


def _string(text: str) -> bytes:
    """A jute string as kazoo writes it (-1 for an empty one)."""
    raw = text.encode()
    return _int(len(raw)) + raw if raw else _int(-1)


class _Request:
    """The multi-op request for kazoo's connection: its opcode, bytes, and kazoo's own parsing
    of the answer (kazoo's connection also unchroots it by that opcode)."""

    type = KazooTransaction.type
    deserialize = KazooTransaction.deserialize
    __slots__ = ("parts",)

    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts

    def __repr__(self) -> str:
        return f"MultiOp({len(self.parts)} parts)"

    def serialize(self) -> bytes:
        return b"".join(self.parts) + _END


def refusal(results: Sequence[object], labels: Sequence[str]) -> Refusal | None:
    """The :class:`Refusal` of a committed transaction's ``results``, or None when it applied:
    the first operation whose result is a real error (not "rolled back"); when every result says
    "rolled back", that one, labelled ``"transaction"``."""
    for at, (label, result) in enumerate(zip(labels, results, strict=False)):
        if isinstance(result, (RolledBackError, RuntimeInconsistency)):
            continue
        if isinstance(result, Exception):
            return Refusal(label, result, at)
    for result in results:  # every result says "rolled back": report that one
        if isinstance(result, Exception):
            return Refusal("transaction", result)
    return None
