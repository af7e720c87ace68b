"""Throughput of ``GET /v1/locations/{loc}`` on the sidecar vs a bare FastAPI route.

What it measures: requests per second of the sidecar's location read (backend read, pydantic
validation and serialisation, ETag, the request-metrics middleware, the thread pool) against a
bare FastAPI app whose route of the same path returns the same JSON from a dict. Both apps run
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
    python bench/http.py --rounds 31 --seconds 2 --connections 16 --backend sqlite:///x.db
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
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

LOCATION = "us-east-1"
PATH = f"/v1/locations/{LOCATION}"
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


async def _connection(port: int, deadline: float) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = f"GET {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    done = 0
    try:
        while time.perf_counter() < deadline:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"unexpected answer: {head[:200]!r}")
            match = _CONTENT_LENGTH.search(head)
            if match is None:
                raise RuntimeError(f"no content-length: {head[:200]!r}")
            await reader.readexactly(int(match.group(1)))
            done += 1
    finally:
        writer.close()
    return done


async def _load(port: int, seconds: float, connections: int) -> float:
    start = time.perf_counter()
    counts = await asyncio.gather(
        *(_connection(port, start + seconds) for _ in range(connections))
    )
    return sum(counts) / (time.perf_counter() - start)


def measure(port: int, seconds: float, connections: int) -> float:
    """Requests per second over ``seconds`` with ``connections`` keep-alive connections."""
    return asyncio.run(_load(port, seconds, connections))


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--backend", default=None, help="backend URL (default: a temp SQLite)")
    parser.add_argument("--serve", choices=["locstatus", "bare-async", "bare-sync"])
    args = parser.parse_args()

    if args.serve == "locstatus":
        serve_locstatus(args.backend)
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
        mgr.close()
        servers = {
            name: _spawn("--serve", name, "--backend", url)
            for name in ("locstatus", "bare-async", "bare-sync")
        }
        try:
            bodies = {name: _body(port) for name, (_, port) in servers.items()}
            assert bodies["locstatus"] == bodies["bare-async"] == bodies["bare-sync"], bodies
            for _, port in servers.values():  # warm up
                measure(port, 1.0, args.connections)
            results: dict[str, list[float]] = {name: [] for name in servers}
            order = list(servers)
            for r in range(args.rounds):
                for name in order if r % 2 == 0 else reversed(order):
                    results[name].append(
                        measure(servers[name][1], args.seconds, args.connections)
                    )
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(10)

    med = {name: statistics.median(values) for name, values in results.items()}
    print(f"GET {PATH}: {args.rounds} interleaved rounds x {args.seconds:g}s, "
          f"{args.connections} keep-alive connections, backend {url.split(':')[0]}")
    for name, values in results.items():
        rounds = " ".join(f"{v:7.0f}" for v in values)
        print(f"  {name:11s} median {med[name]:7.0f} req/s   rounds: {rounds}")
    for base in ("bare-async", "bare-sync"):
        per_round = [a / b for a, b in zip(results["locstatus"], results[base], strict=True)]
        print(f"  locstatus / {base:10s} = {statistics.median(per_round):.2f}x median of per-round "
              f"ratios (ratio of medians {med['locstatus'] / med[base]:.2f}x)")


if __name__ == "__main__":
    main()
