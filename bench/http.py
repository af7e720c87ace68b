"""Throughput and p99 latency of the sidecar's status GET and pause/resume POST vs bare FastAPI
routes.

``get``: requests per second of ``GET /v1/locations/{loc}`` (backend read, pydantic validation
and serialisation, ETag, the request-metrics middleware, the thread pool) against a bare FastAPI
app whose route of the same path returns the same JSON from a dict.

``post``: ``POST /v1/locations/{loc}/replication/pause`` and ``.../resume`` alternately, each
connection on its own location (every request is a real compare-and-set write: no worker is
registered, so each settles in a second write right after it), against a bare FastAPI ``def`` route of the same
path that performs the same I/O with ``sqlite3`` alone (bench/transition.py's raw
read + versioned UPDATE + history INSERT in one ``BEGIN IMMEDIATE`` transaction, same
durability) and returns the record's JSON. The ratio is what the sidecar's HTTP, validation,
state machine and bookkeeping cost on top of the write it cannot avoid.

Each latency is one request's send-to-last-byte time on a keep-alive connection; p99 is taken
per round over every request of every connection. All apps run
in their own uvicorn process with the same settings (one process, default loop and HTTP
implementation, no access log); the load generator is this process: N keep-alive connections
sending requests back to back over raw asyncio streams (so the client costs little next to the
server). Rounds are short and interleaved (A B C, C B A, ...), so that the servers of one round
share the machine's load; the headline figure is the median of the per-round ratios (robust to
load changing between rounds on a shared machine), next to the ratio of the medians.

Two baselines are measured: ``async def`` (no thread pool: the cheapest FastAPI route) and
``def`` (run in the thread pool, as the sidecar's routes are, because a backend call may block).

Run::

    python bench/http.py                       # SQLite, 15 rounds of 1 s per server, 8 connections
    python bench/http.py --scenario post --rounds 31 --seconds 2 --connections 16
"""

from __future__ import annotations

import os
import sys

# This file is named http.py: drop its directory from the import path so that the standard
# library's ``http`` package (used by uvicorn and httpx) is not shadowed by it.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

LOCATION = "us-east-1"
PATH = f"/v1/locations/{LOCATION}"
WRITE_LOCATION = "bench-write"  # POST: one location per connection, bench-write-0 ...
_CONTENT_LENGTH = re.compile(rb"content-length:\s*(\d+)", re.I)


# -- the servers (run in child processes) -------------------------------------------------------


def _serve(app: Any) -> None:
    import uvicorn

    from locstatus.api.server import bind_socket

    # The sidecar's own socket setup (its protocol is IPPROTO_TCP, so asyncio sets TCP_NODELAY
    # on accepted connections; a bare socket.socket() would leave Nagle on, 40 ms stalls).
    sock = bind_socket("127.0.0.1", 0)
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


def serve_locstatus(url: str) -> None:
    from locstatus import Manager, open_backend
    from locstatus.api import create_app

    _serve(create_app(Manager(open_backend(url))))


def serve_bare_write(url: str) -> None:
    """A bare ``def`` route doing the raw write bench/transition.py times (same path)."""
    import threading

    from fastapi import FastAPI

    sys.path.insert(0, _here)
    from transition import raw_sqlite

    local = threading.local()  # sqlite3 connections are per thread, as the sidecar's are
    lock = threading.Lock()
    counts: dict[str, int] = {}
    app = FastAPI()

    @app.post("/v1/locations/{location}/{service}/{action}")
    def write(location: str, service: str, action: str, body: dict[str, Any]) -> dict[str, Any]:
        ops = local.__dict__.setdefault("ops", {})
        if location not in ops:
            ops[location] = raw_sqlite(url, location)[0]
        with lock:
            n = counts[location] = counts.get(location, -1) + 1
        ops[location](0 if action == "pause" else 1)  # BEGIN IMMEDIATE serialises writers
        return {"location": location, "service": service, "done": action, "n": n, **body}

    _serve(app)


