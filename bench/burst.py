"""Propagation of a bulk change (issue 21): a ``pause all`` of N locations until every one of
16 agents has seen it and acknowledged it, against the raw batched write of the same records.

Used by ``bench/bulk.py --only propagate`` (the same stores, raw baselines and server as the
other bulk figures). One store holds N locations and 16 agents applying ``replication``
everywhere, each in its own OS process (as workers run: one agent per worker process; with
``--in-process`` all 16 in the bench's process instead, one backend connection each, all on
one interpreter lock); a second store of N locations is the raw baseline's. Each round
(interleaved, who goes first alternates):

- **locstatus**: ``Manager.bulk(Operation.pause(...))`` over every location, then wait until
  all 16 agents acknowledged the new generation at every location. Timed, on the monotonic
  clock (system-wide on Linux, so the agents' processes and the bench's share it): from the
  bulk call's start to the moment the last of the 16 agents had every acknowledgement of the
  new generation stored (``total``: the write, the hints out, the records read, the handlers
  run, the acknowledgements written and committed); its two parts, the bulk call (``write``)
  and from its return to that last acknowledgement (``propagate``). Then ``resume all``
  back, also waited for (not timed).
- **raw**: the raw batched write of the same change with the same client (bench/bulk.py
  :data:`RAW`: SQLite ``executemany`` in one transaction, kazoo pipelined multi-ops, pymongo
  unordered ``bulk_write``).

- **floor** (SQLite): the least the task needs, with the same client and no locstatus: the
  same raw write, then 16 processes (already started, one connection each, as the agents)
  each read the changed rows (one ``SELECT`` of every row whose version moved) and write
  their 10 000 acknowledgements with one ``executemany`` in one transaction. Timed from the
  write's start to the last process's commit. It is what any implementation on this host
  would pay at least: when the floor itself is above 2x the raw write, the target cannot be
  met here.

Ratio (target <= 2x): ``total`` / raw write time (``propagate`` / raw is reported too), and
``total`` / floor.

When an agent is done: its ``acks`` counter (acknowledgements stored: counted once
``Backend.ack_many`` returned them written) moved by N since the round's start and every
location's ``observed_generation`` is the new one (checked then, so a re-acknowledgement
cannot end a round early). Each agent process looks every :data:`POLL` seconds, so an agent's
end time is late by at most that much.

Also reported per round: the CPU seconds of the bench's process (the bulk call; with
``--in-process`` the agents too) and of the 16 agent processes together from the round's start
to their end time (their whole burst work, settling included), the fleet's counters during the
round (hints received, full re-reads, settles stored, acknowledgements), and the load average.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sqlite3
import statistics
import time
from collections.abc import Callable
from typing import Any

from locstatus import Operation, connect
from locstatus.agent import Agent

SERVICE = "replication"
CTX = mp.get_context("spawn")
POLL = 0.02
"""Seconds between two looks of an agent process at its own counters (the end time's
resolution)."""
COUNTED = ("hints", "resyncs", "settles", "acks", "backend_errors")
"""The agents' counters reported per round (summed over the fleet)."""


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


def _done(agent: Agent, base: int, locations: list[str], generation: int) -> bool:
    return agent.metrics()["acks"] - base >= len(locations) and _generation_everywhere(
        agent, locations, generation
    )


def _counts(agent: Agent) -> dict[str, int]:
    m = agent.metrics()
    return {k: m.get(k, 0) for k in COUNTED}


class Mark:
    """Where one agent stood at a round's start: its ``acks`` counter, its CPU seconds (of
    its process) and its counters."""

    def __init__(self, acks: int, cpu: float, counts: dict[str, int]) -> None:
        self.acks, self.cpu, self.counts = acks, cpu, counts


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

    def mark(self) -> list[Mark]:
        cpu = time.process_time()
        return [Mark(a.metrics()["acks"], cpu, _counts(a)) for a in self.agents]

    def wait(self, marks: list[Mark], generation: int, timeout: float
             ) -> tuple[float, float, dict[str, int]]:
        """(monotonic time at which the last agent had acknowledged ``generation``
        everywhere, CPU seconds of this process since the marks, the fleet's counters since
        the marks)."""
        done: dict[int, float] = {}
        deadline = time.monotonic() + timeout
        while len(done) < len(self.agents):
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"{len(done)}/{len(self.agents)} agents done in {timeout} s")
            for i, agent in enumerate(self.agents):
                if i not in done and _done(agent, marks[i].acks, self.locations, generation):
                    done[i] = now
            time.sleep(POLL)
        now = [_counts(a) for a in self.agents]
        counts = {k: sum(c[k] - m.counts[k] for c, m in zip(now, marks, strict=True))
                  for k in COUNTED}
        return max(done.values()), time.process_time() - marks[0].cpu, counts

    def close(self) -> None:
        for agent in self.agents:
            agent.stop()
        for client in self.clients:
            client.backend.close()


