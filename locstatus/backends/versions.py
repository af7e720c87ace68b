"""Record versions across lives: how every backend numbers the writes of a record so that a
record deleted and created again never matches a version of its earlier life (contract
invariant 1).

A version is ``life << shift | seq``: ``life`` counts the creations of the record (0 for the
first), ``seq`` its writes within that life (1 for the create, then ``expected + 1`` for every
compare-and-set). The first life therefore counts 1, 2, 3 ... and every later life starts above
every version of the earlier ones, as long as one life stays below ``2**shift`` writes.

SQLite, MongoDB and the memory backend use :data:`LIVES` (``shift`` 20: a million writes per
life, the number SQLite's scan reads from a version's low bits); ZooKeeper uses 32 bits (its
``seq`` is the record znode's own version + 1, a 32-bit counter; see
``locstatus.backends.zookeeper.layout``).

Usage::

    LIVES.first(life=2)            # 2 << 20 | 1: the create of the third life
    LIVES.split(LIVES.first(2))    # (2, 1)
    LIVES.writes_since_create(v)   # 0 for a record never written since its create
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VersionScheme:
    """Versions ``life << shift | seq`` (see the module docstring)."""

    shift: int

    @property
    def seq_mask(self) -> int:
        """The bits of ``seq``: ``version & seq_mask`` is the write's number in its life."""
        return (1 << self.shift) - 1

    def join(self, life: int, seq: int) -> int:
        """The version of write ``seq`` (1-based) of life ``life`` (0-based)."""
        return life << self.shift | seq

    def split(self, version: int) -> tuple[int, int]:
        """``(life, seq)`` of ``version``."""
        return version >> self.shift, version & self.seq_mask

    def first(self, life: int) -> int:
        """The version a record's create stores in life ``life`` (0-based)."""
        return self.join(life, 1)

    def writes_since_create(self, version: int) -> int:
        """How many writes followed the create of ``version``'s life up to it."""
        return (version & self.seq_mask) - 1


LIVES = VersionScheme(shift=20)
"""The scheme of SQLite, MongoDB and memory: versions within one life stay below ``2**20``."""
