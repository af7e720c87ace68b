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

A commit has three outcomes, kept apart (``ZkClient.commit``): applied (None), **refused**
(a :class:`Refusal`: nothing was applied, the server said why), and **outcome unknown** (the
connection was lost after sending: :class:`~locstatus.errors.AmbiguousCommit`, raised, never a
refusal). A request that was never sent is :class:`~locstatus.errors.BackendUnavailable`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from kazoo.client import KazooClient
from kazoo.exceptions import RolledBackError, RuntimeInconsistency


class Refusal(NamedTuple):
    """Why a transaction was refused: the label of the operation that failed and its error
    (``"transaction"`` when the server refused the request as a whole)."""

    label: str
    error: Exception
    at: int = -1
    """The index of the failed operation in the transaction (-1: none named)."""


class Transaction:
    """A kazoo transaction whose operations carry a label (see the module docstring)."""

    def __init__(self, client: KazooClient) -> None:
        self.tx = client.transaction()
        self.labels: list[str] = []

    def check(self, label: str, path: str, version: int) -> None:
        self.tx.check(path, version)
        self.labels.append(label)

    def set_data(self, label: str, path: str, data: bytes, version: int = -1) -> None:
        self.tx.set_data(path, data, version)
        self.labels.append(label)

    def create(self, label: str, path: str, data: bytes = b"", *, ephemeral: bool = False) -> None:
        self.tx.create(path, data, ephemeral=ephemeral)
        self.labels.append(label)

    def delete(self, label: str, path: str, version: int = -1) -> None:
        self.tx.delete(path, version)
        self.labels.append(label)


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
