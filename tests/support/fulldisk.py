"""A disk that fills up for real: a small tmpfs mounted for one test, filled and freed at will.

The full-disk tests (``test_backend_faults.py``, the reliability suite) put an SQLite store on
it and fill the rest with a filler file, so SQLite meets ``ENOSPC`` from the kernel, as on a
production disk that filled up, rather than an error simulated in Python.

- ``small_disk`` (fixture): a tmpfs of :data:`SIZE` mounted on the test's own directory and
  unmounted at teardown. Mounting needs root (``CAP_SYS_ADMIN``); where it is impossible the
  fixture skips, naming why. CI runs as root and mounts.
- :meth:`SmallDisk.fill` empties an SQLite write-ahead log first (a ``TRUNCATE`` checkpoint):
  SQLite reuses the blocks of its WAL, so on a full disk the next write would otherwise still
  succeed and the fault bite only later, at some unknown write.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SIZE = "8m"
"""Size of the tmpfs: room for a test's store and its write-ahead log."""


class MountUnavailable(RuntimeError):
    """A tmpfs cannot be mounted here (not root, or no ``CAP_SYS_ADMIN`` in a container)."""


class SmallDisk:
    """A mounted tmpfs at :attr:`path`. ``fill()`` takes every free block, ``free()`` gives
    them back, ``close()`` unmounts (idempotent)."""

    def __init__(self, path: Path, size: str = SIZE) -> None:
        self.path = path
        self.size = size
        self.filler = path / "filler"
        self.mounted = False
        if os.geteuid() != 0:
            raise MountUnavailable("mounting a tmpfs needs root (CAP_SYS_ADMIN)")
        path.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
            capture_output=True, text=True, check=False,
        )
        if proc.returncode != 0:
            raise MountUnavailable(f"mount -t tmpfs failed: {proc.stderr.strip() or proc.returncode}")
        self.mounted = True

    def fill(self, *, sqlite_db: Path | None = None) -> int:
        """Write the filler until the kernel says ``ENOSPC``; returns its size in bytes. With
        ``sqlite_db``, empty that database's write-ahead log first (see the module docstring;
        retried while a writer holds it)."""
        if sqlite_db is not None:
            truncate_wal(sqlite_db)
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        block = b"\0" * 65536
        try:
            while True:
                try:
                    os.write(fd, block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    if len(block) == 1:
                        break
                    block = block[: len(block) // 2]  # the last blocks, down to one byte
        finally:
            os.close(fd)
        return self.filler.stat().st_size

    def free(self) -> None:
        """Remove the filler: the space is back at once (tmpfs)."""
        self.filler.unlink(missing_ok=True)

    def close(self) -> None:
        if not self.mounted:
            return
        proc = subprocess.run(["umount", str(self.path)], capture_output=True, check=False)
        if proc.returncode != 0:  # a file still open (a test's failure left a handle): detach
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)
        self.mounted = False


def truncate_wal(db: Path, timeout: float = 30.0) -> None:
    """Checkpoint the write-ahead log of ``db`` into the database and truncate it to zero
    bytes, retrying while another connection keeps it busy. Writers may append to it again
    right after: each frame beyond its truncated size needs a new block."""
    deadline = time.monotonic() + timeout
    with contextlib.closing(sqlite3.connect(db, timeout=timeout)) as conn:
        while True:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if not busy:  # truncated (writers may have appended to it since)
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the write-ahead log of {db} stayed busy for {timeout:g}s")
            time.sleep(0.01)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """A tmpfs of :data:`SIZE` on ``tmp_path / "disk"``, unmounted at teardown; skips (naming
    why) only where a tmpfs cannot be mounted."""
    try:
        disk = SmallDisk(tmp_path / "disk")
    except MountUnavailable as exc:
        pytest.skip(f"full-disk test needs a tmpfs: {exc}")
    try:
        yield disk
    finally:
        disk.close()
