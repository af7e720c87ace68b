"""Backends opened inside a test and all closed after it: the ``opened`` fixture of the backend
test files (ZooKeeper, MongoDB), one shape for all of them, so a test opens a second or third
client of the same store with ``opened(url)`` and never leaks its connection."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from locstatus.backends.base import Backend

B = TypeVar("B", bound=Backend)


@contextmanager
def backends_opened(factory: Callable[[str], B]) -> Iterator[Callable[[str], B]]:
    """Yield ``open_(url) -> backend`` (``factory(url)``); close every backend it opened on
    exit, in the order opened."""
    backends: list[B] = []

    def open_(url: str) -> B:
        b = factory(url)
        backends.append(b)
        return b

    try:
        yield open_
    finally:
        for b in backends:
            b.close()
