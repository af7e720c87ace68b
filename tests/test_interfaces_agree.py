"""The CLI and the sidecar tell the same story (issue 20, "Looking right"): one shape for the
workers (``GET /v1/workers`` and ``locstatus workers --json``), one outcome for a bulk operation
that concerns no location, and a ``urn:locstatus:`` type on every problem the sidecar answers
(docs/http.md, "Errors"), walked here status by status, on a real SQLite file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from locstatus import Manager, open_backend
from locstatus.api import create_app
from locstatus.api.context import CheckState
from locstatus.api.server import BackgroundServer
from locstatus.cli import app
from locstatus.models import WorkerInfo
from locstatus.reconciler import Reconciler

TOKEN = "tok-interfaces-agree"
ENV = {"LOCSTATUS_BACKEND": None, "LOCSTATUS_SERVICES": None, "LOCSTATUS_API_TOKEN": None,
       "COLUMNS": "200", "USER": "tester"}
JSON = {"Content-Type": "application/json"}


class Store:
    """One SQLite file, a manager over it, and the CLI pointed at it."""

    def __init__(self, tmp_path: Path) -> None:
        self.url = f"sqlite:///{tmp_path / 'locstatus.db'}"
        self.mgr = Manager(open_backend(self.url))
        self.runner = CliRunner()

    def cli(self, *args: str) -> Any:
        return self.runner.invoke(app, ["--backend", self.url, *args], env=ENV,
                                  catch_exceptions=False)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path)
    yield s
    s.mgr.close()


def serve(store: Store, **kwargs: Any) -> BackgroundServer:
    return BackgroundServer(create_app(store.mgr, **kwargs))


def client(srv: BackgroundServer, token: str | None = TOKEN) -> httpx.Client:
    headers = dict(JSON)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.Client(base_url=srv.url, headers=headers, timeout=60)


def test_workers_have_one_shape_on_the_cli_and_over_http(store: Store) -> None:
    store.mgr.sync_locations({"us-east-1": ["replication"], "eu-west-1": ["replication"]})
    now = datetime.now(UTC)
    store.mgr.backend.put_worker(WorkerInfo(
        worker_id="w-live", services=("replication",), lease_expires_at=now + timedelta(hours=1),
    ))
    store.mgr.backend.put_worker(WorkerInfo(
        worker_id="w-gone", services=("replication",), locations=("us-east-1",),
        lease_expires_at=now - timedelta(hours=1),
    ))
    store.mgr.pause("us-east-1", "replication")  # w-live lags there
    result = store.cli("workers", "--json")
    assert result.exit_code == 0, result.stderr
    on_cli = {w["worker_id"]: w for w in json.loads(result.stdout)}
    with serve(store, token=TOKEN) as srv, client(srv) as http:
        over_http = {w["worker_id"]: w for w in http.get("/v1/workers").json()}
        documented = http.get("/openapi.json").json()
    assert on_cli == over_http
    live = on_cli["w-live"]
    assert live["alive"] is True and on_cli["w-gone"]["alive"] is False
    assert live["lagging"] == [
        {"location": "us-east-1", "service": "replication", "acked": 0, "generation": 1}
    ]
    assert live["lag_unknown"] == [] and "is_alive" not in live
    schema = documented["paths"]["/v1/workers"]["get"]["responses"]["200"]["content"][
        "application/json"]["schema"]["items"]["$ref"].rsplit("/", 1)[1]
    fields = set(documented["components"]["schemas"][schema]["properties"])
    assert fields == set(live), fields ^ set(live)


def test_a_bulk_operation_that_concerns_no_location_is_refused_on_both(store: Store) -> None:
    """``pause all -s lifecycle`` with no lifecycle location: exit 1 on the CLI, 409 over
    HTTP (it was 200 ``{"results": {}}``), the same words; with no location at all, exit 1 and
    404; nothing written either way."""
    with serve(store, token=TOKEN) as srv, client(srv) as http:
        empty = http.post("/v1/locations/all/replication/pause")
        assert empty.status_code == 404, empty.text
        assert empty.json()["type"] == "urn:locstatus:not-found"
        assert store.cli("pause", "all", "-s", "replication").exit_code == 1
        store.mgr.sync_locations({"us-east-1": ["replication"], "eu-west-1": ["ingestion"]})
        before = {r.location: r.version for r in store.mgr.statuses()}
        r = http.post("/v1/locations/all/lifecycle/pause")
        assert r.status_code == 409, r.text
        problem = r.json()
        assert problem["type"] == "urn:locstatus:invalid-transition"
        cli = store.cli("pause", "all", "-s", "lifecycle")
        assert cli.exit_code == 1
        assert problem["detail"] in cli.stderr
        assert {r.location: r.version for r in store.mgr.statuses()} == before
        # a schedule that no location takes: the same rule
        s = http.post("/v1/locations/all/replication/resume", json={"in_seconds": 60})
        assert s.status_code == 409 and s.json()["type"] == "urn:locstatus:invalid-transition"
        assert store.cli("resume", "all", "--in", "1m").exit_code == 1


def test_every_problem_the_sidecar_answers_has_its_urn_type(store: Store) -> None:
    store.mgr.sync_locations({"us-east-1": ["replication"]})
    store.mgr.backend.put_worker(WorkerInfo(
        worker_id="w-slow", services=("replication",),
        lease_expires_at=datetime.now(UTC) + timedelta(hours=1),
    ))
    seen: dict[int, set[str]] = {}

    def check(r: httpx.Response, status: int, kind: str | None = None) -> None:
        assert r.status_code == status, (r.request.method, r.request.url, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
        body = r.json()
        assert body["type"].startswith("urn:locstatus:"), body
        assert body["status"] == status and body["title"], body
        if kind is not None:
            assert body["type"] == f"urn:locstatus:{kind}", body
        seen.setdefault(status, set()).add(body["type"])

    loc = "/v1/locations/us-east-1"
    reconciler = Reconciler(store.mgr, interval=60)  # never started: /readyz is 503
    with serve(store, token=TOKEN, check=CheckState(), reconciler=reconciler) as srv, \
            client(srv) as http, client(srv, token=None) as anon, \
            client(srv, token="not-the-token") as wrong:
        check(http.get("/v1/locations/-bad"), 400, "invalid-input")
        check(http.post(f"{loc}/replication/pause", headers={"If-Match": "bogus"}), 400,
              "invalid-input")
        check(anon.post(f"{loc}/replication/pause"), 401, "unauthorized")
        check(wrong.post(f"{loc}/replication/pause"), 403, "forbidden")
        check(http.post(f"{loc}/replication/pause", headers={"Origin": "http://evil.example"}),
              403, "cross-origin")
        check(http.get("/v1/locations/nowhere"), 404, "not-found")
        check(http.get("/v1/no-such-route"), 404, "not-found")
        check(http.get("/v1/check"), 404, "no-check-yet")
        check(http.delete("/v1/locations"), 405, "method-not-allowed")
        check(http.post(f"{loc}/replication/resume", json={"in_seconds": 60}), 409,
              "invalid-transition")
        check(http.post(f"{loc}/replication/pause", headers={"If-Match": '"999"'}), 412,
              "precondition-failed")
        check(http.post(f"{loc}/replication/pause", content=b"x" * 200_000), 413,
              "request-too-large")
        check(http.post(f"{loc}/replication/pause", headers={"Content-Type": "text/plain"}),
              415, "unsupported-media-type")
        check(http.post(f"{loc}/replication/pause", content=b"not json"), 422, "invalid-request")
        check(http.post(f"{loc}/replication/pause", json={"wait": -1}), 422, "invalid-request")
        check(http.get("/readyz"), 503, "not-ready")
        check(http.post(f"{loc}/replication/pause", json={"wait": 0.2}), 504, "settle-timeout")
    with serve(store) as open_srv, client(open_srv, token=None) as local:
        check(local.get("/v1/locations", headers={"Host": "evil.example"}), 421,
              "misdirected-request")
        store.mgr.backend.write_raw("broken", "not a record")  # type: ignore[attr-defined]
        check(local.get("/v1/locations/broken"), 500, "corrupt-record")
        check(local.get("/v1/locations"), 500, "corrupt-record")
        failed = local.post("/v1/locations/all/replication/pause")
        check(failed, 500, "bulk-failed")
        assert failed.json()["results"]["broken"]["error"]["type"] == "urn:locstatus:corrupt-record"
    store.mgr.backend.close()
    with serve(store) as down, client(down, token=None) as http:
        check(http.get("/v1/locations"), 503, "backend-unavailable")
    assert set(seen) == {400, 401, 403, 404, 405, 409, 412, 413, 415, 421, 422, 500, 503, 504}
