"""The backend kits by name, for suites parametrized over backends (``kit``, ``durable_kit`` in
tests/conftest.py) and for test files that pick some by name.

A module of its own, not a name in conftest.py: ``from conftest import ...`` resolves to
whichever conftest pytest put on ``sys.path`` first (tests/reliability's one when the whole
suite is collected), so a table test files import must live in the support package.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from support.kits import Kit, memory_kit, sqlite_kit
from support.kits_mongo import mongo_kit
from support.kits_zk import zk_kit

KIT_FACTORIES: dict[str, Callable[[pytest.FixtureRequest, Path], Kit]] = {
    "memory": lambda request, tmp: memory_kit(tmp),
    "sqlite": lambda request, tmp: sqlite_kit(tmp),
    "zk": lambda request, tmp: zk_kit(request.getfixturevalue("zk_server")),
    "mongo": lambda request, tmp: mongo_kit(request.getfixturevalue("mongo_server")),
}
"""Name -> kit factory; the server kits take their session-scoped server fixture."""

DURABLE = [name for name in KIT_FACTORIES if name != "memory"]
"""The backends reachable from other OS processes."""
