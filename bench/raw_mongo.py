"""MongoDB baseline for ``bench/transition.py``: the raw I/O one locstatus transition performs.

One raw transition is what :class:`~locstatus.backends.mongo.MongoBackend` sends for a
pause/resume, with pymongo alone and the same client options (write concern, read concern):
read the record (``find_one`` without the embedded history), the versioned
``find_one_and_update({_id, version}, {$set, $inc, $push: {$each, $slice}})``, and the insert of
the write into the history collection. locstatus adds the state machine, validation, the
workers read of auto-settle and its error handling on top.

Run it on its own (it starts a SecantusDB / uses ``$LOCSTATUS_TEST_MONGO_URI`` through
``tests/servers.py`` unless ``--url`` is given)::

    python bench/raw_mongo.py [--url mongodb://...] [--rounds 7] [--ops 300]

or through ``python bench/transition.py --backend mongo --url mongodb://...``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pymongo import MongoClient, ReturnDocument

from locstatus.backends.mongo import parse_mongo_url

HERE = Path(__file__).resolve().parent
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
    ap = argparse.ArgumentParser(description="locstatus vs raw MongoDB transitions")
    ap.add_argument("--url", help="mongodb:// URL (default: start a test server)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--ops", type=int, default=300)
    ap.add_argument("--json", help="write the summary here")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent / "tests"))
    import transition

    from servers import start_mongo

    transition.RAW["mongo"] = raw_mongo
    with tempfile.TemporaryDirectory() as tmp:
        server = None
        url = args.url
        if url is None:
            server = start_mongo(tmp)
            sep = "&" if "?" in server.uri else "?"
            url = f"{server.uri}{sep}database=bench&collection=locations"
            print(f"server: {server.kind} at {server.uri}", flush=True)
        try:
            summary = transition.run("mongo", url, args.rounds, args.ops)
        finally:
            if server is not None:
                server.close()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
