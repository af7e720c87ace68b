"""A Server-Sent Events reader for tests: reads one ``text/event-stream`` in a thread and queues
each event (``event``, ``id``, ``data`` parsed as JSON), so a test can wait for the next one.

Ask the server for frequent heartbeats (``?heartbeat=0.2``): the reader checks whether it was
closed between lines, so a quiet stream would keep its thread until the next line.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class Sse:
    event: str
    id: str | None
    data: Any


class SseReader:
    """``SseReader(url, headers)`` opens the stream at once; :attr:`status` is the answer's
    status (the body of a non-200 answer is in :attr:`error`)."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self.events: queue.Queue[Sse] = queue.Queue()
        self.status: int | None = None
        self.error: Any = None
        self.ended = threading.Event()
        self._closed = False
        self._opened = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(url, headers or {}), name="sse-reader", daemon=True
        )
        self._thread.start()
        if not self._opened.wait(15):
            raise TimeoutError(f"no answer from {url}")

    def _run(self, url: str, headers: dict[str, str]) -> None:
        try:
            with httpx.stream("GET", url, headers=headers, timeout=httpx.Timeout(30.0)) as r:
                self.status = r.status_code
                if r.status_code != 200:
                    self.error = json.loads(r.read())
                    self._opened.set()
                    return
                self._opened.set()
                fields: dict[str, str] = {}
                for line in r.iter_lines():
                    if self._closed:
                        return
                    if line == "":
                        if "event" in fields or "data" in fields:
                            data = fields.get("data")
                            self.events.put(
                                Sse(fields.get("event", "message"), fields.get("id"),
                                    json.loads(data) if data else None)
                            )
                        fields = {}
                    elif not line.startswith(":"):
                        key, _, value = line.partition(":")
                        fields[key] = value[1:] if value.startswith(" ") else value
        except httpx.HTTPError:
            pass
        finally:
            self._opened.set()
            self.ended.set()

    def next(self, event: str | None = None, timeout: float = 10.0) -> Sse:
        """The next event (of kind ``event`` when given; others are skipped, heartbeats too
        unless asked for). Raises :class:`TimeoutError`."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {event or 'event'} within {timeout}s")
            try:
                e = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if event is None and e.event == "heartbeat":
                continue
            if event is None or e.event == event:
                return e

    def close(self) -> None:
        self._closed = True
        self._thread.join(5)
