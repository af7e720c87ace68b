"""The worker's handlers: which function runs for which change, and how one is called.

A worker registers ``on_pause`` / ``on_resume`` functions per service and ``on_remove``
functions for every service (docs/agent.md, "Handlers"). This module keeps them by event and
service and calls one, plain or coroutine, so the agent's loops only ask "which handlers for
this key" and "call this one". :class:`HandlerRetry` is the backoff of a failing handler and
:class:`Applying` what a running handler can ask the agent about (``agent.applying``).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import random
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from locstatus.models import ServiceStatus

__all__ = [
    "Applying",
    "Handler",
    "HandlerRetry",
    "Handlers",
    "applying",
    "fencing",
    "handler_name",
]

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
    removal. For a self-fence (:func:`fencing`), the status last read (what the worker ran)."""


_applying: contextvars.ContextVar[Applying | None] = contextvars.ContextVar(
    "locstatus_applying", default=None
)
_fencing: contextvars.ContextVar[bool] = contextvars.ContextVar("locstatus_fencing", default=False)


def fencing() -> bool:
    """True inside a handler that runs because the worker self-fenced (its lease may have
    lapsed: the pause handler, or ``on_fence``, stops what runs although the stored state may
    say running; docs/agent.md "Self-fencing")."""
    return _fencing.get()


def applying() -> Applying | None:
    """What the handler running in this context applies (each apply thread, and each
    coroutine handler, has its own); None outside a handler."""
    return _applying.get()


def handler_name(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of a handler, for the stuck-handler report."""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}"[:256] if module else name[:256]


class Handlers:
    """The registered handlers, by event and service, in registration order.

    ``loop``: an event loop running in another thread to run coroutine handlers on; without
    one they run to completion on a private loop of the calling thread (one per apply thread;
    :meth:`close` ends the calling thread's).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop
        self._local = threading.local()
        self._lock = threading.Lock()
        self._pause: dict[str, list[Handler]] = {}
        self._resume: dict[str, list[Handler]] = {}
        self._remove: list[Handler] = []
        self._fence: dict[str, list[Handler]] = {}

    def add_pause(self, service: str, fn: Handler) -> None:
        with self._lock:
            self._pause.setdefault(service, []).append(fn)

    def add_resume(self, service: str, fn: Handler) -> None:
        with self._lock:
            self._resume.setdefault(service, []).append(fn)

    def add_remove(self, fn: Handler) -> None:
        with self._lock:
            self._remove.append(fn)

    def add_fence(self, service: str, fn: Handler) -> None:
        with self._lock:
            self._fence.setdefault(service, []).append(fn)

    def for_state(self, service: str, *, paused: bool) -> list[Handler]:
        """The handlers that apply ``service``'s desired state (paused: ``on_pause``)."""
        with self._lock:
            return list((self._pause if paused else self._resume).get(service, ()))

    def for_removal(self) -> list[Handler]:
        """The ``on_remove`` handlers."""
        with self._lock:
            return list(self._remove)

    def for_fence(self, service: str) -> list[Handler]:
        """What stops ``service`` when the worker self-fences: its ``on_fence`` handlers when
        any is registered, else its ``on_pause`` handlers."""
        with self._lock:
            return list(self._fence.get(service) or self._pause.get(service) or [])

    def call(self, fn: Handler, location: str, what: Applying, *, fence: bool = False) -> None:
        """Call ``fn(location)`` with :func:`applying` answering ``what`` (and :func:`fencing`
        ``fence``); await it when it returns an awaitable."""
        token = _applying.set(what)
        fence_token = _fencing.set(fence)
        try:
            result = fn(location)
            if not inspect.isawaitable(result):
                return
            coro = result if inspect.iscoroutine(result) else _await(result)
            if self._loop is not None:
                # The task runs in a copy of this context: it sees ``what`` too.
                asyncio.run_coroutine_threadsafe(coro, self._loop).result()
                return
            runner: asyncio.Runner | None = getattr(self._local, "runner", None)
            if runner is None:
                runner = self._local.runner = asyncio.Runner()
            runner.run(coro, context=contextvars.copy_context())
        finally:
            _fencing.reset(fence_token)
            _applying.reset(token)

    def close(self) -> None:
        """End the calling thread's private event loop, if it started one."""
        runner: asyncio.Runner | None = getattr(self._local, "runner", None)
        if runner is not None:
            runner.close()
            self._local.runner = None


async def _await(awaitable: Awaitable[Any]) -> None:
    await awaitable
