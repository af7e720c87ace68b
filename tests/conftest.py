"""Shared fixtures: every backend-facing suite runs once per backend kit (see ``kits.py``).

``kit``: all backends (memory, sqlite, zk, mongo).
``durable_kit``: backends reachable from other OS processes (everything but memory).
``small_disk``: a small tmpfs that a test fills up for real (``fulldisk.py``).

Server backends bring their own session-scoped server fixtures (``kits_zk.py``,
``kits_mongo.py``): real ZooKeeper from the Debian package, and a real mongod (or testcontainers,
or a MongoDB-wire server from PyPI), started on 127.0.0.1 and stopped by PID.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from support.fulldisk import small_disk  # noqa: F401  (a fixture: a tmpfs to fill up)
from support.kits import Kit, memory_kit, sqlite_kit

KIT_FACTORIES: dict[str, Callable[[pytest.FixtureRequest, Path], Kit]] = {
    "memory": lambda request, tmp: memory_kit(tmp),
    "sqlite": lambda request, tmp: sqlite_kit(tmp),
}

try:  # the ZooKeeper backend's kit (tests/support/kits_zk.py)
    from support.kits_zk import zk_kit, zk_server  # noqa: F401  (zk_server is a fixture)

    KIT_FACTORIES["zk"] = lambda request, tmp: zk_kit(request.getfixturevalue("zk_server"))
except ImportError as exc:  # pragma: no cover - only while the backend is being written
    if "kits_zk" not in str(exc):
        raise

try:  # the MongoDB backend's kit (tests/support/kits_mongo.py)
    from support.kits_mongo import mongo_kit, mongo_server  # noqa: F401  (mongo_server is a fixture)

    KIT_FACTORIES["mongo"] = lambda request, tmp: mongo_kit(request.getfixturevalue("mongo_server"))
except ImportError as exc:  # pragma: no cover
    if "kits_mongo" not in str(exc):
        raise

DURABLE = [name for name in KIT_FACTORIES if name != "memory"]


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
