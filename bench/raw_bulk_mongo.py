"""Raw pymongo baseline for ``bench/bulk.py --backend mongo``: the MongoDB I/O of a bulk pause,
resume or create of every location, the fastest way pymongo offers, with the same client
options as locstatus (``w=majority&journal=true``, majority reads: parse_mongo_url's).

- ``flip``: read every record (``find`` without the embedded history, as locstatus' read of
  every location), set the service's state, then one unordered ``bulk_write`` of the same
  version-guarded update locstatus sends per location (``$set`` of the services, ``$inc`` of
  the version, ``$push`` of the write into the capped embedded history), in chunks of
  :data:`CHUNK`, each followed by the ``insert_many`` of its writes into the history
  collection; every update must match. The records and history documents it writes are
  locstatus' (times and op_ids aside). (locstatus also filters on the history watermark and
  plans each location with its state machine.)
- ``create``: unordered ``insert_many`` of the creation counters, the records and their
  history, in chunks of :data:`CHUNK`.

Importing this module registers ``RAW["mongo"]`` in the running ``bulk`` module.
"""

from __future__ import annotations

import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from pymongo import MongoClient, UpdateOne  # noqa: E402

from locstatus.backends.mongo import parse_mongo_url  # noqa: E402

CHUNK = 1000


def _bulk() -> ModuleType:
    """The running bulk module: ``__main__`` when bulk.py is the script."""
    main = sys.modules.get("__main__")
    if main is not None and hasattr(main, "RAW") and hasattr(main, "RawSQLite"):
        return main
    import bulk

    return bulk


def _entry(location: str, version: int, event: str, to_state: str | None, op_id: str,
           from_state: str | None = None, generation: int = 1) -> dict[str, Any]:
    return _bulk().history_entry(location, version, event, to_state, op_id, from_state,
                                 generation)


class RawMongo:
    def __init__(self, url: str) -> None:
        s = parse_mongo_url(url)
        self.window = s.recent_history
        self.client: MongoClient[dict[str, Any]] = MongoClient(
            s.client_url, tz_aware=True, **s.client_options
        )
        db = self.client[s.database]
        self.records = db[s.collection]
        self.history = db[f"{s.collection}_history"]
        self.incarnations = db[f"{s.collection}_incarnations"]

    def flip(self, event: str) -> None:
        bulk = _bulk()
        op_id = uuid.uuid4().hex
        state = bulk.STATES[event]
        docs = list(self.records.find({}, {"recent_history": 0, "born": 0}).sort("_id", 1))
        for start in range(0, len(docs), CHUNK):
            ops, writes = [], []
            for doc in docs[start:start + CHUNK]:
                location, version = doc["_id"], doc["version"] + 1
                services = doc["services"]
                was = services[bulk.SERVICE]["state"]
                services[bulk.SERVICE]["state"] = state
                services[bulk.SERVICE]["op_id"] = op_id
                # each flip bumps the service's generation, as locstatus' state machine does
                generation = services[bulk.SERVICE]["generation"] + 1
                services[bulk.SERVICE]["generation"] = generation
                entries = [_entry(location, version, event, state, op_id, was, generation)]
                ops.append(UpdateOne(
                    {"_id": location, "version": doc["version"]},
                    {"$set": {"services": services, "deleted_at": doc.get("deleted_at")},
                     "$inc": {"version": 1},
                     "$push": {"recent_history": {
                         "$each": [{"version": version, "entries": entries}],
                         "$slice": -self.window}}},
                ))
                writes.append({"location": location, "version": version, "entries": entries})
            result = self.records.bulk_write(ops, ordered=False)
            assert result.matched_count == len(ops), (result.matched_count, len(ops))
            self.history.insert_many(writes, ordered=False)

    def create(self, locations: list[str]) -> None:
        bulk = _bulk()
        now = datetime.now(UTC).isoformat()
        op_id = uuid.uuid4().hex
        for start in range(0, len(locations), CHUNK):
            chunk = locations[start:start + CHUNK]
            self.incarnations.insert_many([{"_id": n, "n": 1} for n in chunk], ordered=False)
            records, writes = [], []
            for n in chunk:
                entries = [_entry(n, 1, "create", None, op_id)]
                records.append({
                    "_id": n, "version": 1, "born": 1, "format": 1,
                    "services": {bulk.SERVICE: {
                        "state": "running", "generation": 0, "resume_at": None,
                        "reason": None, "actor": None, "op_id": op_id, "updated_at": now}},
                    "deleted_at": None,
                    "recent_history": [{"version": 1, "entries": entries}],
                    "history_copied": 0,
                })
                writes.append({"location": n, "version": 1, "entries": entries})
            self.records.insert_many(records, ordered=False)
            self.history.insert_many(writes, ordered=False)

    def close(self) -> None:
        self.client.close()


_bulk().RAW["mongo"] = RawMongo
