"""What an on-call engineer alerts on (issue 20; docs/http.md "Metrics to alert on", "Logs"):

- ``deploy/prometheus/alerts.yml`` passes ``promtool check rules`` and its unit tests
  (``alerts_test.yml``, ``promtool test rules``);
- a live sidecar (``locstatus serve --check-interval 1 --log-format json``, its own process, on
  a SQLite store with a paused location, a scheduled resume and a pause a live worker has not
  acknowledged) serves every metric name the rules and the Grafana dashboard
  (``deploy/grafana/locstatus.json``) query, with the per-location, per-worker and check
  values the store holds (no ``locstatus_check_*`` series appeared before);
- per-location series are bounded (``location_series``);
- ``--log-format json``: the sidecar, the check job and a worker agent (the demo worker) log
  one JSON object per line, carrying location, service, op_id and actor where they apply.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from locstatus import connect
from locstatus.api.metrics import Metrics
from locstatus.api.series import location_series
from locstatus.check import KINDS
from locstatus.client import Client
from locstatus.models import LocationStatus, ServiceStatus, State

from support.servers import free_ports

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "locstatus.json"
METRIC_RE = re.compile(r"\blocstatus_[a-z0-9_]+\b")
SVC = "replication"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool not found: install Debian's 'prometheus' package (scripts/setup.sh does) "
            "to check deploy/prometheus/alerts.yml"
        )
    return path


def test_promtool_accepts_the_rules_and_their_unit_tests_pass() -> None:
    check = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS" in check.stdout
    tested = subprocess.run(
        [promtool(), "test", "rules", RULE_TESTS.name], capture_output=True, text=True,
        timeout=60, cwd=RULE_TESTS.parent,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def queried_names() -> set[str]:
    """Every locstatus metric name an alert rule or a dashboard panel queries."""
    names: set[str] = set()
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            names |= set(METRIC_RE.findall(rule["expr"]))

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("expr", "query", "definition") and isinstance(value, str):
                    names.update(METRIC_RE.findall(value))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(json.loads(DASHBOARD.read_text()))
    return names


# -- a live sidecar --------------------------------------------------------------------------


@dataclass
class Live:
    url: str
    mgr: Client
    log_path: Path
    backend: str


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("monitoring")
    backend = f"sqlite:///{tmp / 'locstatus.db'}"
    mgr = connect(backend)
    mgr.sync_locations({loc: [SVC, "lifecycle"] for loc in ("loc-a", "loc-b", "loc-c")})
    mgr.pause("loc-a", SVC, reason="maintenance", actor="ops-a")
    mgr.resume("loc-a", SVC, at=timedelta(hours=2), actor="ops-a")
    release = threading.Event()
    agent = mgr.agent("w-lag", services=[SVC], lease_seconds=5)

    @agent.on_pause(SVC)
    def stop(location: str) -> None:
        if location == "loc-b":
            release.wait(120)  # holds loc-b pausing: w-lag lags behind it

    agent.start()
    mgr.pause("loc-b", SVC, reason="outage", actor="ops-b")
    port = free_ports(1)[0]
    log_path = tmp / "sidecar.log"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "locstatus", "--backend", backend, "serve", "--port",
             str(port), "--check-interval", "1", "--log-format", "json"],
            stdout=log_file, stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if k != "LOCSTATUS_API_TOKEN"},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if "locstatus_check_up" in httpx.get(url + "/metrics", timeout=5).text:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        yield Live(url=url, mgr=mgr, log_path=log_path, backend=backend)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        release.set()
        agent.stop()
        mgr.close()


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)] of one scrape."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(samples: dict[str, list[tuple[dict[str, str], float]]], name: str,
          **labels: str) -> float:
    found = [v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]


def test_every_metric_the_rules_and_the_dashboard_query_is_served(live: Live) -> None:
    needed = queried_names()
    assert len(needed) >= 20  # the rules and the dashboard do query the store
    served = scrape(live.url)
    missing = sorted(n for n in needed if n not in served)
    assert not missing, f"queried but not served by a live sidecar: {missing}"


def test_the_sidecar_serves_per_location_per_worker_and_check_series(live: Live) -> None:
    s = scrape(live.url)
    assert value(s, "locstatus_service_seconds_in_state",
                 location="loc-a", service=SVC, state="paused") >= 0
    assert value(s, "locstatus_service_seconds_in_state",
                 location="loc-b", service=SVC, state="pausing") >= 0
    assert value(s, "locstatus_service_seconds_in_state_max", service=SVC, state="paused") >= 0
    assert value(s, "locstatus_service_seconds_in_state_max", service="lifecycle",
                 state="paused") == 0  # always present, 0 when none
    due = value(s, "locstatus_scheduled_resume_timestamp_seconds", location="loc-a", service=SVC)
    assert abs(due - (time.time() + 7200)) < 600
    assert value(s, "locstatus_transition_lagging_workers",
                 location="loc-b", service=SVC, state="pausing") == 1
    assert value(s, "locstatus_worker_lagging_transitions", worker="w-lag") == 1
    assert "locstatus_worker_clock_offset_seconds" in s
    assert value(s, "locstatus_location_series_omitted") == 0
    # the periodic check's series (none appeared before), under the textfile job's names
    assert value(s, "locstatus_check_up") == 1
    for kind in KINDS:
        value(s, "locstatus_check_findings", kind=kind)
        value(s, "locstatus_check_findings_left", kind=kind)
    assert value(s, "locstatus_check_last_run_timestamp_seconds") > time.time() - 60


def test_per_location_series_are_capped_transitions_first(tmp_path: Path) -> None:
    mgr = connect(f"sqlite:///{tmp_path / 'cap.db'}")
    try:
        mgr.sync_locations({f"loc-{i:02d}": [SVC] for i in range(30)})
        agent = mgr.agent("w-hold", services=[SVC], locations=["loc-29"], lease_seconds=5)
        hold = threading.Event()
        agent.on_pause(SVC)(lambda location: hold.wait(60))
        agent.start()
        try:
            for i in range(30):
                mgr.pause(f"loc-{i:02d}", SVC)  # loc-29 stays pausing: w-hold holds it
            text = Metrics(mgr, location_series=5).render()[0].decode()
        finally:
            hold.set()
            agent.stop()
        rows = [line for line in text.splitlines()
                if line.startswith("locstatus_service_seconds_in_state{")]
        assert len(rows) == 5
        assert any('location="loc-29"' in r and 'state="pausing"' in r for r in rows)
        paused = sorted(re.search(r'location="(loc-\d+)"', r).group(1)  # type: ignore[union-attr]
                        for r in rows if 'state="paused"' in r)
        assert paused == ["loc-00", "loc-01", "loc-02", "loc-03"]  # the oldest
        assert "locstatus_location_series_omitted 25.0" in text
        assert "locstatus_service_seconds_in_state{" not in Metrics(
            mgr, location_series=0
        ).render()[0].decode()
        with pytest.raises(ValueError, match="location_series"):
            Metrics(mgr, location_series=-1)
    finally:
        mgr.close()


# -- JSON logs -------------------------------------------------------------------------------


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` as a JSON object (fails naming the first line that is not)."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
        assert isinstance(obj, dict) and {"time", "level", "logger", "message"} <= obj.keys()
        out.append(obj)
    return out


def wait_for(path: Path, pred: Any, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        for obj in json_lines(path.read_text()):
            if pred(obj):
                return obj
        assert time.monotonic() < deadline, path.read_text()[-3000:]
        time.sleep(0.2)


def test_the_sidecar_logs_json_lines_naming_location_service_op_id_and_actor(live: Live) -> None:
    r = httpx.post(
        f"{live.url}/v1/locations/loc-c/lifecycle/pause",
        json={"reason": "cost spike", "actor": "ops-json"},
    )
    assert r.status_code == 200, r.text
    op_id = r.json()["services"]["lifecycle"]["op_id"]
    event = wait_for(live.log_path, lambda o: o.get("op_id") == op_id)
    assert event["location"] == "loc-c" and event["service"] == "lifecycle"
    assert event["actor"] == "ops-json" and event["level"] == "INFO"
    # uvicorn's access lines are JSON too
    wait_for(live.log_path, lambda o: o["logger"] == "uvicorn.access")


def test_the_check_job_logs_each_finding_as_a_json_line(tmp_path: Path) -> None:
    backend = f"sqlite:///{tmp_path / 'check.db'}"
    mgr = connect(backend)
    mgr.sync_locations({"loc-a": ["replication", "lifecycle", "ingestion"]})
    mgr.close()
    expected = tmp_path / "expected.json"
    expected.write_text(json.dumps(["loc-a", "loc-new"]))
    proc = subprocess.run(
        [sys.executable, "-m", "locstatus", "--backend", backend, "check", "--locations",
         str(expected), "--log-format", "json", "--no-progress"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    events = json_lines(proc.stderr)
    found = [e for e in events if e.get("kind") == "missing_location"]
    assert len(found) == 1 and found[0]["location"] == "loc-new", events
    assert found[0]["level"] == "WARNING"
    assert any(e.get("findings") == 1 and e.get("exit_code") == 1 for e in events), events
    bad = subprocess.run(
        [sys.executable, "-m", "locstatus", "--backend", backend, "check", "--log-format",
         "yaml"], capture_output=True, text=True, timeout=60,
    )
    assert bad.returncode == 2 and "invalid --log-format 'yaml'" in bad.stderr, bad.stderr


def test_a_worker_agent_logs_json_lines_naming_worker_location_service_op_id_and_actor(
    tmp_path: Path,
) -> None:
    backend = f"sqlite:///{tmp_path / 'agent.db'}"
    mgr = connect(backend)
    try:
        mgr.sync_locations({"loc-a": [SVC]})
        log_path = tmp_path / "worker.log"
        with open(log_path, "w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "locstatus.demo.worker", "--backend", backend, "--id",
                 "w-json", "--services", SVC, "--log-format", "json", "--log-every", "0"],
                stdout=out, stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + 30
            while not any(w.worker_id == "w-json" for w in mgr.workers()):
                assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.1)
            rec = mgr.pause("loc-a", SVC, reason="maintenance", actor="ops-agent")
            op_id = rec.services[SVC].op_id
            event = wait_for(log_path, lambda o: o.get("op_id") == op_id)
            assert event["worker"] == "w-json" and event["location"] == "loc-a"
            assert event["service"] == SVC and event["actor"] == "ops-agent"
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)
        json_lines(log_path.read_text())  # every line, to the last one
    finally:
        mgr.close()


# -- the series limit, as a property -----------------------------------------------------------


class _Now:
    """A time source that calls no lease past (the series only ask about workers)."""

    def is_past(self, at: datetime) -> bool:
        return False


_AGES = st.integers(min_value=0, max_value=10**6)
_SERVICE = st.tuples(st.sampled_from(list(State)), _AGES)


@settings(max_examples=150, deadline=None)
@given(
    locations=st.lists(st.lists(_SERVICE, min_size=1, max_size=3), min_size=0, max_size=40),
    limit=st.integers(min_value=0, max_value=50),
)
def test_the_limit_keeps_every_transition_first_then_the_oldest_and_counts_the_rest(
    locations: list[list[tuple[State, int]]], limit: int
) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    names = ["replication", "lifecycle", "ingestion"]
    records = [
        LocationStatus(
            location=f"loc-{i}",
            services={
                names[j]: ServiceStatus(state=state, generation=1,
                                        updated_at=now - timedelta(seconds=age))
                for j, (state, age) in enumerate(svcs)
            },
        )
        for i, svcs in enumerate(locations)
    ]
    fams = {f.name: f for f in location_series(records, [], {}, now, _Now(), names, limit)}  # type: ignore[arg-type]
    not_running = [
        (state, age, f"loc-{i}", names[j])
        for i, svcs in enumerate(locations) for j, (state, age) in enumerate(svcs)
        if state is not State.RUNNING
    ]
    kept = {(s.labels["location"], s.labels["service"]): s.value
            for s in fams["locstatus_service_seconds_in_state"].samples}
    assert len(kept) == min(limit, len(not_running))
    assert fams["locstatus_location_series_omitted"].samples[0].value == len(not_running) - len(kept)
    moving = [x for x in not_running if x[0].transitional]
    resting = [x for x in not_running if not x[0].transitional]
    kept_moving = [x for x in moving if (x[2], x[3]) in kept]
    assert len(kept_moving) == min(limit, len(moving))  # transitions first
    if kept_moving != moving:  # a transition left out: no resting service kept
        assert not any((x[2], x[3]) in kept for x in resting)
    dropped = [x[1] for x in resting if (x[2], x[3]) not in kept]
    held = [x[1] for x in resting if (x[2], x[3]) in kept]
    assert not dropped or not held or min(held) >= max(dropped)  # the oldest kept
    for (loc, svc), age in kept.items():
        assert any(x[2] == loc and x[3] == svc and x[1] == age for x in not_running)
    longest = {(s.labels["service"], s.labels["state"]): s.value
               for s in fams["locstatus_service_seconds_in_state_max"].samples}
    for svc in names:
        for state in State:
            if state is State.RUNNING:
                assert (svc, state.value) not in longest
                continue
            ages = [x[1] for x in not_running if x[3] == svc and x[0] is state]
            assert longest[(svc, state.value)] == max(ages, default=0)