def _child(url: str, index: int, locations: list[str], cmd: Any, out: Any) -> None:
    """One agent process. Answers ``("mark",)`` with its :class:`Mark` fields, and ``("wait",
    base_acks, generation, cpu, counts)`` with (monotonic end time, CPU seconds since ``cpu``,
    counters since ``counts``) once it had acknowledged ``generation`` everywhere."""
    agent, client = _agent(url, index)
    agent.start(wait=False)
    try:
        while True:
            msg = cmd.get()
            if msg[0] == "stop":
                return
            if msg[0] == "mark":
                out.put((index, (agent.metrics()["acks"], time.process_time(), _counts(agent))))
                continue
            _, base, generation, cpu, counts = msg
            while not _done(agent, base, locations, generation):
                time.sleep(POLL)
            end = time.monotonic()
            now = _counts(agent)
            out.put((index, (end, time.process_time() - cpu,
                             {k: now[k] - counts[k] for k in COUNTED})))
    finally:
        agent.stop()
        client.backend.close()


def _stop(cmds: list[Any], procs: list[Any]) -> None:
    """Ask each child process to stop, wait for it (30 s at most), kill it past that."""
    for q in cmds:
        q.put(("stop",))
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()


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

    def _ask(self, msgs: list[tuple[Any, ...]], timeout: float) -> list[Any]:
        for q, msg in zip(self.cmds, msgs, strict=True):
            q.put(msg)
        got = dict(self.out.get(timeout=timeout) for _ in self.cmds)
        return [got[i] for i in range(len(self.cmds))]

    def mark(self) -> list[Mark]:
        return [Mark(*m) for m in self._ask([("mark",)] * len(self.cmds), 600)]

    def wait(self, marks: list[Mark], generation: int, timeout: float
             ) -> tuple[float, float, dict[str, int]]:
        """As :meth:`InProcess.wait`; the CPU seconds are the agent processes' together."""
        got = self._ask([("wait", m.acks, generation, m.cpu, m.counts) for m in marks], timeout)
        counts = {k: sum(g[2][k] for g in got) for k in COUNTED}
        return max(g[0] for g in got), sum(g[1] for g in got), counts

    def close(self) -> None:
        _stop(self.cmds, self.procs)


def _floor_child(path: str, index: int, cmd: Any, out: Any) -> None:
    """One process of the floor: on ``("go", versions)`` (sent once the write committed;
    ``versions``: JSON ``{location: version}`` from before it) read the rows whose version
    moved, write one acknowledgement each in one transaction, answer the monotonic time of
    its commit."""
    db = sqlite3.connect(path, isolation_level=None, timeout=60)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS floor_acks (location TEXT NOT NULL, worker TEXT "
               "NOT NULL, generation INTEGER NOT NULL, PRIMARY KEY (location, worker))")
    worker = f"floor-{index:02d}"
    while True:
        msg = cmd.get()
        if msg[0] == "stop":
            db.close()
            return
        before: dict[str, int] = json.loads(msg[1])
        acks = [(loc, worker, json.loads(data)["services"][SERVICE]["generation"])
                for loc, version, data in db.execute(
                    "SELECT location, version, data FROM locations")
                if before.get(loc) != version]
        db.execute("BEGIN IMMEDIATE")
        db.executemany("INSERT OR REPLACE INTO floor_acks VALUES (?, ?, ?)", acks)
        db.execute("COMMIT")
        out.put((index, time.monotonic(), len(acks)))