def serve_bare(url: str, sync: bool) -> None:
    from fastapi import FastAPI

    from locstatus import open_backend

    backend = open_backend(url)
    data = {LOCATION: backend.read(LOCATION).model_dump(mode="json")}  # the same JSON
    backend.close()
    app = FastAPI()
    if sync:

        @app.get("/v1/locations/{location}")
        def get_sync(location: str) -> dict[str, Any]:
            return data[location]

    else:

        @app.get("/v1/locations/{location}")
        async def get_async(location: str) -> dict[str, Any]:
            return data[location]

    _serve(app)


# -- the load generator -------------------------------------------------------------------------


def get_requests(connection: int) -> list[bytes]:
    return [f"GET {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()]


def post_requests(connection: int) -> list[bytes]:
    body = b'{"reason": "bench"}'
    return [
        (f"POST /v1/locations/{WRITE_LOCATION}-{connection}/replication/{action} HTTP/1.1\r\n"
         f"Host: 127.0.0.1\r\nContent-Type: application/json\r\n"
         f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        for action in ("pause", "resume")
    ]


async def _connection(
    port: int, deadline: float, requests: list[bytes], latencies: list[float]
) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    done = 0
    try:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            writer.write(requests[done % len(requests)])
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"unexpected answer: {head[:200]!r}")
            match = _CONTENT_LENGTH.search(head)
            if match is None:
                raise RuntimeError(f"no content-length: {head[:200]!r}")
            await reader.readexactly(int(match.group(1)))
            latencies.append(time.perf_counter() - t0)
            done += 1
    finally:
        writer.close()
    return done


async def _load(
    port: int, seconds: float, connections: int, make: Callable[[int], list[bytes]]
) -> tuple[float, float]:
    latencies: list[float] = []
    start = time.perf_counter()
    counts = await asyncio.gather(
        *(_connection(port, start + seconds, make(i), latencies) for i in range(connections))
    )
    rate = sum(counts) / (time.perf_counter() - start)
    return rate, p99(latencies)


def p99(xs: list[float]) -> float:
    return sorted(xs)[max(0, int(len(xs) * 0.99) - 1)] if xs else float("nan")


def measure(
    port: int, seconds: float, connections: int, make: Callable[[int], list[bytes]] = get_requests
) -> tuple[float, float]:
    """(requests per second, p99 latency in seconds) over ``seconds`` with ``connections``
    keep-alive connections, each sending ``make(connection index)`` in a loop."""
    return asyncio.run(_load(port, seconds, connections, make))


# -- main -----------------------------------------------------------------------------------------


def _spawn(*args: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.strip().isdigit():
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    return proc, int(line)


def _body(port: int) -> Any:
    import httpx

    return json.loads(httpx.get(f"http://127.0.0.1:{port}{PATH}", timeout=30).content)


def _rounds(
    servers: dict[str, tuple[subprocess.Popen[str], int]],
    args: argparse.Namespace,
    make: Callable[[int], list[bytes]],
) -> dict[str, list[tuple[float, float]]]:
    for _, port in servers.values():  # warm up
        measure(port, 1.0, args.connections, make)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in servers}
    order = list(servers)
    for r in range(args.rounds):
        for name in order if r % 2 == 0 else reversed(order):
            results[name].append(measure(servers[name][1], args.seconds, args.connections, make))
    return results


def _report(title: str, results: dict[str, list[tuple[float, float]]], bases: list[str]) -> None:
    print(title)
    med = {name: statistics.median(r for r, _ in values) for name, values in results.items()}
    p99s = {name: statistics.median(p for _, p in values) for name, values in results.items()}
    for name, values in results.items():
        rounds = " ".join(f"{r:7.0f}" for r, _ in values)
        print(f"  {name:11s} median {med[name]:7.0f} req/s  p99 {p99s[name] * 1e3:7.2f} ms   "
              f"rounds: {rounds}")
    for base in bases:
        per_round = [a[0] / b[0] for a, b in zip(results["locstatus"], results[base], strict=True)]
        p99_round = [a[1] / b[1] for a, b in zip(results["locstatus"], results[base], strict=True)]
        print(f"  locstatus / {base:10s} = {statistics.median(per_round):.2f}x median of per-round "
              f"ratios (ratio of medians {med['locstatus'] / med[base]:.2f}x); "
              f"p99 ratio {statistics.median(p99_round):.2f}x")


def _stop(servers: dict[str, tuple[subprocess.Popen[str], int]]) -> None:
    for proc, _ in servers.values():
        proc.terminate()
        proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--scenario", choices=["get", "post", "both"], default="both")
    parser.add_argument("--backend", default=None, help="SQLite URL (default: a temp file)")
    parser.add_argument("--serve", choices=["locstatus", "bare-async", "bare-sync", "bare-write"])
    args = parser.parse_args()

    if args.serve == "locstatus":
        serve_locstatus(args.backend)
        return
    if args.serve == "bare-write":
        serve_bare_write(args.backend)
        return
    if args.serve in ("bare-async", "bare-sync"):
        serve_bare(args.backend, sync=args.serve == "bare-sync")
        return

    from locstatus import Manager, open_backend

    with tempfile.TemporaryDirectory() as tmp:
        url = args.backend or f"sqlite:///{Path(tmp) / 'bench.db'}"
        mgr = Manager(open_backend(url))
        mgr.sync_locations([LOCATION], remove_missing=False)
        mgr.pause(LOCATION, "replication", reason="bench", actor="bench")
        mgr.sync_locations([f"{WRITE_LOCATION}-{i}" for i in range(args.connections)]
                           + [f"{WRITE_LOCATION}-{i}-raw" for i in range(args.connections)],
                           remove_missing=False)
        mgr.close()
        kind = url.split(":")[0]
        if args.scenario in ("get", "both"):
            servers = {
                name: _spawn("--serve", name, "--backend", url)
                for name in ("locstatus", "bare-async", "bare-sync")
            }
            try:
                bodies = {name: _body(port) for name, (_, port) in servers.items()}
                assert bodies["locstatus"] == bodies["bare-async"] == bodies["bare-sync"], bodies
                results = _rounds(servers, args, get_requests)
            finally:
                _stop(servers)
            _report(f"GET {PATH}: {args.rounds} interleaved rounds x {args.seconds:g}s, "
                    f"{args.connections} keep-alive connections, backend {kind}",
                    results, ["bare-async", "bare-sync"])
        if args.scenario in ("post", "both"):
            servers = {
                name: _spawn("--serve", name, "--backend", url)
                for name in ("locstatus", "bare-write")
            }
            try:
                # The bare route writes its own rows (bench-write-N-raw), never locstatus's.
                raw = servers["bare-write"][1]

                def raw_requests(i: int) -> list[bytes]:
                    return [r.replace(f"{WRITE_LOCATION}-{i}/".encode(),
                                      f"{WRITE_LOCATION}-{i}-raw/".encode())
                            for r in post_requests(i)]

                measure(servers["locstatus"][1], 1.0, args.connections, post_requests)
                measure(raw, 1.0, args.connections, raw_requests)
                results = {"locstatus": [], "bare-write": []}  # warmed up above
                for r in range(args.rounds):
                    pair = [("locstatus", post_requests), ("bare-write", raw_requests)]
                    for name, make in pair if r % 2 == 0 else reversed(pair):
                        results[name].append(
                            measure(servers[name][1], args.seconds, args.connections, make))
            finally:
                _stop(servers)
            _report(f"POST pause/resume (alternating, one location per connection): "
                    f"{args.rounds} interleaved rounds x {args.seconds:g}s, "
                    f"{args.connections} keep-alive connections, backend {kind}",
                    results, ["bare-write"])


if __name__ == "__main__":
    main()
