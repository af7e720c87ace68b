"""Releases people can depend on (issue 20, docs/versioning.md): one version, read from the
package's metadata, shown by ``locstatus --version``, the sidecar's ``/healthz`` and its OpenAPI
document; a changelog with an entry per version and the changes not released yet; a version
policy that covers the library API, the HTTP API and the stored format."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import httpx

import locstatus
from locstatus import Manager, open_backend
from locstatus.api import create_app
from locstatus.api.server import BackgroundServer

ROOT = Path(__file__).resolve().parent.parent


def test_the_cli_the_sidecar_and_the_openapi_document_show_the_package_version(
    tmp_path: Path,
) -> None:
    expected = version("locstatus")
    assert locstatus.__version__ == expected
    out = subprocess.run(
        [sys.executable, "-m", "locstatus", "--version"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    assert out.strip() == f"locstatus {expected}"
    mgr = Manager(open_backend(f"sqlite:///{tmp_path / 'l.db'}"))
    try:
        with BackgroundServer(create_app(mgr)) as srv:
            health = httpx.get(srv.url + "/healthz", timeout=60).json()
            assert health == {"status": "ok", "version": expected}
            doc = httpx.get(srv.url + "/openapi.json", timeout=60).json()
            assert doc["info"]["version"] == expected
    finally:
        mgr.close()


def test_the_changelog_has_the_current_version_and_what_is_not_released_yet() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    assert headings[0].startswith("Unreleased"), headings
    released = version("locstatus").split(".dev")[0]  # main's 0.2.0.dev0 is under "Unreleased: 0.2.0"
    assert any(h.split()[-1] == released for h in headings), headings
    for heading in headings:  # every version says something
        body = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
        assert re.search(r"^- ", body, flags=re.MULTILINE), heading


def test_the_version_policy_covers_the_library_the_http_api_and_the_stored_format() -> None:
    text = (ROOT / "docs" / "versioning.md").read_text()
    for topic in ("Library API", "HTTP API", "Stored format", "Command line"):
        assert re.search(rf"^## {topic}", text, flags=re.MULTILINE), topic
    assert "docs/versioning.md" in (ROOT / "README.md").read_text()


def test_main_between_releases_carries_the_next_version_as_a_dev_release() -> None:
    """docs/versioning.md, "Between releases": a process built from main must not report the
    version of the last release when the changelog lists changes since (an unreleased breaking
    change of the stored format must be told apart from the release it breaks)."""
    text = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    unreleased = text.split(f"## {headings[0]}\n", 1)[1].split("\n## ", 1)[0]
    released = headings[1].split()[0]
    current = version("locstatus")
    assert re.search(r"^- ", unreleased, flags=re.MULTILINE)  # there are unreleased changes
    assert current != released, (current, released)
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)\.dev\d+", current)
    assert match, f"{current} is not a .devN release"
    base = ".".join(match.groups())
    assert headings[0] == f"Unreleased: {base}", headings[0]  # the heading names it
    major, minor, patch = (int(n) for n in match.groups())
    last = tuple(int(n) for n in released.split("."))
    if "### Breaking" in unreleased:  # before 1.0 a minor breaks, from 1.0 on a major
        assert (major, minor, patch) == ((0, last[1] + 1, 0) if last[0] == 0 else (last[0] + 1, 0, 0))
    else:
        assert (major, minor, patch) > last
