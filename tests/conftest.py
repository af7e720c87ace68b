"""Shared fixtures: every backend-facing suite runs once per backend kit (see ``kits.py``).

``kit``: all backends (memory, sqlite, and the server backends once they join).
``durable_kit``: backends reachable from other OS processes (everything but memory).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kits import Kit, memory_kit, sqlite_kit

KIT_FACTORIES: dict[str, Callable[[pytest.FixtureRequest, Path], Kit]] = {
    "memory": lambda request, tmp: memory_kit(tmp),
    "sqlite": lambda request, tmp: sqlite_kit(tmp),
}
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
