"""Fleet-scale bulk operations (issue 21): ``pause all`` / ``resume all`` of N locations x 1
service and ``locations sync`` of a fresh store, through the manager, against a raw batched
write of the same records with the same client.

Each round (interleaved, same process, same durability settings; who goes first alternates)
times, on two stores of N locations each (one for locstatus, one for the baseline):

- ``pause``: ``Manager.bulk(Operation.pause("replication"))`` over every location, with one live
  worker applying the service registered (the usual fleet: each location is then its one write,
  left ``pausing`` for the workers to acknowledge) against the raw write: read every row, parse
  it, set the service's state, serialise it, and write every row with a versioned ``UPDATE``
  plus one history row each, batched the backend's fastest way (SQLite: ``executemany`` in one
  ``BEGIN IMMEDIATE`` transaction; ZooKeeper: kazoo multi-ops of several locations, sent
  asynchronously; MongoDB: one unordered ``bulk_write`` of the same version-guarded updates
  per 1000 locations plus the ``insert_many`` of their history, same client options; see
  :data:`RAW`);
- ``resume``: the same back;
- ``sync``: ``Manager.sync_locations`` of N new locations into an empty store against the raw
  creates of the same rows (SQLite: ``executemany`` of the records, their history rows and
  incarnations in one transaction).

The ratio is raw time / locstatus time (1.0: as fast as the raw write; target >= 0.5x).
Absolute targets (issue 21): pause all 100 000 on SQLite <= 3 s, on ZooKeeper <= 20 s; sync
100 000 on SQLite <= 10 s.

Each side's CPU seconds in this process are reported beside its wall seconds: on a shared
machine they move least with the load.

Run: ``python bench/bulk.py [--backend sqlite|zk|mongo] [--locations 10000] [--rounds 5]
[--only pause,resume,sync,propagate] [--agents 16] [--in-process] [--raw-reads get|multiread]
[--json out.json]``;
ZooKeeper and MongoDB start a local server (tests/support/servers.py: ZooKeeper with
``--zk-heap 2g``; SecantusDB, or ``$LOCSTATUS_TEST_MONGO_URI``) unless ``--url`` names one
(MongoDB: a ``mongodb://`` server URL; each store is a fresh database on it, dropped after).
``propagate`` (not run by default): a ``pause all`` until 16 agents, one OS process each
(``--in-process``: all in the bench's process), acknowledged it, timed from the bulk call's
start to the last acknowledgement stored, against the raw write (bench/burst.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from locstatus import Manager, Operation  # noqa: E402
from locstatus.backends import Backend, open_backend  # noqa: E402
from locstatus.models import WorkerInfo  # noqa: E402

SERVICE = "replication"
STATES = {"pause": "pausing", "resume": "resuming"}


def names(n: int) -> list[str]:
    return [f"loc-{i:06d}" for i in range(n)]


def history_entry(location: str, version: int, event: str, to_state: str | None, op_id: str,
                  from_state: str | None = None, generation: int = 1) -> dict[str, Any]:
    """One history entry with every field locstatus stores, in its order: a create's
    (``event`` "create") is of the whole location (service ``*``, no state, generation 0);
    ``generation``: the service's after a flip (each pause or resume bumps it)."""
    create = event == "create"
    return {
        "op_id": op_id, "at": datetime.now(UTC).isoformat()[:-6] + "Z", "location": location,
        "service": "*" if create else SERVICE, "event": event, "from_state": from_state,
        "to_state": None if create else to_state, "generation": 0 if create else generation,
        "actor": None, "reason": None, "resume_at": None, "version": version,
    }


def history_row(location: str, version: int, event: str, to_state: str | None, op_id: str,
                from_state: str | None = None) -> str:
    """One history write as locstatus stores it (a JSON list of one entry)."""
    return json.dumps([history_entry(location, version, event, to_state, op_id, from_state)],
                      separators=(",", ":"))


