"""The read-only status page (``GET /``), loaded in a real headless browser (Debian chromium).

The browser renders the page served over HTTP by the sidecar; the test reads the table back
from the rendered DOM (``--dump-dom``): every location x service with its state, its scheduled
resume (with the relative time the page's script adds) and the workers holding up a transition,
plus the state-machine diagram.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path

import pytest

from locstatus import Manager, open_backend
from locstatus.api import create_app
from locstatus.api.server import BackgroundServer
from locstatus.fsm import table
from locstatus.models import WorkerInfo

NOW = datetime(2030, 3, 1, 8, 0, tzinfo=UTC)


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("chromium not found: install it with `apt-get install -y chromium`")
    return path


def dump_dom(url: str, tmp_path: Path) -> str:
    """The DOM of ``url`` after the browser loaded it and ran its scripts."""
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    proc = subprocess.run(
        [
            chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", f"--user-data-dir={profile}", "--dump-dom", url,
        ],
        capture_output=True, timeout=180, check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    return proc.stdout.decode()


class _Table(HTMLParser):
    """Collects the rows of ``<table id=...>`` as (row attributes, cell texts)."""

    def __init__(self, table_id: str) -> None:
        super().__init__()
        self.table_id = table_id
        self.inside = False
        self.rows: list[tuple[dict[str, str], list[str]]] = []
        self.cell: list[str] | None = None
        self.ids: set[str] = set()
        self.svg_states: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "g" and "data-state" in a:
            self.svg_states.append(a["data-state"])
        if tag == "table" and a.get("id") == self.table_id:
            self.inside = True
        elif self.inside and tag == "tr" and "data-location" in a:
            self.rows.append((a, []))
        elif self.inside and tag == "td" and self.rows:
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self.inside = False
        elif tag == "td" and self.cell is not None:
            self.rows[-1][1].append(" ".join("".join(self.cell).split()))
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)




@pytest.fixture
def mgr(backend_url: str) -> Iterator[Manager]:
    m = Manager(open_backend(backend_url), clock=lambda: NOW)
    m.sync_locations({"aws-location": ["replication", "lifecycle"], "zenko": ["replication"],
                      "us-east-1": ["lifecycle"]})
    yield m
    m.close()


def test_status_page_in_a_headless_browser(mgr: Manager, tmp_path: Path) -> None:
    # aws-location: replication paused with a resume in 2 h; lifecycle pausing, held up by w-7.
    mgr.pause("aws-location", "replication", reason="target outage", actor="ops")
    mgr.resume("aws-location", "replication", at=timedelta(hours=2))
    mgr.backend.put_worker(WorkerInfo(worker_id="w-7", services=("lifecycle",),
                                      lease_expires_at=NOW + timedelta(minutes=5)))
    mgr.pause("aws-location", "lifecycle", reason="<b>cost</b> spike")
    with BackgroundServer(create_app(mgr)) as srv:
        dom = dump_dom(srv.url + "/", tmp_path)
    parsed = _Table("services")
    parsed.feed(dom)
    rows = {(a["data-location"], a["data-service"]): cells for a, cells in parsed.rows}
    assert sorted(rows) == [
        ("aws-location", "lifecycle"), ("aws-location", "replication"),
        ("us-east-1", "lifecycle"), ("zenko", "replication"),
    ]
    header = ["location", "service", "state", "generation", "resume", "lagging", "reason",
              "actor", "updated"]
    paused = dict(zip(header, rows[("aws-location", "replication")], strict=True))
    assert paused["state"] == "paused"
    assert paused["resume"] == "2030-03-01T10:00:00Z in 2h 0m"  # relative part: page script
    assert paused["reason"] == "target outage" and paused["actor"] == "ops"
    pausing = dict(zip(header, rows[("aws-location", "lifecycle")], strict=True))
    assert pausing["state"] == "pausing" and pausing["lagging"] == "w-7"
    assert pausing["reason"] == "<b>cost</b> spike"  # escaped, shown as text
    running = dict(zip(header, rows[("zenko", "replication")], strict=True))
    assert running["state"] == "running" and running["resume"] == "—"
    assert running["lagging"] == "—"
    # Workers table, the diagram drawn from the state table, auto-refresh.
    assert {"services", "workers", "fsm", "summary"} <= parsed.ids
    assert sorted(parsed.svg_states) == sorted(table.STATES)
    assert '<noscript><meta http-equiv="refresh" content="5"></noscript>' in dom  # no script
    assert "<b>cost</b>" not in dom


def test_the_workers_table_shows_a_standing_registration_away_since_its_lease_ran_out(
    mgr: Manager,
) -> None:
    """docs/agent.md "Standing registrations": listed alive (it counts), its holder away since
    its lease ran out; an ordinary registration beside it reads as before. Served HTML (the
    table is rendered by the server; the browser test above covers the script)."""
    import httpx

    gone = NOW - timedelta(minutes=3)
    mgr.backend.put_worker(WorkerInfo(worker_id="bb.zenko", services=("replication",),
                                      lease_expires_at=gone, standing=True))
    mgr.backend.put_worker(WorkerInfo(worker_id="bb.here", services=("replication",),
                                      lease_expires_at=NOW + timedelta(minutes=1), standing=True))
    mgr.backend.put_worker(WorkerInfo(worker_id="w-old", services=("replication",),
                                      lease_expires_at=gone))
    with BackgroundServer(create_app(mgr)) as srv:
        page = httpx.get(srv.url + "/", timeout=10).text

    class Workers(_Table):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            a = {k: v or "" for k, v in attrs}
            if self.inside and tag == "tr" and "data-worker" in a:
                self.rows.append((a, []))
            else:
                super().handle_starttag(tag, attrs)

    parsed = Workers("workers")
    parsed.feed(page)
    rows = {a["data-worker"]: (cells[5], cells[6]) for a, cells in parsed.rows}
    assert rows == {
        "bb.zenko": ("standing, holder away since 2030-03-01T07:57:00Z", "yes"),
        "bb.here": ("2030-03-01T08:01:00Z (standing)", "yes"),
        "w-old": ("2030-03-01T07:57:00Z", "no"),
    }
