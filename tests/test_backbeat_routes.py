"""Backbeat's own routes as Backbeat's API server answers them, over real HTTP on every backend
(docs/http.md, "Backbeat-compatible routes"): ``/_/{crr|ingestion|lifecycle}/...`` besides
CloudServer's ``/_/backbeat/api/...``, ``GET /_/healthcheck``, 404 for a known path asked with
a method it does not take, a trailing slash as the same route (never a redirect), a ``null``
schedule body refused, and the ``--backbeat-trust`` rule for requests CloudServer forwards.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from locstatus import Manager, State, open_backend
from locstatus.api import create_app
from locstatus.api.backbeat import iso_date
from locstatus.api.server import BackgroundServer, serve
from locstatus.errors import InvalidInput

from support.fakeclock import FakeClock
from support.kits import Kit

TOKEN = "bb-token-7d21c9-routes"
START = datetime(2030, 6, 28, 5, 40, 20, 600000, tzinfo=UTC)
LOCATIONS = {
    "aws-location": ["replication", "lifecycle"],
    "zenko": ["replication"],
    "a-zenko-location": ["ingestion"],
    "us-east-1": ["lifecycle"],
}
PREFIXES = ["/_", "/_/backbeat/api"]
SIGV4 = (
    "AWS4-HMAC-SHA256 Credential=AKIAEXAMPLE/20300628/us-east-1/s3/aws4_request, "
    "SignedHeaders=host;x-amz-date, Signature=" + "0" * 64
)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def mgr(kit: Kit, clock: FakeClock) -> Iterator[Manager]:
    m = Manager(open_backend(kit.url), clock=clock)
    m.sync_locations(LOCATIONS)
    yield m
    m.close()


def server(mgr: Manager, **kwargs: Any) -> BackgroundServer:
    return BackgroundServer(create_app(mgr, **kwargs))


@pytest.fixture
def http(mgr: Manager) -> Iterator[httpx.Client]:
    with server(mgr, token=TOKEN) as srv, httpx.Client(
        base_url=srv.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
    ) as c:
        yield c


def problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = r.json()
    assert body["status"] == status
    return body


def state(mgr: Manager, loc: str, service: str = "replication") -> State:
    return mgr.status(loc).services[service].state


@pytest.mark.parametrize("prefix", PREFIXES)
def test_every_route_under_both_prefixes(
    http: httpx.Client, mgr: Manager, prefix: str
) -> None:
    def call(method: str, path: str, **kw: Any) -> Any:
        r = http.request(method, prefix + path, **kw)
        assert r.status_code == 200, (method, path, r.text)
        assert r.headers["content-type"] == "application/json"
        return r.json()

    assert call("GET", "/crr/status") == {"aws-location": "enabled", "zenko": "enabled"}
    assert call("GET", "/ingestion/status") == {"a-zenko-location": "enabled"}
    assert call("GET", "/lifecycle/status/us-east-1") == {"us-east-1": "enabled"}
    assert call("POST", "/crr/pause/zenko") == {"zenko": "disabled"}
    assert state(mgr, "zenko") is State.PAUSED
    assert call("GET", "/crr/status/zenko") == {"zenko": "disabled"}
    at = iso_date(START + timedelta(hours=6))
    assert call("POST", "/crr/resume/zenko/schedule") == {"zenko": at}
    assert call("GET", "/crr/resume/zenko") == {"zenko": at}
    assert call("GET", "/crr/resume/zenko/schedule") == {"zenko": at}
    assert call("GET", "/crr/resume") == {"aws-location": "none", "zenko": at}
    assert call("DELETE", "/crr/resume/zenko/schedule") == {"zenko": "none"}
    assert call("POST", "/crr/resume/zenko") == {"zenko": "enabled"}
    assert call("POST", "/ingestion/pause") == {"a-zenko-location": "disabled"}
    assert call("POST", "/ingestion/resume/all") == {"a-zenko-location": "enabled"}
    assert call("POST", "/lifecycle/pause/all") == {
        "aws-location": "disabled", "us-east-1": "disabled"
    }
    hours = {"aws-location": iso_date(START + timedelta(hours=2)),
             "us-east-1": iso_date(START + timedelta(hours=2))}
    assert call("POST", "/lifecycle/resume/schedule", content=b'{"hours": 2}') == hours
    assert call("DELETE", "/lifecycle/resume") == dict.fromkeys(hours, "none")
    assert state(mgr, "us-east-1", "lifecycle") is State.PAUSED
    problem(http.get(prefix + "/crr/status/nowhere"), 404)
    problem(http.post(prefix + "/crr/pause/us-east-1"), 404)  # no replication there
    problem(http.get(prefix + "/teleport/status"), 404)


@pytest.mark.parametrize("prefix", PREFIXES)
def test_healthcheck(http: httpx.Client, prefix: str) -> None:
    r = http.get(prefix + "/healthcheck")
    assert r.status_code == 200, r.text
    assert r.json() == {"topics": {}, "internalConnections": {"backend": "ok"}}
    for method in ("POST", "DELETE", "PUT"):
        r = http.request(method, prefix + "/healthcheck")
        problem(r, 405)
        assert r.headers["allow"] == "GET"


def test_healthcheck_with_the_backend_down_is_503(kit: Kit, clock: FakeClock) -> None:
    m = Manager(open_backend(kit.url), clock=clock)
    with server(m) as srv:
        m.close()  # a closed client: every call fails with BackendUnavailable
        problem(httpx.get(srv.url + "/_/healthcheck"), 503)


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/crr/status"), ("DELETE", "/crr/status/zenko"), ("GET", "/crr/pause"),
     ("GET", "/crr/pause/zenko"), ("DELETE", "/crr/pause"), ("POST", "/crr/resume"),  # resume now
     ("GET", "/ingestion/pause/all"), ("POST", "/lifecycle/status"), ("POST", "/crr/status/")],
)
def test_a_known_path_with_a_method_it_does_not_take_is_404(
    http: httpx.Client, mgr: Manager, prefix: str, method: str, path: str
) -> None:
    before = mgr.status("zenko").version
    if (method, path) == ("POST", "/crr/resume"):
        path = "/crr/status/zenko/schedule"  # resume takes POST: a path it does not know
    body = problem(http.request(method, prefix + path), 404)
    assert body["title"] == "not found"
    assert mgr.status("zenko").version == before


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("method", ["PUT", "PATCH", "HEAD", "OPTIONS"])
def test_a_method_backbeat_never_takes_is_405(
    http: httpx.Client, prefix: str, method: str
) -> None:
    r = http.request(method, prefix + "/crr/status")
    assert r.status_code == 405, r.text
    assert r.headers["allow"] == "GET"


@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_trailing_slash_is_the_same_route(
    http: httpx.Client, mgr: Manager, prefix: str
) -> None:
    def call(method: str, path: str, **kw: Any) -> Any:
        r = http.request(method, prefix + path, **kw)
        assert r.status_code == 200, (method, path, r.status_code, r.text)  # never a 307
        return r.json()

    assert call("GET", "/crr/status/") == call("GET", "/crr/status")
    assert call("GET", "/crr/status/zenko/") == {"zenko": "enabled"}
    assert call("POST", "/crr/pause/zenko/") == {"zenko": "disabled"}
    at = iso_date(START + timedelta(hours=1))
    assert call("POST", "/crr/resume/zenko/schedule/", content=b'{"hours": 1}') == {"zenko": at}
    assert call("GET", "/crr/resume/zenko/") == {"zenko": at}
    assert call("DELETE", "/crr/resume/zenko/schedule/") == {"zenko": "none"}
    assert call("POST", "/crr/resume/") == {"aws-location": "enabled", "zenko": "enabled"}
    assert call("GET", "/healthcheck/") == call("GET", "/healthcheck")  # once a 307
    r = http.post(prefix + "/healthcheck/")
    assert r.status_code == 405 and r.headers["allow"] == "GET", r.text  # as without the slash
    r = http.put(prefix + "/crr/status/")
    assert r.status_code == 405 and r.headers["allow"] == "GET", r.text
    assert call("GET", "/crr/status//") == call("GET", "/crr/status")  # empty parts: defaults


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("content", [b"null", b" null ", b"[]", b"6"])
def test_a_schedule_body_that_is_not_an_object_is_400(
    http: httpx.Client, mgr: Manager, prefix: str, content: bytes
) -> None:
    http.post(prefix + "/crr/pause/zenko")
    version = mgr.status("zenko").version
    body = problem(http.post(prefix + "/crr/resume/zenko/schedule", content=content), 400)
    assert "JSON object" in body["detail"]
    assert mgr.status("zenko").version == version
    assert mgr.status("zenko").services["replication"].resume_at is None


# -- who may change the state ------------------------------------------------------------------


@pytest.mark.parametrize("prefix", PREFIXES)
def test_forwarded_requests_from_a_trusted_network_need_no_token(
    mgr: Manager, prefix: str
) -> None:
    with server(mgr, token=TOKEN, backbeat_trust=["127.0.0.0/8"]) as srv:
        # as CloudServer forwards a signed request, and as Backbeat's own tests send one
        for headers in ({"Authorization": SIGV4, "Content-Type": "application/json"}, {}):
            r = httpx.post(srv.url + prefix + "/crr/pause/zenko", headers=headers)
            assert r.status_code == 200, r.text
            r = httpx.post(srv.url + prefix + "/crr/resume/zenko", headers=headers)
            assert r.status_code == 200, r.text
        events = [h.event for h in mgr.history("zenko") if h.event in ("pause", "resume")]
        assert events == ["resume", "pause", "resume", "pause"]
        # the /v1 mutations still need the token, from the same peer
        r = httpx.post(srv.url + "/v1/locations/zenko/replication/pause",
                       headers={"Content-Type": "application/json"})
        problem(r, 401)
        r = httpx.post(srv.url + "/v1/locations/zenko/replication/pause",
                       headers={"Content-Type": "application/json", "Authorization": SIGV4})
        problem(r, 401)
        assert state(mgr, "zenko") is State.RUNNING


def test_a_backbeat_route_change_names_its_caller(mgr: Manager) -> None:
    """docs/http.md, "Backbeat-compatible routes": the actor of a change is the principal when a
    token was presented, else ``backbeat:<peer address>`` (a --backbeat-trust peer, a signed
    request CloudServer forwarded, a sidecar without tokens); it was ``null``."""
    def actors(loc: str) -> list[str | None]:
        return [h.actor for h in mgr.history(loc) if h.event not in ("create", "settle")]

    with server(mgr, token=TOKEN, backbeat_trust=["127.0.0.0/8"]) as srv:
        for headers in ({"Authorization": SIGV4}, {}):
            r = httpx.post(srv.url + "/_/crr/pause/zenko", headers=headers)
            assert r.status_code == 200, r.text
        for method, path in (("POST", "/_/crr/resume/zenko/schedule"),
                             ("DELETE", "/_/crr/resume/zenko/schedule"),
                             ("POST", "/_/crr/resume/zenko")):
            r = httpx.request(method, srv.url + path)
            assert r.status_code == 200, r.text
        assert actors("zenko") == ["backbeat:127.0.0.1"] * 4  # the second pause changed nothing
        r = httpx.post(srv.url + "/_/crr/pause/zenko",
                       headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200, r.text
        assert actors("zenko")[0] == "operator"  # the single token's principal
    with server(mgr) as srv:  # no token at all: loopback only, the peer names the caller
        r = httpx.post(srv.url + "/_/backbeat/api/ingestion/pause/a-zenko-location")
        assert r.status_code == 200, r.text
        assert actors("a-zenko-location") == ["backbeat:127.0.0.1"]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_forwarded_requests_from_elsewhere_need_the_token(mgr: Manager, prefix: str) -> None:
    with server(mgr, token=TOKEN, backbeat_trust=["10.0.0.0/8"]) as srv:
        url = srv.url + prefix + "/crr/pause/zenko"
        body = problem(httpx.post(url, headers={"Authorization": SIGV4}), 401)
        assert "--backbeat-trust" in body["detail"]
        # a client cannot claim a trusted address in a header: the peer is the socket's
        forged = problem(httpx.post(url, headers={"X-Forwarded-For": "10.1.2.3",
                                                  "Forwarded": "for=10.1.2.3"}), 401)
        # without a token: the 401 says the peer is not trusted (issue 18's new-user review)
        assert ("the peer 127.0.0.1 is not in a --backbeat-trust network (trusted: 10.0.0.0/8)"
                ": a Backbeat-route mutation from it needs an Authorization header with a "
                "bearer token") in forged["detail"], forged["detail"]
        problem(httpx.post(url, headers={"Authorization": "Bearer wrong"}), 403)
        assert state(mgr, "zenko") is State.RUNNING
        r = httpx.post(url, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200, r.text
        assert httpx.get(srv.url + prefix + "/crr/status/zenko").json() == {"zenko": "disabled"}


def test_a_browser_page_under_a_re_pointed_name_cannot_use_the_trust_rule(mgr: Manager) -> None:
    """Found by the hostile review of issue 18: a page whose DNS name was re-pointed at the
    sidecar (DNS rebinding), opened by a browser inside a --backbeat-trust network, is
    same-origin with it (its Origin names the Host it sends), so the Origin check passed and
    the trust rule paused and resumed a site without a token, a forged SigV4 header or none.
    A tokenless mutation a browser sent (it carries Origin) is now served only for a Host that
    no re-pointed name can be: an address, localhost or an --allow-host name."""
    with server(mgr, token=TOKEN, backbeat_trust=["127.0.0.0/8"],
                allowed_hosts=["backbeat-api.zenko.local"]) as srv:
        port = srv.url.rsplit(":", 1)[1]
        url = srv.url + "/_/crr/pause/zenko"
        page = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
        for headers in (page, {**page, "Authorization": SIGV4}):
            body = problem(httpx.post(url, headers=headers), 421)
            assert "--allow-host" in body["detail"], body["detail"]
            assert state(mgr, "zenko") is State.RUNNING
        problem(httpx.delete(srv.url + "/_/backbeat/api/crr/resume/zenko", headers=page), 421)
        # what CloudServer forwards: no Origin at all, or a console's with the sidecar named
        # by address or by an --allow-host name; and anyone with the token
        forwarded: list[dict[str, str]] = [
            {"Host": f"backbeat-api:{port}"},
            {"Host": f"127.0.0.1:{port}", "Origin": "https://console.zenko.local",
             "Authorization": SIGV4},
            {"Host": f"backbeat-api.zenko.local:{port}", "Origin": "https://console.zenko.local",
             "Authorization": SIGV4},
            {**page, "Authorization": f"Bearer {TOKEN}"},
        ]
        for headers in forwarded:
            r = httpx.post(url, headers=headers)
            assert r.status_code == 200, (headers, r.text)
            assert state(mgr, "zenko") is State.PAUSED
            r = httpx.post(srv.url + "/_/crr/resume/zenko", headers=headers)
            assert r.status_code == 200, (headers, r.text)


def test_without_a_trust_rule_a_signed_request_needs_the_token(mgr: Manager) -> None:
    with server(mgr, token=TOKEN) as srv:
        r = httpx.post(srv.url + "/_/crr/pause/zenko", headers={"Authorization": SIGV4})
        problem(r, 401)
        assert state(mgr, "zenko") is State.RUNNING


@pytest.mark.parametrize("bad", ["10.0.0.0/33", "not-a-network", "", "10.0.0.1/8/2"])
def test_a_bad_trust_network_is_refused_before_anything_starts(
    kit: Kit, bad: str
) -> None:
    with pytest.raises(InvalidInput, match="--backbeat-trust"):
        serve(kit.url, host="127.0.0.1", port=0, token=TOKEN, insecure=False,
              reconcile_interval=1.0, check_interval=None, backbeat_trust=[bad])


@pytest.mark.parametrize("everyone", ["0.0.0.0/0", "::/0", "10.1.2.3/0", "0.0.0.0/0.0.0.0"])
def test_a_trust_network_of_every_address_is_refused_by_the_command(
    kit: Kit, tmp_path: Any, everyone: str
) -> None:
    """Issue 18 (hostile review): ``--backbeat-trust 0.0.0.0/0`` was accepted and opened the
    token-less Backbeat mutations to every peer. ``locstatus serve`` now refuses it (exit 2,
    the option named, nothing started: the process ends without serving)."""
    proc = subprocess.run(
        [sys.executable, "-m", "locstatus", "--backend", f"sqlite:///{tmp_path}/t.db",
         "serve", "--port", "0", "--backbeat-trust", "10.100.0.0/16",
         "--backbeat-trust", everyone],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "LOCSTATUS_API_TOKEN": TOKEN},
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "--backbeat-trust" in proc.stderr and "every address" in proc.stderr
    assert "sidecar on http" not in proc.stderr + proc.stdout
    with pytest.raises(InvalidInput, match="every address"):
        serve(kit.url, host="127.0.0.1", port=0, token=TOKEN, insecure=False,
              reconcile_interval=1.0, check_interval=None, backbeat_trust=[everyone])


def test_a_very_wide_trust_network_is_served_with_a_warning(
    mgr: Manager, caplog: pytest.LogCaptureFixture
) -> None:
    """A network wider than a /8 (IPv4) or a /32 (IPv6) is accepted, and the sidecar warns at
    start; a /8 itself is not warned about."""
    caplog.set_level(logging.WARNING, logger="locstatus.api")
    with server(mgr, token=TOKEN, backbeat_trust=["126.0.0.0/7", "10.0.0.0/8", "2001::/31"]):
        pass
    wide = [r.getMessage() for r in caplog.records if "wider than" in r.getMessage()]
    assert wide == [
        "--backbeat-trust 126.0.0.0/7 is wider than a /8: every peer in it may pause and "
        "resume through the Backbeat routes without the token",
        "--backbeat-trust 2001::/31 is wider than a /32: every peer in it may pause and "
        "resume through the Backbeat routes without the token",
    ]
