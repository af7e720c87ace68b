"""The sidecar's one pure ASGI middleware: request metrics per route template, the ``Host``
check of a sidecar without a token (421), a body framed two ways (400), the request body limit
(413) and the body read deadline (408), all before any parsing (docs/http.md, "Requests from
browsers", "Operations", "Errors").

Pure ASGI rather than Starlette's ``BaseHTTPMiddleware``: no extra task per request, and a body
that is too large or too slow is refused before FastAPI reads it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .guard import HostPolicy
from .metrics import Metrics
from .problems import PROBLEM_MEDIA_TYPE, Problem

MAX_BODY = 64 * 1024
"""Largest accepted request body, in bytes (413 above)."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


BODY_TIMEOUT = 5.0
"""Seconds a client may take to send its whole request body (408 after that): a client that
declares a body and stalls must not pin a connection and a request forever."""


class Middleware:
    """Request metrics per route template, the ``Host`` check of a sidecar without a token
    (421, :class:`~.guard.HostPolicy`), a body framed by both ``Content-Length`` and
    ``Transfer-Encoding`` (400, :func:`_framing_error`), the 64 KiB body limit (413) and the
    body read deadline (408)."""

    def __init__(
        self, app: ASGIApp, metrics: Metrics, max_body: int, hosts: HostPolicy,
        body_timeout: float = BODY_TIMEOUT,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.max_body = max_body
        self.hosts = hosts
        self.body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        method = scope["method"]
        status = [500]

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            refusal = self.hosts.refusal(_header(scope, b"host"))
            if refusal is not None:
                status[0] = 421
                await self._refuse(scope, send, 421, "misdirected request", refusal,
                                   type_="urn:locstatus:misdirected-request")
                return
            framing = _framing_error(scope)
            if framing is not None:
                status[0] = 400
                await self._refuse(scope, send, 400, "bad request framing", framing,
                                   type_="urn:locstatus:bad-framing")
                return
            if method in ("POST", "PUT", "PATCH", "DELETE"):
                try:
                    replay = await asyncio.wait_for(
                        self._read_body(scope, receive), self.body_timeout
                    )
                except TimeoutError:
                    status[0] = 408
                    await self._refuse(
                        scope, send, 408, "request timeout",
                        f"request body not received within {self.body_timeout:g} s",
                        type_="urn:locstatus:request-timeout",
                    )
                    return
                if replay is None:
                    status[0] = 413
                    await self._refuse(
                        scope, send, 413, "request too large",
                        f"request body larger than {self.max_body} bytes",
                        type_="urn:locstatus:request-too-large",
                    )
                    return
                receive = replay
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", None) or "unmatched"
            self.metrics.request(method, label, status[0], time.perf_counter() - start)

    async def _read_body(self, scope: Scope, receive: Receive) -> Receive | None:
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and (
                not value.isdigit() or int(value) > self.max_body
            ):
                return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # client went away: let the app see it
                first: Message = message
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                first = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
                break
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return first
            return await receive()

        return replay

    @staticmethod
    async def _refuse(
        scope: Scope, send: Send, status: int, title: str, detail: str,
        type_: str,
    ) -> None:
        body = Problem(
            type=type_, title=title, status=status, detail=detail, instance=scope.get("path"),
        ).model_dump_json(exclude_none=True).encode()
        await send({
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        })
        await send({"type": "http.response.body", "body": body})


def _framing_error(scope: Scope) -> str | None:
    """Why the request's body framing is ambiguous, or None: both ``Content-Length`` and
    ``Transfer-Encoding`` (RFC 9112 6.3: a server may reject it, and must close the connection).
    The HTTP server reads such a body as chunked, so ``Content-Length: 0`` plus chunked waited
    for chunks the client never sent (a 408 five seconds later), and a chunked body under a
    ``Content-Length`` that says otherwise was applied: the two framings disagree, the shape of
    request smuggling through a proxy that reads the other one. Refused before any body is
    read, nothing written; the answer closes the connection."""
    names = {key.lower() for key, _ in scope.get("headers", ())}
    if b"content-length" in names and b"transfer-encoding" in names:
        return ("the request has both Content-Length and Transfer-Encoding headers: its body "
                "framing is ambiguous; send one of them")
    return None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


