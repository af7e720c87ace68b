"""MongoDB baseline for ``bench/transition.py``: the raw I/O one locstatus transition performs.

One raw transition is what :class:`~locstatus.backends.mongo.MongoBackend` sends for a
pause/resume, with pymongo alone and the same client options (write concern, read concern):
read the record (``find_one`` without the embedded history), the versioned
``find_one_and_update({_id, version}, {$set, $inc, $push: {$each, $slice}})``, and the insert of
the write into the history collection. locstatus adds the state machine, validation, the
workers read of auto-settle and its error handling on top.

Run it on its own (it starts a SecantusDB / uses ``$LOCSTATUS_TEST_MONGO_URI`` through
``tests/support/servers.py`` unless ``--url`` is given)::

    python bench/raw_mongo.py [--url mongodb://...] [--rounds 7] [--ops 300]

or through ``python bench/transition.py --backend mongo --url mongodb://...``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pymongo import MongoClient, ReturnDocument

from locstatus.backends.mongo import parse_mongo_url

RawOp = Callable[[int], None]


def raw_mongo(url: str, location: str) -> tuple[RawOp, Callable[[], None]]:
    """factory(url, location) -> (one raw transition, close), for ``transition.RAW``."""
    from transition import raw_payloads

    s = parse_mongo_url(url)
    client: MongoClient[dict[str, Any]] = MongoClient(
        s.client_url, tz_aware=True, **s.client_options
    )
    db = client[s.database]
    records, history = db[s.collection], db[f"{s.collection}_history"]
    recs, hists = raw_payloads(location)
    payloads = [json.loads(r) for r in recs]
    writes = [json.loads(h) for h in hists]
    mt = s.max_time_ms

    def op(i: int) -> None:
        doc = records.find_one({"_id": location}, {"recent_history": 0, "born": 0},
                               max_time_ms=mt)
        assert doc is not None
        version = doc["version"] + 1
        entries = [{**e, "version": version} for e in writes[i % 2]]
        after = records.find_one_and_update(
            {"_id": location, "version": doc["version"]},
            {"$set": payloads[i % 2], "$inc": {"version": 1},
             "$push": {"recent_history": {"$each": [{"version": version, "entries": entries}],
                                          "$slice": -s.recent_history}}},
            projection={"_id": 0, "version": 1},
            return_document=ReturnDocument.AFTER, maxTimeMS=mt,
        )
        assert after is not None and after["version"] == version
        history.insert_one({"location": location, "version": version, "entries": entries})

    return op, client.close


def _register() -> None:
    """Put the factory in ``RAW`` of ``transition``, also when that runs as ``__main__``."""
    for name in ("__main__", "transition"):
        raw = getattr(sys.modules.get(name), "RAW", None)
        if isinstance(raw, dict):
            raw["mongo"] = raw_mongo


RAW = {"mongo": raw_mongo}
_register()


def main() -> None:
    """Same as ``python bench/transition.py --backend mongo [--url ...] [--rounds N] [--ops N]
    [--json PATH]``: without ``--url`` it starts its own server."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import transition

    transition.main(["--backend", "mongo", *sys.argv[1:]])


if __name__ == "__main__":
    main()