class Raw:
    """A raw baseline on one store: ``flip(event)`` sets every location's service to the
    event's state with versioned batched writes; ``create(locations)`` creates them."""

    def flip(self, event: str) -> None:
        raise NotImplementedError

    def create(self, locations: list[str]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class RawSQLite(Raw):
    """``sqlite3`` on the same file settings as locstatus (WAL, ``synchronous=FULL``)."""

    def __init__(self, url: str) -> None:
        path = url.removeprefix("sqlite:///")
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")

    def flip(self, event: str) -> None:
        op_id = uuid.uuid4().hex
        state = STATES[event]
        rows = self.db.execute("SELECT location, version, data FROM locations").fetchall()
        updates, histories = [], []
        for location, version, data in rows:
            doc = json.loads(data)
            was = doc["services"][SERVICE]["state"]
            doc["services"][SERVICE]["state"] = state
            doc["services"][SERVICE]["op_id"] = op_id
            updates.append((version + 1, json.dumps(doc, separators=(",", ":")), location, version))
            histories.append((location, version + 1,
                              history_row(location, version + 1, event, state, op_id, was)))
        self.db.execute("BEGIN IMMEDIATE")
        cur = self.db.executemany(
            "UPDATE locations SET version = ?, data = ? WHERE location = ? AND version = ?",
            updates,
        )
        assert cur.rowcount == len(updates), (cur.rowcount, len(updates))
        self.db.executemany(
            "INSERT INTO history (location, version, data) VALUES (?, ?, ?)", histories
        )
        self.db.execute("COMMIT")

    def create(self, locations: list[str]) -> None:
        now = datetime.now(UTC).isoformat()
        op_id = uuid.uuid4().hex
        records, histories = [], []
        for location in locations:
            doc = {"format": 1, "services": {SERVICE: {
                "state": "running", "generation": 0, "resume_at": None, "reason": None,
                "actor": None, "op_id": op_id, "updated_at": now}}, "deleted_at": None}
            records.append((location, 1, json.dumps(doc, separators=(",", ":"))))
            histories.append((location, 1, history_row(location, 1, "create", None, op_id)))
        self.db.execute("BEGIN IMMEDIATE")
        self.db.executemany(
            "INSERT INTO locations (location, version, data) VALUES (?, ?, ?)", records
        )
        self.db.executemany(
            "INSERT INTO history (location, version, data) VALUES (?, ?, ?)", histories
        )
        self.db.executemany(
            "INSERT INTO incarnations (location, last) VALUES (?, 1)",
            [(r[0],) for r in records],
        )
        self.db.execute("COMMIT")

    def close(self) -> None:
        self.db.close()


RAW: dict[str, Callable[[str], Raw]] = {"sqlite": RawSQLite}
"""backend name -> factory(url of a store locstatus created) -> its raw baseline."""


class Stores:
    """Fresh stores of one backend kind: ``new()`` gives the URL of an empty one."""

    def __init__(self, backend: str, url: str | None, tmp: str) -> None:
        self.backend, self.base, self.tmp = backend, url, tmp
        self.count = 0

    def new(self) -> str:
        self.count += 1
        if self.backend == "sqlite":
            return f"sqlite:///{self.tmp}/store-{self.count}.db"
        assert self.base is not None
        if self.backend == "mongo":
            sep = "&" if "?" in self.base else "?"
            return f"{self.base}{sep}database=bench_bulk_{uuid.uuid4().hex[:8]}"
        return f"{self.base.rstrip('/')}-{uuid.uuid4().hex[:8]}"


def live_worker(backend: Backend) -> None:
    """One worker applying the service everywhere, its lease an hour long: a bulk pause is then
    one write per location, left pausing (no settle), as in a fleet with workers."""
    backend.put_worker(WorkerInfo(
        worker_id="bench-worker", services=(SERVICE,), host="bench", pid=os.getpid(),
        lease_expires_at=datetime.now(UTC) + timedelta(hours=1),
    ))


CPU: dict[str, dict[str, list[float]]] = {}
"""operation -> side -> this process's CPU seconds per round (``time.process_time``): on a
shared machine the wall time of both sides moves with the load, what each side computes does
not (SQLite's own work is in-process; a ZooKeeper server's is not counted)."""


SERVER_PID: int | None = None
"""The local ZooKeeper server started for the run (None: none, or not ours to measure)."""
SERVER_CPU: dict[str, dict[str, list[float]]] = {}
"""operation -> side -> that server's CPU seconds per round (user + system, from /proc): with
ZooKeeper most of the work is the server's, and on a shared machine its CPU seconds move less
with the load than either side's wall time."""


def server_cpu() -> float | None:
    """The CPU seconds the local ZooKeeper server has used so far (None: not measurable)."""
    if SERVER_PID is None:
        return None
    try:
        fields = Path(f"/proc/{SERVER_PID}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(fn: Callable[[], Any], cpu: list[float] | None = None,
          server: list[float] | None = None) -> float:
    """Wall seconds of ``fn()``; its CPU seconds appended to ``cpu``, the local server's
    (when measurable) to ``server``."""
    t, c, s = time.perf_counter(), time.process_time(), server_cpu()
    fn()
    if cpu is not None:
        cpu.append(time.process_time() - c)
    if server is not None and s is not None and (after := server_cpu()) is not None:
        server.append(after - s)
    return time.perf_counter() - t


def run(backend: str, url: str | None, n: int, rounds: int, only: set[str], tmp: str,
        progress: Callable[[str], None]) -> dict[str, Any]:
    stores = Stores(backend, url, tmp)
    locations = names(n)
    wanted = {loc: [SERVICE] for loc in locations}
    results: dict[str, dict[str, list[float]]] = {
        k: {"locstatus": [], "raw": []} for k in ("pause", "resume", "sync") if k in only
    }
    ls_url, raw_url = stores.new(), stores.new()
    mgr = Manager(open_backend(ls_url), services=(SERVICE,))
    build = timed(lambda: mgr.sync_locations(wanted))
    live_worker(mgr.backend)
    Manager(open_backend(raw_url), services=(SERVICE,)).sync_locations(wanted)
    raw = RAW[backend](raw_url)
    progress(f"built 2 stores of {n} locations ({build:.1f} s for the locstatus one)")
    loads: list[float] = []  # the 1-minute load average as each round ends
    for r in range(rounds):
        first_ls = r % 2 == 0
        for event in ("pause", "resume"):
            if event not in results and not ({"pause", "resume"} & results.keys()):
                continue
            op = Operation.pause(SERVICE) if event == "pause" else Operation.resume(SERVICE)
            pair: list[tuple[str, Callable[[], Any]]] = [
                ("locstatus", lambda op=op: _checked(mgr.bulk(op), n)),
                ("raw", lambda event=event: raw.flip(event)),
            ]
            for who, fn in (pair if first_ls else pair[::-1]):
                cpu: list[float] = []
                served: list[float] = []
                took = timed(fn, cpu, served)  # an event not asked for still runs (untimed),
                if event in results:  # so that each round's other one is a real write
                    results[event][who].append(took)
                    CPU.setdefault(event, {}).setdefault(who, []).extend(cpu)
                    SERVER_CPU.setdefault(event, {}).setdefault(who, []).extend(served)
        if "sync" in results:
            ls_new, raw_new = stores.new(), stores.new()
            fresh = Manager(open_backend(ls_new), services=(SERVICE,))
            raw_store = Manager(open_backend(raw_new), services=(SERVICE,))  # the empty schema
            raw_sync = RAW[backend](raw_new)
            pair = [
                ("locstatus", partial(fresh.sync_locations, wanted)),
                ("raw", partial(raw_sync.create, locations)),
            ]
            for who, fn in (pair if first_ls else pair[::-1]):
                results["sync"][who].append(
                    timed(fn, CPU.setdefault("sync", {}).setdefault(who, []))
                )
            for closing in (fresh, raw_store):
                closing.backend.close()
            raw_sync.close()
            _drop(backend, ls_new, raw_new)
        loads.append(os.getloadavg()[0])
        progress(f"round {r + 1}/{rounds} (load {loads[-1]:.1f}): " + ", ".join(
            f"{k} {v['locstatus'][-1]:.2f} s (CPU {CPU[k]['locstatus'][-1]:.2f}"
            f"{_served(k, 'locstatus')}) vs raw {v['raw'][-1]:.2f} s (CPU "
            f"{CPU[k]['raw'][-1]:.2f}{_served(k, 'raw')})"
            for k, v in results.items()
        ))
    raw.close()
    mgr.backend.close()
    _drop(backend, ls_url, raw_url)
    summary: dict[str, Any] = {"backend": backend, "locations": n, "rounds": rounds,
                               "load_average": os.getloadavg()[0],
                               "load_averages": [round(x, 1) for x in loads]}
    for k, v in results.items():
        ls, bare = statistics.median(v["locstatus"]), statistics.median(v["raw"])
        ratios = [b / a for a, b in zip(v["locstatus"], v["raw"], strict=True)]
        summary[k] = {
            "locstatus_s": round(ls, 3), "raw_s": round(bare, 3),
            "ratio": round(statistics.median(ratios), 3),
            "locstatus_per_s": round(n / ls), "raw_per_s": round(n / bare),
            "rounds_locstatus_s": [round(x, 3) for x in v["locstatus"]],
            "rounds_raw_s": [round(x, 3) for x in v["raw"]],
            "locstatus_cpu_s": round(statistics.median(CPU[k]["locstatus"]), 3),
            "raw_cpu_s": round(statistics.median(CPU[k]["raw"]), 3),
            **({
                "locstatus_server_cpu_s": round(statistics.median(srv["locstatus"]), 3),
                "raw_server_cpu_s": round(statistics.median(srv["raw"]), 3),
                "rounds_locstatus_server_cpu_s": [round(x, 3) for x in srv["locstatus"]],
                "rounds_raw_server_cpu_s": [round(x, 3) for x in srv["raw"]],
            } if (srv := SERVER_CPU.get(k, {})).get("locstatus") and srv.get("raw")
               else {}),
            "rounds_locstatus_cpu_s": [round(x, 3) for x in CPU[k]["locstatus"]],
            "rounds_raw_cpu_s": [round(x, 3) for x in CPU[k]["raw"]],
            # the ratio of CPU seconds: what the ratio tends to on an idle machine, where
            # the write's own waits (its fsyncs) are all that wall time adds to CPU time
            "cpu_ratio": round(statistics.median(
                b / a for a, b in zip(CPU[k]["locstatus"], CPU[k]["raw"], strict=True)
            ), 3),
        }
    return summary


def _served(op: str, who: str) -> str:
    """``, server CPU x`` of the last round of ``op`` on side ``who``, when measured."""
    got = SERVER_CPU.get(op, {}).get(who)
    return f", server CPU {got[-1]:.2f}" if got else ""


def propagate(backend: str, url: str | None, n: int, rounds: int, tmp: str,
              progress: Callable[[str], None], *, agents: int, processes: bool
              ) -> dict[str, Any]:
    """bench/burst.py on two fresh stores of ``n`` locations (no worker registered)."""
    import burst

    stores = Stores(backend, url, tmp)
    locations = names(n)
    wanted = {loc: [SERVICE] for loc in locations}
    ls_url, raw_url = stores.new(), stores.new()
    for u in (ls_url, raw_url):
        m = Manager(open_backend(u), services=(SERVICE,))
        m.sync_locations(wanted)
        m.backend.close()
    raw = RAW[backend](raw_url)
    try:
        out = burst.run(ls_url, raw, locations, agents=agents, rounds=rounds,
                        processes=processes, progress=progress)
    finally:
        raw.close()
        _drop(backend, ls_url, raw_url)
    out["load_average"] = os.getloadavg()[0]
    return out


def _checked(report: Any, n: int) -> None:
    """Every location reported, none failed, every one written (a round that wrote nothing
    would time a scan)."""
    assert len(report.items) == n and not report.failed, report.failed[:3]
    assert all(i.outcome == "changed" for i in report.items), report.items[:3]


def _drop(backend: str, *urls: str) -> None:
    if backend == "mongo":
        from pymongo import MongoClient

        from locstatus.backends.mongo import parse_mongo_url

        for url in urls:
            s = parse_mongo_url(url)
            with MongoClient(s.client_url, **s.client_options) as client:
                client.drop_database(s.database)
    if backend == "sqlite":
        for url in urls:
            for suffix in ("", "-wal", "-shm", "-clock"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(url.removeprefix("sqlite:///") + suffix)


@contextlib.contextmanager
def server(backend: str, url: str | None, tmp: str, heap: str = "2g") -> Iterator[str | None]:
    """The base URL of the stores: the given one, or a local server started for the run
    (tests/support/servers.py, stopped by PID on exit) with a ``heap``-sized JVM heap: the
    test fixture's 256 MB holds the tests' stores, not the bench's four stores of 100 000
    locations with their history (it missed heartbeats and expired sessions at 3 x 10 000)."""
    if url is not None or backend == "sqlite":
        yield url
        return
    from support import servers

    if backend == "mongo":
        mongo = servers.start_mongo(tmp)
        try:
            yield mongo.uri
        finally:
            mongo.close()
        return
    # nor the fixture's quick-start JIT and serial collector: with 250 MB of znodes their
    # pauses (5.7 s seen) outlast kazoo's ping and drop the session's connection mid-bulk
    dropped = ("-Xmx", "-Xms", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel")
    opts = [o for o in servers.JVM_OPTS if not o.startswith(dropped)]
    zk = servers.ZooKeeperServer(
        Path(tmp) / "zookeeper", jvm_opts=[*opts, f"-Xms{heap}", f"-Xmx{heap}"]
    ).start()
    global SERVER_PID
    SERVER_PID = zk.pid
    try:
        yield f"zk://{zk.hosts}/bench-bulk"
    finally:
        SERVER_PID = None
        zk.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="sqlite", choices=["sqlite", "zk", "mongo"])
    ap.add_argument("--url", help="a server's base URL (ZooKeeper: zk://host:port/prefix)")
    ap.add_argument("--locations", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", default="pause,resume,sync", help="also: propagate")
    ap.add_argument("--agents", type=int, default=16, help="propagate: agents")
    ap.add_argument("--in-process", action="store_true",
                    help="propagate: the agents in this process (default: one process each)")
    ap.add_argument("--json", help="write the summary here")
    ap.add_argument("--raw-reads", default="get", choices=["get", "multiread"],
                    help="ZooKeeper: how the raw baseline reads the records: one kazoo "
                    "get_async per record (default, kazoo alone), or multiRead requests as "
                    "locstatus reads (bench/raw_bulk_zk.py)")
    ap.add_argument("--zk-heap", default="2g",
                    help="JVM heap of the local ZooKeeper started for the run (default 2g)")
    args = ap.parse_args(argv)
    if args.backend == "zk":
        import raw_bulk_zk  # registers RAW["zk"]

        raw_bulk_zk.READS = args.raw_reads
    if args.backend == "mongo":
        import raw_bulk_mongo  # noqa: F401  (registers RAW["mongo"])
    only = set(args.only.split(","))
    with tempfile.TemporaryDirectory(prefix="locstatus-bulk-") as tmp, \
            server(args.backend, args.url, tmp, args.zk_heap) as base:
        say = partial(print, flush=True)
        summary = run(args.backend, base, args.locations, args.rounds, only - {"propagate"},
                      tmp, say) if only - {"propagate"} else {"backend": args.backend}
        if "propagate" in only:
            summary["propagate"] = propagate(args.backend, base, args.locations, args.rounds,
                                             tmp, say, agents=args.agents,
                                             processes=not args.in_process)
    for k in ("pause", "resume", "sync"):
        if k in summary:
            s = summary[k]
            print(f"{k} all {args.locations} on {args.backend}: locstatus {s['locstatus_s']} s "
                  f"({s['locstatus_per_s']}/s), raw {s['raw_s']} s ({s['raw_per_s']}/s), "
                  f"ratio {s['ratio']}x (target >= 0.5x); CPU of this process: locstatus "
                  f"{s['locstatus_cpu_s']} s, raw {s['raw_cpu_s']} s (ratio {s['cpu_ratio']}x)"
                  + (f"; CPU of the ZooKeeper server: locstatus {s['locstatus_server_cpu_s']} s, "
                     f"raw {s['raw_server_cpu_s']} s" if "raw_server_cpu_s" in s else ""))
    if "propagate" in summary:
        s = summary["propagate"]
        print(f"propagate pause all {args.locations} to {s['agents']} agents ({s['mode']}) on "
              f"{args.backend}: all acknowledged {s['total_s']} s after the write's start "
              f"(write {s['write_s']} s, then {s['propagate_s']} s); raw write {s['raw_s']} s: "
              f"ratio {s['ratio']}x (target <= 2x; after the write only: "
              f"{s['propagate_ratio']}x); CPU: bulk call {s['cpu_s']} s, agents "
              f"{s['agents_cpu_s']} s, raw write {s['raw_cpu_s']} s; load averages "
              f"{s['load_averages']}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
