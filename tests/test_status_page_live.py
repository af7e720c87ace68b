"""The status page, live (docs/http.md "The status page"), in a real headless Chromium kept open
(tests/support/browser.py drives it over the DevTools protocol).

- A pause made by another OS process reaches an open page within a second, in place: the
  page's script follows ``GET /v1/watch`` and swaps its tables, the page is not reloaded.
- A lagging worker shows its last handler error next to its name.
- With the backend down (a real ZooKeeper server stopped), the page keeps the last state it
  showed and says it is stale, with its age; it does not fall back to "0 locations".
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from locstatus import Manager, open_backend
from locstatus.api import create_app
from locstatus.api.server import BackgroundServer
from locstatus.api.workers import hub_of
from locstatus.models import WorkerInfo

from support.browser import Browser
from support.kits_zk import wait_until, zk_url
from support.servers import start_zookeeper

STATE = "document.querySelector('tr[data-location=\"{loc}\"][data-service=\"{svc}\"]')" \
        "?.getAttribute('data-state')"
LAGGING = "document.querySelector('tr[data-location=\"{loc}\"][data-service=\"{svc}\"] " \
          "td.lagging')?.textContent"

PAUSE_SCRIPT = """
import sys, time
from locstatus import Manager, open_backend
mgr = Manager(open_backend(sys.argv[1]))
mgr.pause(sys.argv[2], sys.argv[3], reason="from another process", actor="ops")
print(time.time(), flush=True)
mgr.close()
"""


def state(loc: str, svc: str) -> str:
    return STATE.format(loc=loc, svc=svc)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    with Browser(tmp_path / "chromium-profile") as b:
        yield b


def open_live(browser: Browser, srv: BackgroundServer, mgr: Manager, refresh: int) -> None:
    """Open the page and wait until its script follows the watch stream."""
    browser.open(f"{srv.url}/?refresh={refresh}")
    browser.wait_for("document.getElementById('live')?.textContent.includes('live')", 30)
    wait_until(lambda: hub_of(srv.app).open_streams() >= 1, 10, what="the page's stream")
    browser.eval("window.__notReloaded = true")


def test_a_pause_from_another_process_appears_on_an_open_page_within_a_second(
    backend_url: str, browser: Browser
) -> None:
    mgr = Manager(open_backend(backend_url))
    try:
        mgr.sync_locations({"aws-location": ["replication", "lifecycle"], "zenko": ["replication"]})
        now = mgr.clock()
        worker = WorkerInfo(worker_id="w-7", services=("lifecycle",),
                            lease_expires_at=now + timedelta(minutes=5))
        mgr.backend.put_worker(worker)
        with BackgroundServer(create_app(mgr)) as srv:
            open_live(browser, srv, mgr, refresh=2)
            assert browser.eval(state("zenko", "replication")) == "running"
            proc = subprocess.Popen(
                [sys.executable, "-c", PAUSE_SCRIPT, backend_url, "zenko", "replication"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )
            try:
                browser.wait_for(f"{state('zenko', 'replication')} === 'paused'", 30)
                seen = time.time()
                out, err = proc.communicate(timeout=60)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            assert proc.returncode == 0, err.decode()[-2000:]
            paused_at = float(out.split()[-1])
            print(f"pause seen on the page {seen - paused_at:.3f}s after it returned")
            assert seen - paused_at < 1.0, f"seen {seen - paused_at:.3f}s after the pause"
            assert browser.eval("window.__notReloaded") is True  # updated in place
            assert "from another process" in browser.eval(
                "document.querySelector('tr[data-location=\"zenko\"] td.reason').textContent"
            )

            # A pause held up by w-7, whose handler then fails and says so in its renewal.
            subprocess.run(
                [sys.executable, "-c", PAUSE_SCRIPT, backend_url, "aws-location", "lifecycle"],
                check=True, capture_output=True, timeout=60,
            )
            browser.wait_for(f"{state('aws-location', 'lifecycle')} === 'pausing'", 5)
            lagging = LAGGING.format(loc="aws-location", svc="lifecycle")
            assert browser.eval(lagging).strip() == "w-7"
            mgr.backend.put_worker(worker.model_copy(
                update={"errors": {"aws-location/lifecycle": "OSError: disk <full>"}}
            ))
            browser.wait_for(f"({lagging}).includes('last error')", 10)
            text = browser.eval(lagging)
            assert " ".join(text.split()) == "w-7 (last error: OSError: disk <full>)"
            assert browser.eval("window.__notReloaded") is True
            assert browser.eval("document.getElementById('stale').hidden") is True
    finally:
        mgr.close()


def test_the_page_shows_the_last_state_marked_stale_when_the_backend_stops(
    tmp_path: Path, browser: Browser
) -> None:
    server = start_zookeeper(tmp_path)
    try:
        mgr = Manager(open_backend(zk_url(server.hosts)))
        try:
            mgr.sync_locations({"aws-location": ["replication"], "zenko": ["replication"]})
            mgr.pause("zenko", "replication", reason="target outage")
            with BackgroundServer(create_app(mgr)) as srv:
                open_live(browser, srv, mgr, refresh=1)
                assert browser.eval(state("zenko", "replication")) == "paused"
                server.stop()
                stopped = time.monotonic()
                banner = browser.wait_for(
                    "!document.getElementById('stale').hidden && "
                    "document.getElementById('stale').textContent", 30,
                )
                took = time.monotonic() - stopped
                assert banner.startswith("STALE: backend unavailable"), banner
                assert "Showing the last state read, as of" in banner
                # The last state read stays, not "0 locations".
                assert browser.eval(state("zenko", "replication")) == "paused"
                assert browser.eval(state("aws-location", "replication")) == "running"
                summary = browser.eval("document.getElementById('summary').textContent")
                assert summary.startswith("2 locations"), summary
                # Its age grows with time.
                age = int(browser.eval(
                    "document.getElementById('stale').getAttribute('data-age-seconds')"
                ))
                assert age >= int(took) - 1
                time.sleep(2.5)
                later = int(browser.eval(
                    "document.getElementById('stale').getAttribute('data-age-seconds')"
                ))
                assert later >= age + 2
                assert browser.eval("window.__notReloaded") is True
        finally:
            mgr.close()
    finally:
        server.close()
