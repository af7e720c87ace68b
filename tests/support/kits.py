"""Backend kits: how the shared test suites reach each backend.

A kit knows how to open any number of clients on one fresh store (one SQLite file, one ZooKeeper
chroot, one Mongo database) and how to damage a record with the backend's own client (for the
corruption tests). Suites take the ``kit`` fixture from ``conftest.py`` and never look at which
backend they run on; a backend joins the suites by adding a kit here.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from locstatus.backends import Backend, open_backend
from locstatus.backends.memory import MemoryBackend
from locstatus.backends.sqlite import SQLiteBackend


@dataclass
class Kit:
    """One fresh store of one backend kind.

    ``url`` opens it from any process; ``open()`` gives a new client (closed at teardown);
    ``write_raw(location, text)`` stores text verbatim as a record's payload, bypassing
    validation, with the backend's own client; ``write_raw_history(location, version, text)``
    replaces the entries of the history write stored under ``version`` with the JSON list
    ``text``, in place, the same way. ``write_raw_worker(worker_id, text)`` stores text as the
    registration of ``worker_id`` (replacing a live worker's, as a stray hand edit would), and
    ``damage_ack(location, worker_id, service)`` makes a stored acknowledgement unreadable in the
    backend's own way (a generation that is no integer, a field left out).
    ``read_raw(location)`` is the stored payload of a record as the backend's own client reads
    it (a JSON object's fields, or a MongoDB document's).
    """

    name: str
    url: str
    write_raw: Callable[[str, str], None]
    write_raw_history: Callable[[str, int, str], None]
    write_raw_worker: Callable[[str, str], None]
    damage_ack: Callable[[str, str, str], None]
    read_raw: Callable[[str], dict[str, Any]] = lambda _location: {}
    _opened: list[Backend] = field(default_factory=list)

    def open(self) -> Backend:
        backend = open_backend(self.url)
        self._opened.append(backend)
        return backend

    def close(self) -> None:
        for b in self._opened:
            with contextlib.suppress(Exception):  # teardown must not mask the test's failure
                b.close()


def memory_kit(tmp_path: Path) -> Kit:
    url = f"memory://{uuid.uuid4().hex}"

    def write_raw(location: str, text: str) -> None:
        MemoryBackend(url).write_raw(location, text)

    def write_raw_history(location: str, version: int, text: str) -> None:
        store = MemoryBackend(url)._store  # the memory backend's own "client"
        with store.lock:
            writes = store.history[location]
            writes[:] = [(v, text if v == version else t) for v, t in writes]

    def write_raw_worker(worker_id: str, text: str) -> None:
        store = MemoryBackend(url)._store
        with store.lock:
            store.workers[worker_id] = text

    def damage_ack(location: str, worker_id: str, service: str) -> None:
        store = MemoryBackend(url)._store
        with store.lock:
            store.acks[location][worker_id][service] = "seven"  # type: ignore[assignment]

    def read_raw(location: str) -> dict[str, Any]:
        store = MemoryBackend(url)._store
        with store.lock:
            return dict(json.loads(store.records[location][1]))

    return Kit("memory", url, write_raw, write_raw_history, write_raw_worker, damage_ack,
               read_raw)


def sqlite_kit(tmp_path: Path) -> Kit:
    url = f"sqlite:///{tmp_path}/locstatus.db"

    def write_raw(location: str, text: str) -> None:
        b = SQLiteBackend(url)
        try:
            b.write_raw(location, text)
        finally:
            b.close()

    def write_raw_history(location: str, version: int, text: str) -> None:
        with contextlib.closing(sqlite3.connect(f"{tmp_path}/locstatus.db")) as db, db:
            db.execute("UPDATE history SET data = ? WHERE location = ? AND version = ?",
                       (text, location, version))

    def write_raw_worker(worker_id: str, text: str) -> None:
        with contextlib.closing(sqlite3.connect(f"{tmp_path}/locstatus.db")) as db, db:
            db.execute("INSERT OR REPLACE INTO workers (worker_id, data) VALUES (?, ?)",
                       (worker_id, text))

    def damage_ack(location: str, worker_id: str, service: str) -> None:
        with contextlib.closing(sqlite3.connect(f"{tmp_path}/locstatus.db")) as db, db:
            cur = db.execute(
                "UPDATE acks SET generation = 'seven' "
                "WHERE location = ? AND worker_id = ? AND service = ?",
                (location, worker_id, service),
            )
            assert cur.rowcount == 1, "no such acknowledgement to damage"

    def read_raw(location: str) -> dict[str, Any]:
        with contextlib.closing(sqlite3.connect(f"{tmp_path}/locstatus.db")) as db:
            (text,) = db.execute("SELECT data FROM locations WHERE location = ?",
                                 (location,)).fetchone()
        return dict(json.loads(text))

    return Kit("sqlite", url, write_raw, write_raw_history, write_raw_worker, damage_ack,
               read_raw)
