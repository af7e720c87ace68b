"""Propagation of a bulk change (issue 21): a ``pause all`` of N locations until every one of
16 agents has seen it and acknowledged it, against the raw batched write of the same records.

Used by ``bench/bulk.py --only propagate`` (the same stores, raw baselines and server as the
other bulk figures). One store holds N locations and 16 agents applying ``replication``
everywhere (in this process, each with its own backend connection, or with ``--processes``
one OS process each); a second store of N locations is the raw baseline's. Each round
(interleaved, who goes first alternates):

- **locstatus**: ``Manager.bulk(Operation.pause(...))`` over every location, then wait until
  all 16 agents acknowledged the new generation at every location. Measured: the bulk call
  (``write``), and from its return to the last acknowledgement (``propagate``: the hints out,
  the records read, the handlers run, the acknowledgements written), and their sum
  (``total``). Then ``resume all`` back, also waited for (not timed).
- **raw**: the raw batched write of the same change (bench/bulk.py :data:`RAW`: SQLite
  ``executemany`` in one transaction, kazoo pipelined multi-ops).

Ratio (target <= 2x): ``propagate`` / raw write time; ``total`` / raw is reported too. An
agent counts as done when its ``acks`` counter moved by N and every location's
``observed_generation`` is the new one (checked then, so a re-acknowledgement cannot end a
round early).
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from collections.abc import Callable
from typing import Any

from locstatus import Operation, connect
from locstatus.agent import Agent

SERVICE = "replication"
CTX = mp.get_context("spawn")
POLL = 0.05
"""Seconds between two looks at the agents' counters (each look takes every agent's lock: a
faster poll slows the agents it measures)."""


def _agent(url: str, index: int) -> tuple[Agent, Any]:
    client = connect(url, services=[SERVICE])
    agent = client.agent(f"burst-{index:02d}", services=[SERVICE], lease_seconds=60)
    agent.on_pause(SERVICE)(_noop)
    agent.on_resume(SERVICE)(_noop)
    return agent, client


def _noop(location: str) -> None:
    pass


def _generation_everywhere(agent: Agent, locations: list[str], generation: int) -> bool:
    return all(agent.observed_generation(loc, SERVICE) == generation for loc in locations)


class InProcess:
    """16 agents in this process, one backend connection each."""

    def __init__(self, url: str, n: int, locations: list[str]) -> None:
        self.locations = locations
        self.agents: list[Agent] = []
        self.clients: list[Any] = []
        for i in range(n):
            agent, client = _agent(url, i)
            self.agents.append(agent)
            self.clients.append(client)
        for agent in self.agents:
            agent.start(wait=False)

    def acks(self) -> list[int]:
        return [a.metrics()["acks"] for a in self.agents]

    def counts(self) -> dict[str, int]:
        """The fleet's settle work so far: settle results stored by the agents (``settles``),
        the compare-and-set writes their managers made (``writes``: settles only, acks are not
        writes) and the batched ones that conflicted and were re-read alone (``stale``)."""
        return {
            "settles": sum(a.metrics()["settles"] for a in self.agents),
            "writes": sum(c.stats["writes"] for c in self.clients),
            "stale": sum(c.stats["stale_hints"] + c.stats["conflicts"] for c in self.clients),
        }

    def wait(self, base: list[int], generation: int, timeout: float) -> float:
        """Monotonic time at which the last agent had acknowledged ``generation`` everywhere."""
        n = len(self.locations)
        done: dict[int, float] = {}
        deadline = time.monotonic() + timeout
        while len(done) < len(self.agents):
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"{len(done)}/{len(self.agents)} agents done in {timeout} s")
            for i, agent in enumerate(self.agents):
                if i in done or agent.metrics()["acks"] - base[i] < n:
                    continue
                if _generation_everywhere(agent, self.locations, generation):
                    done[i] = now
            time.sleep(POLL)
        return max(done.values())

    def close(self) -> None:
        for agent in self.agents:
            agent.stop()
        for client in self.clients:
            client.backend.close()


def _child(url: str, index: int, locations: list[str], cmd: Any, out: Any) -> None:
    """One agent process: answers ``("wait", base_acks, generation)`` with the monotonic time
    (system-wide on Linux) at which it had acknowledged ``generation`` everywhere."""
    agent, client = _agent(url, index)
    agent.start(wait=False)
    n = len(locations)
    try:
        while True:
            msg = cmd.get()
            if msg[0] == "stop":
                return
            if msg[0] == "acks":
                out.put((index, agent.metrics()["acks"]))
                continue
            _, base, generation = msg
            while True:
                if agent.metrics()["acks"] - base >= n and _generation_everywhere(
                    agent, locations, generation
                ):
                    out.put((index, time.monotonic()))
                    break
                time.sleep(POLL)
    finally:
        agent.stop()
        client.backend.close()


class Processes:
    """16 agents, one OS process each."""

    def __init__(self, url: str, n: int, locations: list[str]) -> None:
        self.cmds = [CTX.Queue() for _ in range(n)]
        self.out = CTX.Queue()
        self.procs = [
            CTX.Process(target=_child, args=(url, i, locations, self.cmds[i], self.out),
                        daemon=True)
            for i in range(n)
        ]
        for p in self.procs:
            p.start()

    def acks(self) -> list[int]:
        for q in self.cmds:
            q.put(("acks",))
        got = dict(self.out.get(timeout=600) for _ in self.cmds)
        return [got[i] for i in range(len(self.cmds))]

    def wait(self, base: list[int], generation: int, timeout: float) -> float:
        for i, q in enumerate(self.cmds):
            q.put(("wait", base[i], generation))
        return max(self.out.get(timeout=timeout)[1] for _ in self.cmds)

    def close(self) -> None:
        for q in self.cmds:
            q.put(("stop",))
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


def settle_start(fleet: InProcess | Processes, n: int, timeout: float) -> float:
    """Wait until every agent acknowledged generation 0 everywhere (its start: on_resume at
    every location); seconds it took."""
    t = time.monotonic()
    end = fleet.wait([0] * len(fleet.acks()), 0, timeout)
    return end - t


def run(
    ls_url: str,
    raw: Any,
    locations: list[str],
    *,
    agents: int,
    rounds: int,
    processes: bool,
    progress: Callable[[str], None],
    timeout: float = 600.0,
) -> dict[str, Any]:
    """The propagation figures (see the module docstring). ``ls_url``: a store already holding
    ``locations`` (generation 0, running), no worker registered; ``raw``: the raw baseline on
    a store of its own (bench/bulk.py :class:`Raw`)."""
    mgr = connect(ls_url, services=[SERVICE])
    n = len(locations)
    fleet: InProcess | Processes = (Processes if processes else InProcess)(
        ls_url, agents, locations
    )
    res: dict[str, list[float]] = {
        "write": [], "propagate": [], "total": [], "raw": [], "cpu": [], "raw_cpu": [],
    }
    counted: list[dict[str, int]] = []
    try:
        started = settle_start(fleet, n, timeout)
        progress(f"{agents} agents started and acknowledged {n} locations in {started:.1f} s")
        generation = 0
        for r in range(rounds):
            def ours() -> None:
                nonlocal generation
                base = fleet.acks()
                before = fleet.counts() if isinstance(fleet, InProcess) else {}
                c0 = time.process_time()
                t0 = time.monotonic()
                report = mgr.bulk(Operation.pause(SERVICE))
                t1 = time.monotonic()
                assert len(report.items) == n and not report.failed, report.failed[:3]
                generation += 1
                t2 = fleet.wait(base, generation, timeout)
                res["cpu"].append(time.process_time() - c0)
                res["write"].append(t1 - t0)
                res["propagate"].append(t2 - t1)
                res["total"].append(t2 - t0)
                if isinstance(fleet, InProcess):
                    after = fleet.counts()
                    counted.append({k: after[k] - before[k] for k in after})
                base = fleet.acks()
                mgr.bulk(Operation.resume(SERVICE))
                generation += 1
                fleet.wait(base, generation, timeout)

            def theirs() -> None:
                c0 = time.process_time()
                t0 = time.monotonic()
                raw.flip("pause")
                res["raw"].append(time.monotonic() - t0)
                res["raw_cpu"].append(time.process_time() - c0)
                raw.flip("resume")

            pair = [ours, theirs] if r % 2 == 0 else [theirs, ours]
            for fn in pair:
                fn()
            progress(
                f"propagate round {r + 1}/{rounds}: write {res['write'][-1]:.2f} s, "
                f"then all {agents} agents acknowledged in {res['propagate'][-1]:.2f} s "
                f"(total {res['total'][-1]:.2f} s, CPU {res['cpu'][-1]:.2f} s of this "
                f"process); raw write {res['raw'][-1]:.2f} s"
                + (f"; settle work during it {counted[-1]}" if counted else "")
            )
    finally:
        fleet.close()
        mgr.backend.close()
    med = {k: statistics.median(v) for k, v in res.items()}
    ratios = [p / w for p, w in zip(res["propagate"], res["raw"], strict=True)]
    totals = [p / w for p, w in zip(res["total"], res["raw"], strict=True)]
    return {
        "agents": agents, "locations": n, "rounds": rounds,
        "mode": "processes" if processes else "in-process", "start_s": round(started, 3),
        **{f"{k}_s": round(v, 3) for k, v in med.items()},
        "ratio": round(statistics.median(ratios), 3),
        "total_ratio": round(statistics.median(totals), 3),
        **{f"rounds_{k}_s": [round(x, 3) for x in v] for k, v in res.items()},
        "rounds_settle_work": counted,
    }
