"""``mongodb://host[:port][,host...]/?database=NAME&collection=NAME``: MongoDB via pymongo
(docs/design.md §4, docs/mongodb.md).

The package, bottom up, in the shape of the ZooKeeper one:

- ``url``: the ``mongodb://`` URL and locstatus' own options (:func:`parse_mongo_url`);
- ``store``: the client, the collections, and the one edge where pymongo's errors become
  locstatus errors (``Store.io``: ``write=True`` decides "outcome unknown" against
  "unavailable");
- ``history``: the embedded recent history, the history collection and the watermark
  (``history_copied``) that keeps the collection whole;
- ``records``: one document per location, compare-and-set as one ``findAndModify``, versions
  across lives;
- ``batches``: many compare-and-sets as one unordered ``bulk_write`` of the same
  version-guarded updates, many creates as unordered inserts, what a lost answer leaves unknown
  read back per location;
- ``workers``: heartbeat documents under a TTL index, acknowledgements stamped with the
  record's life;
- ``watch``: change hints from a change stream, or by polling;
- ``backend``: :class:`MongoBackend`, thin, over all of them.

Durability and timeouts: ``w=majority&journal=true`` (``wTimeoutMS=10000``) and
``readConcernLevel=majority`` unless the URL says otherwise; ``serverSelectionTimeoutMS=5000``,
``connectTimeoutMS=5000``, ``socketTimeoutMS=30000``; every backend call has one deadline,
``timeoutMS`` (default the smaller of ``socketTimeoutMS`` and ``maxTimeMS``), shared by all it
sends and the driver's retries (``Store.deadline``; docs/mongodb.md, "Timeouts"); outside a
call, reads and ``findAndModify`` carry ``maxTimeMS`` (default 10000) and plain writes are
bounded by ``wTimeoutMS`` and the socket timeout. A server that does not answer is
:class:`~locstatus.errors.BackendUnavailable` naming it; a write whose outcome is unknown is
:class:`~locstatus.errors.AmbiguousCommit`, resolved by the manager (docs/design.md §3.2).
"""

from __future__ import annotations

from locstatus.backends.mongo.backend import MongoBackend
from locstatus.backends.mongo.url import MongoSettings, parse_mongo_url

__all__ = ["MongoBackend", "MongoSettings", "parse_mongo_url"]
