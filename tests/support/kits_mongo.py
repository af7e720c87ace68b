"""The MongoDB kit: how the shared suites reach the ``mongodb://`` backend over the wire.

``mongo_server`` is one server for the whole session, from ``servers.start_mongo``: a real
``mongod`` when ``LOCSTATUS_TEST_MONGO_URI`` is set, testcontainers' ``MongoDbContainer`` when a
Docker engine answers, else SecantusDB (``secantusd-py``, a MongoDB-wire server from PyPI)
started on 127.0.0.1 and stopped by PID. Each kit is a fresh database on it (dropped at
teardown), so tests never see each other's records. ``write_raw`` damages a record with a raw
pymongo client, the way an operator's stray ``mongosh`` edit would.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from support.kits import Kit
from support.servers import MongoHandle, start_mongo

COLLECTION = "locations"


def kit_url(server: MongoHandle, database: str, **options: str) -> str:
    """The backend URL for ``database`` on ``server`` (plus extra URL options)."""
    sep = "&" if "?" in server.uri else "?"
    extra = "".join(f"&{k}={v}" for k, v in options.items())
    return f"{server.uri}{sep}database={database}&collection={COLLECTION}{extra}"


def fresh_database() -> str:
    return f"lstest_{uuid.uuid4().hex[:16]}"


def drop_database(server: MongoHandle, database: str) -> None:
    """Drop ``database`` on ``server`` (a test's own, at its teardown)."""
    client = server.client()
    try:
        client.drop_database(database)
    finally:
        client.close()


def write_raw_document(server: MongoHandle, database: str, location: str, text: str) -> None:
    """Store ``text`` verbatim as the payload of ``location``: a JSON object's fields become
    the document's fields; anything else (bad JSON, a list) is kept in a ``raw`` field."""
    try:
        data: Any = json.loads(text)
    except ValueError:
        data = text
    client = server.client()
    try:
        coll = client[database][COLLECTION]
        current = coll.find_one({"_id": location}, {"version": 1})
        version = int(current["version"]) + 1 if current else 1
        fields = data if isinstance(data, dict) else {"raw": data}
        coll.replace_one({"_id": location}, {**fields, "version": version}, upsert=True)
    finally:
        client.close()


@dataclass
class MongoKit(Kit):
    """A :class:`Kit` on its own database, dropped at teardown."""

    server: MongoHandle | None = None
    database: str = ""

    def close(self) -> None:
        super().close()
        if self.server is not None and self.server.running:
            with contextlib.suppress(Exception):
                client = self.server.client(serverSelectionTimeoutMS=2000)
                try:
                    client.drop_database(self.database)
                finally:
                    client.close()


def mongo_kit(server: MongoHandle) -> Kit:
    """A kit on a fresh database of ``server``."""
    database = fresh_database()

    def write_raw(location: str, text: str) -> None:
        write_raw_document(server, database, location, text)

    def write_raw_history(location: str, version: int, text: str) -> None:
        entries = json.loads(text)
        client = server.client()
        try:
            db = client[database]
            db[f"{COLLECTION}_history"].update_one(
                {"location": location, "version": version}, {"$set": {"entries": entries}})
            doc = db[COLLECTION].find_one({"_id": location}, {"recent_history": 1}) or {}
            recent = [
                {**w, "entries": entries} if w.get("version") == version else w
                for w in doc.get("recent_history", [])
            ]
            db[COLLECTION].update_one({"_id": location}, {"$set": {"recent_history": recent}})
        finally:
            client.close()

    def write_raw_worker(worker_id: str, text: str) -> None:
        try:
            info: Any = json.loads(text)
        except (ValueError, RecursionError):  # kept as a string, as a stray edit could
            info = text
        client = server.client()
        try:
            client[database][f"{COLLECTION}_workers"].update_one(
                {"_id": worker_id}, {"$set": {"info": info}}, upsert=True)
        finally:
            client.close()

    def damage_ack(location: str, worker_id: str, service: str) -> None:
        client = server.client()
        try:
            res = client[database][f"{COLLECTION}_acks"].update_one(
                {"_id": f"{location}/{worker_id}/{service}"}, {"$unset": {"generation": ""}})
            assert res.matched_count == 1, "no such acknowledgement to damage"
        finally:
            client.close()

    def read_raw(location: str) -> dict[str, Any]:
        client = server.client()
        try:
            return dict(client[database][COLLECTION].find_one({"_id": location}) or {})
        finally:
            client.close()

    return MongoKit("mongo", kit_url(server, database), write_raw, write_raw_history,
                    write_raw_worker, damage_ack, read_raw, server=server, database=database)


@pytest.fixture(scope="session")
def mongo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MongoHandle]:
    """One MongoDB-wire server for the session (see the module docstring)."""
    server = start_mongo(tmp_path_factory.mktemp("mongo-server"))
    try:
        yield server
    finally:
        server.close()
