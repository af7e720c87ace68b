"""Fault scenario on the MongoDB backend: the server restarted under random operator load with
worker agents.

The server is the suite's own MongoDB-wire server (``servers.start_mongo``: SecantusDB from PyPI
unless ``LOCSTATUS_TEST_MONGO_URI`` or Docker gives a real mongod), so it can be stopped and
killed without disturbing the session's shared one. Rounds alternate a clean restart (SIGTERM)
and a crash (SIGKILL), each followed by a start on the same port and data. The backend writes
with ``w=majority, j=true`` (its defaults), so an acknowledged write must survive both.
Issue 8 sets no convergence target for MongoDB: the time is measured and reported.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from harness import Scenario

from support.kits_mongo import fresh_database, kit_url
from support.servers import MongoHandle


def test_mongodb_server_restarted_under_load(
    own_mongo: MongoHandle, scenario: Callable[..., Scenario]
) -> None:
    # own_mongo first: it is set up before, and torn down after, the scenario's processes
    url = kit_url(own_mongo, fresh_database())
    sc = scenario("restart the MongoDB server", "mongo", url, loaders=3, rate=10.0,
                  agent_args=["--lease", "6", "--heartbeat", "1"]).start()
    rng = random.Random(21)
    sc.wait_ops(20)
    rounds = 0
    while True:
        hard = rounds % 2 == 1
        f = sc.faults.start("restart_mongodb", "SIGKILL" if hard else "SIGTERM")
        if hard:
            own_mongo.kill()
        else:
            own_mongo.stop()
        time.sleep(rng.uniform(0.2, 1.5))
        own_mongo.start(timeout=120)
        sc.faults.heal(f)
        rounds += 1
        if sc.remaining < 2:
            break
        time.sleep(min(sc.remaining - 1, rng.uniform(1.0, 3.0)))
    sc.finish(converge_timeout=180)
