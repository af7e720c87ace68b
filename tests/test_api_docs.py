"""``/docs`` and ``/redoc`` on a network with no way out (issue 20): Swagger UI and ReDoc loaded
in headless Chromium that may reach 127.0.0.1 only, rendering the sidecar's OpenAPI document
from the files the sidecar serves itself (docs/http.md, "API documentation")."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from locstatus import Manager, open_backend
from locstatus.api import create_app
from locstatus.api.server import BackgroundServer

OFFLINE = [
    # every name but 127.0.0.1 fails to resolve, and anything not on loopback goes to a proxy
    # that is not there: the page gets nothing from outside this machine
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    "--proxy-server=http://127.0.0.1:9",
    "--proxy-bypass-list=127.0.0.1",
]


def offline_dom(url: str, tmp_path: Path) -> str:
    """The DOM of ``url`` after headless Chromium, cut off from every host but 127.0.0.1,
    loaded it and ran its scripts (10 s of virtual time for the fetches they make)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.fail("chromium not found: install it with `apt-get install -y chromium`")
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    proc = subprocess.run(
        [
            browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", f"--user-data-dir={profile}", *OFFLINE,
            "--virtual-time-budget=10000", "--dump-dom", url,
        ],
        capture_output=True, timeout=180, check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    return proc.stdout.decode()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[BackgroundServer]:
    mgr = Manager(open_backend(f"sqlite:///{tmp_path / 'l.db'}"))
    mgr.sync_locations(["us-east-1"])
    try:
        with BackgroundServer(create_app(mgr)) as srv:
            yield srv
    finally:
        mgr.close()


def test_docs_page_renders_swagger_ui_with_no_network(
    server: BackgroundServer, tmp_path: Path
) -> None:
    html = httpx.get(server.url + "/docs", timeout=60).text
    sources = re.findall(r'(?:src|href)="([^"]+)"', html) + re.findall(r"url: '([^']+)'", html)
    assert sources and all(s.startswith("/") for s in sources), sources  # nothing from outside
    dom = offline_dom(server.url + "/docs", tmp_path)
    assert 'class="swagger-ui' in dom, dom[:2000]
    assert "locstatus sidecar" in dom  # the document's title, rendered by Swagger UI
    for path in ("/v1/locations/{location}", "/healthz"):
        assert f'data-path="{path}"' in dom, path  # an operation of the document
    assert 'data-path="/docs' not in dom


def test_redoc_renders_with_no_network(server: BackgroundServer, tmp_path: Path) -> None:
    html = httpx.get(server.url + "/redoc", timeout=60).text
    sources = re.findall(r'(?:src|href|spec-url)="([^"]+)"', html)
    assert sources and all(s.startswith("/") for s in sources), sources
    dom = offline_dom(server.url + "/redoc", tmp_path)
    assert "locstatus sidecar" in dom and "/v1/locations/{location}" in dom, dom[-2000:]


def test_the_assets_are_served_by_the_sidecar(server: BackgroundServer) -> None:
    for name, least in (("swagger-ui-bundle.js", 100_000), ("swagger-ui.css", 10_000),
                        ("redoc.standalone.js", 100_000)):
        r = httpx.get(f"{server.url}/docs/assets/{name}", timeout=60)
        assert r.status_code == 200 and len(r.content) > least, name