class Floor:
    """The floor's 16 processes on the raw baseline's SQLite store (see the module
    docstring)."""

    def __init__(self, path: str, n: int) -> None:
        self.path = path
        self.cmds = [CTX.Queue() for _ in range(n)]
        self.out = CTX.Queue()
        self.procs = [CTX.Process(target=_floor_child, args=(self.path, i, self.cmds[i],
                                                             self.out), daemon=True)
                      for i in range(n)]
        for p in self.procs:
            p.start()

    def versions(self) -> str:
        db = sqlite3.connect(self.path)
        try:
            return json.dumps(dict(db.execute("SELECT location, version FROM locations")))
        finally:
            db.close()

    def round(self, write: Callable[[], None], n: int, timeout: float) -> tuple[float, float]:
        """(seconds from the write's start to the last process's commit, seconds of the
        write); each process must have acknowledged ``n`` rows."""
        before = self.versions()
        t0 = time.monotonic()
        write()
        t1 = time.monotonic()
        for q in self.cmds:
            q.put(("go", before))
        got = [self.out.get(timeout=timeout) for _ in self.cmds]
        assert all(g[2] == n for g in got), [g[2] for g in got]
        return max(g[1] for g in got) - t0, t1 - t0

    def close(self) -> None:
        _stop(self.cmds, self.procs)


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
    floor = Floor(raw.db.execute("PRAGMA database_list").fetchone()[2], agents) if isinstance(
        getattr(raw, "db", None), sqlite3.Connection) else None
    res: dict[str, list[float]] = {
        "write": [], "propagate": [], "total": [], "raw": [], "cpu": [], "agents_cpu": [],
        "raw_cpu": [], "load": [], **({"floor": [], "floor_write": []} if floor else {}),
    }
    counted: list[dict[str, int]] = []
    try:
        t = time.monotonic()
        marks = fleet.mark()
        for m in marks:  # its first acknowledgements may be in before the mark
            m.acks = 0
        end, _, _ = fleet.wait(marks, 0, timeout)
        started = end - t
        progress(f"{agents} agents ({'processes' if processes else 'in-process'}) started "
                 f"and acknowledged {n} locations in {started:.1f} s")
        generation = 0
        for r in range(rounds):
            def ours() -> None:
                nonlocal generation
                marks = fleet.mark()
                c0 = time.process_time()
                t0 = time.monotonic()
                report = mgr.bulk(Operation.pause(SERVICE))
                t1 = time.monotonic()
                res["cpu"].append(time.process_time() - c0)
                assert len(report.items) == n and not report.failed, report.failed[:3]
                generation += 1
                t2, agents_cpu, counts = fleet.wait(marks, generation, timeout)
                res["write"].append(t1 - t0)
                res["propagate"].append(t2 - t1)
                res["total"].append(t2 - t0)
                res["agents_cpu"].append(agents_cpu)
                counted.append(counts)
                marks = fleet.mark()
                mgr.bulk(Operation.resume(SERVICE))
                generation += 1
                fleet.wait(marks, generation, timeout)

            def theirs() -> None:
                c0 = time.process_time()
                t0 = time.monotonic()
                raw.flip("pause")
                res["raw"].append(time.monotonic() - t0)
                res["raw_cpu"].append(time.process_time() - c0)
                raw.flip("resume")
                if floor is not None:  # the raw write again, and the 16 processes' share
                    total, wrote = floor.round(lambda: raw.flip("pause"), n, timeout)
                    res["floor"].append(total)
                    res["floor_write"].append(wrote)
                    raw.flip("resume")

            pair = [ours, theirs] if r % 2 == 0 else [theirs, ours]
            for fn in pair:
                fn()
            res["load"].append(os.getloadavg()[0])
            progress(
                f"propagate round {r + 1}/{rounds} (load {res['load'][-1]:.1f}): all "
                f"{agents} agents acknowledged {res['total'][-1]:.2f} s after the write's "
                f"start (write {res['write'][-1]:.2f} s, then {res['propagate'][-1]:.2f} s); "
                f"raw write {res['raw'][-1]:.2f} s; CPU: bulk call {res['cpu'][-1]:.2f} s, "
                f"agents {res['agents_cpu'][-1]:.2f} s; fleet counters {counted[-1]}"
                + (f"; floor (raw write then {agents} processes reading the changed rows and "
                   f"writing their {n} acknowledgements, one executemany each) "
                   f"{res['floor'][-1]:.2f} s = {res['floor'][-1] / res['raw'][-1]:.2f}x raw, "
                   f"locstatus {res['total'][-1] / res['floor'][-1]:.2f}x the floor"
                   if floor is not None else "")
            )
    finally:
        fleet.close()
        if floor is not None:
            floor.close()
        mgr.backend.close()
    med = {k: statistics.median(v) for k, v in res.items() if k != "load"}
    totals = [p / w for p, w in zip(res["total"], res["raw"], strict=True)]
    ratios = [p / w for p, w in zip(res["propagate"], res["raw"], strict=True)]
    floors = {} if floor is None else {
        "floor_ratio": round(statistics.median(
            t / f for t, f in zip(res["total"], res["floor"], strict=True)), 3),
        "floor_raw_ratio": round(statistics.median(
            f / w for f, w in zip(res["floor"], res["raw"], strict=True)), 3),
    }
    return {
        "agents": agents, "locations": n, "rounds": rounds,
        "mode": "processes" if processes else "in-process", "start_s": round(started, 3),
        **{f"{k}_s": round(v, 3) for k, v in med.items()},
        "ratio": round(statistics.median(totals), 3),
        "propagate_ratio": round(statistics.median(ratios), 3), **floors,
        **{f"rounds_{k}_s": [round(x, 3) for x in v] for k, v in res.items() if k != "load"},
        "load_averages": [round(x, 1) for x in res["load"]],
        "rounds_counters": counted,
    }
