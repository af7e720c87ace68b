"""Round trips a ZooKeeper client waits for, counted from kazoo's own request log.

kazoo logs, on its connection thread and in the order they cross the socket, every request it
sends ("Sending request(xid=...)", DEBUG; pings at BLATHER), every answer's header ("Reading
for header", BLATHER) and each answer ("Received response(xid=...)", DEBUG). A *round trip*
starts when a request someone waits for is sent while no other such request is waiting for its
answer: requests pipelined behind it ride the same round trip. A ``get`` sent right behind a
multi-op that applied is taken as waited for by nobody (a client that pipelines one to learn
why a compare-and-set was refused returns without it). Pings, the session's connect and close, and watch events are not counted. The counter sees
every kazoo client of the process, so a test counts while only the client it measures is busy.

Usage::

    with RoundTrips() as trips:
        mgr.pause("us-east-1", "replication")
    trips.round_trips, trips.requests        # 2, ["Transaction", "GetData", ...]
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType
from typing import Any

from kazoo.loggingsupport import BLATHER

LOGGER = "kazoo.client"
_UNCOUNTED = ("Ping", "Connect", "Close")


class RoundTrips(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=BLATHER)
        self.round_trips = 0
        self.requests: list[str] = []
        self._waiting: dict[int, bool] = {}  # xid -> someone waits for its answer
        self._behind: dict[int, int] = {}  # multi-op xid -> the get sent right behind it
        self._applied: dict[int, bool] = {}  # answered multi-op xid -> it applied
        self._last: tuple[int, str] | None = None
        self._lock = threading.Lock()
        self._level = logging.NOTSET

    def emit(self, record: logging.LogRecord) -> None:
        args: Any = record.args or ()
        msg = record.msg
        with self._lock:
            if msg.startswith("Sending request") and len(args) == 2:
                self._sent(args[0], type(args[1]).__name__)
            elif msg.startswith("Reading for header") and args:
                self._waiting.pop(getattr(args[0], "xid", None), None)  # type: ignore[arg-type]
            elif msg.startswith("Received response") and len(args) == 2:
                xid, response = args
                if isinstance(response, list):  # a multi-op's results
                    applied = not any(isinstance(r, Exception) for r in response)
                    self._applied[xid] = applied
                    get = self._behind.pop(xid, None)
                    if get is not None and get in self._waiting:
                        self._waiting[get] = not applied

    def _sent(self, xid: int, kind: str) -> None:
        if kind in _UNCOUNTED or xid is None:
            return
        waited = True
        last, self._last = self._last, (xid, kind)
        if kind == "GetData" and last is not None and last[1] == "Transaction":
            if last[0] in self._applied:  # its multi-op answered already
                waited = not self._applied[last[0]]
            else:
                self._behind[last[0]] = xid
        if waited and not any(self._waiting.values()):
            self.round_trips += 1
        self._waiting[xid] = waited
        self.requests.append(kind)

    def __enter__(self) -> RoundTrips:
        log = logging.getLogger(LOGGER)
        self._level = log.level
        log.setLevel(BLATHER)
        log.addHandler(self)
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        log = logging.getLogger(LOGGER)
        log.removeHandler(self)
        log.setLevel(self._level)
