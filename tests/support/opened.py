"""Backends opened inside a test and all closed after it: the ``opened`` fixture of the backend
test files (ZooKeeper, MongoDB), one shape for all of them, so a test opens a second or third
client of the same store with ``opened(url)`` and never leaks its connection."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from locstatus.backends import open_backend
from locstatus.backends.base import Backend
from locstatus.backends.mongo import MongoBackend

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


def open_mongo(url: str) -> MongoBackend:
    """A MongoDB backend of ``url`` (a ``mongodb://`` URL), for :func:`backends_opened`."""
    b = open_backend(url)
    assert isinstance(b, MongoBackend)
    return b
