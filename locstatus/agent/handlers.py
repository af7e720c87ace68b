"""The worker's handlers: which function runs for which change, and how one is called.

A worker registers ``on_pause`` / ``on_resume`` functions per service and ``on_remove``
functions for every service (docs/agent.md, "Handlers"). This module keeps them by event and
service and calls one, plain or coroutine, so the agent's loops only ask "which handlers for
this key" and "call this one". :class:`HandlerRetry` is the backoff of a failing handler and
:class:`Applying` what a running handler can ask the agent about (``agent.applying``).
"""

from __future__ import annotations

import asyncio
import inspect
import random
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from locstatus.models import ServiceStatus

__all__ = ["Applying", "Handler", "HandlerRetry", "Handlers"]

Handler = Callable[[str], "Awaitable[None] | None"]
"""A handler takes the location name. It may be a coroutine function (see :class:`Agent`)."""
H = TypeVar("H", bound=Callable[[str], Any])


@dataclass(frozen=True)
class HandlerRetry:
    """Backoff of a failing handler: the n-th consecutive failure waits a random time between
    half of and ``min(cap, base * 2**(n-1))`` seconds before the next attempt."""

    base: float = 0.2
    cap: float = 30.0

    def delay(self, failures: int) -> float:
        """Seconds to wait after ``failures`` consecutive failures (>= 1)."""
        top = min(self.cap, self.base * 2 ** max(0, failures - 1))
        return random.uniform(top / 2, top)


class Applying(NamedTuple):
    """What the running handler is applying (:attr:`Agent.applying`)."""

    location: str
    service: str
    """The service, or :data:`~locstatus.models.TOMBSTONE_ACK` for ``on_remove``."""
    status: ServiceStatus | None
    """The status being applied (its ``generation`` is what will be acknowledged); None for a
    removal."""


class Handlers:
    """The registered handlers, by event and service, in registration order.

    ``loop``: an event loop running in another thread to run coroutine handlers on; without
    one they run to completion on a private loop of the calling thread (:meth:`close` ends it).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop
        self._runner: asyncio.Runner | None = None
        self._lock = threading.Lock()
        self._pause: dict[str, list[Handler]] = {}
        self._resume: dict[str, list[Handler]] = {}
        self._remove: list[Handler] = []

    def add_pause(self, service: str, fn: Handler) -> None:
        with self._lock:
            self._pause.setdefault(service, []).append(fn)

    def add_resume(self, service: str, fn: Handler) -> None:
        with self._lock:
            self._resume.setdefault(service, []).append(fn)

    def add_remove(self, fn: Handler) -> None:
        with self._lock:
            self._remove.append(fn)

    def for_state(self, service: str, *, paused: bool) -> list[Handler]:
        """The handlers that apply ``service``'s desired state (paused: ``on_pause``)."""
        with self._lock:
            return list((self._pause if paused else self._resume).get(service, ()))

    def for_removal(self) -> list[Handler]:
        """The ``on_remove`` handlers."""
        with self._lock:
            return list(self._remove)

    def call(self, fn: Handler, location: str) -> None:
        """Call ``fn(location)``; await it when it returns an awaitable."""
        result = fn(location)
        if not inspect.isawaitable(result):
            return
        coro = result if inspect.iscoroutine(result) else _await(result)
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(coro, self._loop).result()
            return
        if self._runner is None:
            self._runner = asyncio.Runner()
        self._runner.run(coro)

    def close(self) -> None:
        """End the private event loop, if one was started."""
        if self._runner is not None:
            self._runner.close()
            self._runner = None


async def _await(awaitable: Awaitable[Any]) -> None:
    await awaitable
