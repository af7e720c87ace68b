"""Shared fixtures: every backend-facing suite runs once per backend kit (see ``kits.py``).

``kit``: all backends (memory, sqlite, zk, mongo).
``durable_kit``: backends reachable from other OS processes (everything but memory).
``small_disk``: a small tmpfs that a test fills up for real (``fulldisk.py``).

The suite's length (``suite.py``): CI's bounded one by default, the long one with
``LOCSTATUS_TEST_SUITE=long`` (``scripts/long.sh``); the hypothesis profile (``ci`` or
``thorough``) is loaded here from it, and printed in the session header.

Server backends bring their own session-scoped server fixtures (``kits_zk.py``,
``kits_mongo.py``): real ZooKeeper from the Debian package, and a real mongod (or testcontainers,
or a MongoDB-wire server from PyPI), started on 127.0.0.1 and stopped by PID.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from support import model_runs, suite
from support.fulldisk import small_disk  # noqa: F401  (a fixture: a tmpfs to fill up)
from support.kit_table import DURABLE, KIT_FACTORIES
from support.kits import Kit
from support.kits_mongo import mongo_server  # noqa: F401  (a fixture)
from support.kits_zk import zk_server  # noqa: F401  (a fixture)

# Property tests without a max_examples of their own: hypothesis' default 100 in CI, 1000 in
# the long suite (a test that sets one keeps it, or asks suite.sized for it).
settings.register_profile("ci", max_examples=100)
settings.register_profile("thorough", max_examples=1000)
settings.load_profile(suite.hypothesis_profile())


def pytest_report_header(config: pytest.Config) -> str:
    return (f"locstatus test suite: {suite.suite()} ({suite.SUITE_ENV}; hypothesis profile "
            f"{suite.hypothesis_profile()})")


def pytest_collection_finish(session: pytest.Session) -> None:
    # the model checks, CPU-bound, start in the background (support/model_runs.py)
    model_runs.start_for(session.items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    model_runs.stop()


def _make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Kit]:
    kit = KIT_FACTORIES[request.param](request, tmp_path)
    try:
        yield kit
    finally:
        kit.close()


@pytest.fixture(params=list(KIT_FACTORIES))
def kit(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Kit]:
    yield from _make(request, tmp_path)


@pytest.fixture(params=DURABLE)
def durable_kit(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Kit]:
    yield from _make(request, tmp_path)


@pytest.fixture
def backend_url(durable_kit: Kit) -> str:
    """The URL of a fresh store that other OS processes can reach (every durable backend)."""
    return durable_kit.url
