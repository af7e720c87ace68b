"""Property-based tests of the sidecar's OpenAPI document with schemathesis, over real HTTP.

The schemathesis CLI (its examples, coverage, fuzzing and stateful phases) calls every operation
of ``/openapi.json`` with generated valid and invalid input against a real server on a real
backend. No answer may be a 5xx or disagree with the document (status code documented, content
type, body schema, headers, ``Allow`` on 405), invalid input must be refused, mutations must be
refused without the bearer token. Only ``positive_data_acceptance`` (and the never-ending
watch streams) are left out: the document
cannot express every semantic rule (a scheduled time must be in the future, a location must
exist), so some schema-valid requests are rightly refused with a 4xx.

The CLI runs as a subprocess because schemathesis' pytest plugin does not work with the pytest
in use (it reads ``Function._nodeid``, which pytest 9 removed).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from locstatus import Manager, open_backend
from locstatus.api import create_app
from locstatus.api.server import BackgroundServer

from support.kits import Kit
from support.suite import sized

TOKEN = "schema-token-5b2d"
EXAMPLES = sized(ci=15, long=40)
"""Examples per operation and phase: bounded in CI, the full count in the long suite
(``support/suite.py``); every operation and every check runs in both."""


@pytest.fixture
def server(durable_kit: Kit) -> Iterator[BackgroundServer]:
    mgr = Manager(open_backend(durable_kit.url))
    mgr.sync_locations({"us-east-1": ["replication", "lifecycle", "ingestion"],
                        "zenko": ["replication"]})
    mgr.pause("zenko", "replication")
    try:
        with BackgroundServer(create_app(mgr, token=TOKEN)) as srv:
            yield srv
    finally:
        mgr.close()


WORKER_ROUTES = r"^/v1/workers/\{worker_id\}(/acks/.*)?$"
"""Register, unregister, acknowledge: fuzzed in a run of their own, since a worker the fuzzer
registers holds every later ``wait=`` of the operators' routes until its lease lapses (a
504 by design, which the server-error check would report)."""


@pytest.mark.parametrize(
    ("selection", "operations"),
    [
        # The watch streams never end (Server-Sent Events): a request/response fuzzer would
        # wait out its timeout on each; tests/test_api_workers.py covers them.
        (["--exclude-path-regex", f"/watch$|{WORKER_ROUTES}"], 31),
        (["--include-path-regex", WORKER_ROUTES], 3),
    ],
    ids=["operators", "workers"],
)
def test_api_conforms_to_its_schema(
    server: BackgroundServer, tmp_path: Path, selection: list[str], operations: int
) -> None:
    cli = Path(sys.executable).with_name("schemathesis")
    proc = subprocess.run(
        [
            str(cli), "run", server.url + "/openapi.json",
            "--checks", "all", "--exclude-checks", "positive_data_acceptance",
            *selection,
            "--header", f"Authorization: Bearer {TOKEN}",
            "--max-examples", str(EXAMPLES), "--workers", "1", "--suppress-health-check", "all",
            "--request-timeout", "60", "--no-color",
            "--report", "junit", "--report-dir", str(tmp_path),
        ],
        capture_output=True, text=True, timeout=1200, cwd=tmp_path, check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-20000:]
    selected = re.search(r"Selected: (\d+)/(\d+)", output)
    tested = re.search(r"Tested: (\d+)", output)
    assert selected and tested, output[-3000:]
    # every selected operation was exercised; the two runs cover all but the two streams
    assert int(tested.group(1)) == int(selected.group(1)) == operations, output[-3000:]
    assert int(selected.group(2)) == 31 + 3 + 2  # GET /_/healthcheck, /page/live.js among the 31
    assert TOKEN not in output
