"""Static validation of ``docker-compose.yml`` and ``Dockerfile`` (no Docker engine needed).

This machine has no Docker engine, so the stack is checked the way a reviewer would read it, but
mechanically: the YAML is parsed and interpolated like ``docker compose config`` does; every
service, port, healthcheck and ``depends_on`` condition is checked against the others; every
build context and Dockerfile must exist in the repository and install real extras; and every
command the containers run is run here against a real SQLite store (or, for ``serve``, parsed by
the real CLI with the server function replaced), so a renamed option or module breaks this test
and not a deployment.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml  # PyYAML
from typer.testing import CliRunner

import locstatus.api.server
from locstatus.backends.zookeeper import parse_zk_url
from locstatus.cli import app
from locstatus.client import connect
from locstatus.demo import worker as demo_worker
from locstatus.locations import load_sample

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"

EXPECTED_SERVICES = {
    "zk1", "zk2", "zk3", "mongo", "locations-sync", "sidecar", "worker-1", "worker-2", "check",
}
ZK_SERVICES = ("zk1", "zk2", "zk3")
LOCSTATUS_SERVICES = ("locations-sync", "sidecar", "worker-1", "worker-2", "check")
LONG_RUNNING_WITH_HEALTH = ("zk1", "zk2", "zk3", "mongo", "sidecar", "worker-1", "worker-2")
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
TOKEN = "test-token-123"


# -- compose-style interpolation -----------------------------------------------------------------

_VAR = re.compile(
    r"\$\$|\$\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)"
)


class MissingVariable(Exception):
    pass


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Docker Compose's variable substitution: ``$$``, ``${VAR}``, ``${VAR:-default}``,
    ``${VAR-default}``, ``${VAR:?message}``, ``${VAR?message}``, ``$VAR`` (values only)."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group("braced") or m.group("bare")
        op, arg = m.group("op"), m.group("arg") or ""
        current = env.get(name)
        unset_or_empty = not current
        if op == ":-":
            return arg if unset_or_empty else str(current)
        if op == "-":
            return arg if current is None else current
        if op in (":?", "?") and (unset_or_empty if op == ":?" else current is None):
            raise MissingVariable(f"{name}: {arg}")
        return current or ""

    return _VAR.sub(sub, value)


def load_compose(env: Mapping[str, str]) -> dict[str, Any]:
    raw = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(raw, dict)
    data: dict[str, Any] = interpolate(raw, env)
    return data


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose({"LOCSTATUS_API_TOKEN": TOKEN})


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    svcs: dict[str, dict[str, Any]] = compose["services"]
    return svcs


def _env_of(svc: Mapping[str, Any]) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _argv(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    return [str(v) for v in value]


def _duration(value: str) -> float:
    m = re.fullmatch(r"(\d+)(ms|s|m|h)", value)
    assert m, f"bad compose duration {value!r}"
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def _ports(svc: Mapping[str, Any]) -> list[tuple[str, int, int]]:
    """(host ip, host port, container port) of each published port (short syntax)."""
    out = []
    for spec in svc.get("ports", []):
        parts = str(spec).split(":")
        assert len(parts) == 3, f"publish with an explicit address: {spec!r}"
        out.append((parts[0], int(parts[1]), int(parts[2])))
    return out


# -- the shape of the stack ----------------------------------------------------------------------


def test_services_are_the_documented_stack(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == EXPECTED_SERVICES


def test_the_api_token_is_required() -> None:
    with pytest.raises(MissingVariable, match="LOCSTATUS_API_TOKEN"):
        load_compose({})
    with pytest.raises(MissingVariable, match="LOCSTATUS_API_TOKEN"):
        load_compose({"LOCSTATUS_API_TOKEN": ""})
    sidecar = load_compose({"LOCSTATUS_API_TOKEN": TOKEN})["services"]["sidecar"]
    assert _env_of(sidecar)["LOCSTATUS_API_TOKEN"] == TOKEN


def test_zookeeper_ensemble(services: dict[str, dict[str, Any]]) -> None:
    ids = []
    ensembles = []
    for name in ZK_SERVICES:
        svc = services[name]
        image, _, tag = svc["image"].partition(":")
        assert image == "zookeeper" and tag and tag != "latest", "official image, pinned"
        env = _env_of(svc)
        servers = {}
        for entry in env["ZOO_SERVERS"].split():
            m = re.fullmatch(r"server\.(\d+)=([\w.-]+):2888:3888;2181", entry)
            assert m, entry
            servers[m.group(1)] = m.group(2)
        # The node's own id names this service; every node lists the same three.
        assert servers[env["ZOO_MY_ID"]] == name
        assert sorted(servers.values()) == sorted(ZK_SERVICES)
        ids.append(int(env["ZOO_MY_ID"]))
        ensembles.append(servers)
        assert env.get("ZOO_STANDALONE_ENABLED") == "false"
        assert svc.get("hostname", name) == name
        assert any(v.endswith(":/data") for v in svc["volumes"])
    assert sorted(ids) == [1, 2, 3]
    assert all(e == ensembles[0] for e in ensembles)


def test_backend_url_points_at_the_ensemble(services: dict[str, dict[str, Any]]) -> None:
    for name in LOCSTATUS_SERVICES:
        url = _env_of(services[name])["LOCSTATUS_BACKEND"]
        assert url == "zk://zk1:2181,zk2:2181,zk3:2181/locstatus"
        params = parse_zk_url(url)
        assert params.chroot == "/locstatus"
        assert sorted(h.split(":")[0] for h in params.hosts.split(",")) == sorted(ZK_SERVICES)
    # And the documented switch to MongoDB is one variable.
    other = load_compose(
        {"LOCSTATUS_API_TOKEN": TOKEN,
         "LOCSTATUS_BACKEND": "mongodb://mongo:27017/locstatus?replicaSet=rs0"}
    )["services"]
    assert {_env_of(other[n])["LOCSTATUS_BACKEND"] for n in LOCSTATUS_SERVICES} == {
        "mongodb://mongo:27017/locstatus?replicaSet=rs0"
    }


def test_mongo_is_a_single_member_replica_set_initiated_idempotently(
    services: dict[str, dict[str, Any]],
) -> None:
    mongo = services["mongo"]
    image, _, tag = mongo["image"].partition(":")
    assert image == "mongo" and tag and tag != "latest"
    argv = _argv(mongo["command"])
    assert argv[argv.index("--replSet") + 1] == "rs0"
    test = mongo["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1] == "mongosh"
    script = test[-1]
    # rs.initiate only when rs.status() says there is no replica set yet, with this service as
    # its one member; healthy only once it is the writable primary.
    assert re.search(r"try\s*\{\s*rs\.status\(\)\s*\}\s*catch", script)
    assert "_id: 'rs0'" in script and "host: 'mongo:27017'" in script
    assert "isWritablePrimary" in script
    assert any(v.endswith(":/data/db") for v in mongo["volumes"])


def test_healthchecks(services: dict[str, dict[str, Any]]) -> None:
    for name in LONG_RUNNING_WITH_HEALTH:
        hc = services[name].get("healthcheck")
        assert hc, f"{name} has no healthcheck"
        assert hc["test"][0] in ("CMD", "CMD-SHELL")
        assert _duration(hc["interval"]) > 0 and _duration(hc["timeout"]) > 0
        assert int(hc["retries"]) >= 1
        assert _duration(hc.get("start_period", "0s")) >= 0
    for name in ZK_SERVICES:
        assert services[name]["healthcheck"]["test"] == ["CMD-SHELL", "zkServer.sh status"]


def test_sidecar_healthcheck_probes_its_own_readiness_route(
    services: dict[str, dict[str, Any]],
) -> None:
    sidecar = services["sidecar"]
    argv = _argv(sidecar["command"])
    port = int(argv[argv.index("--port") + 1])
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert [(ip, cport) for ip, _, cport in _ports(sidecar)] == [("127.0.0.1", port)]
    test = sidecar["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    assert f"http://127.0.0.1:{port}/readyz" in test[3]
    compile(test[3], "<healthcheck>", "exec")  # valid Python


def test_published_ports_are_loopback_and_distinct(services: dict[str, dict[str, Any]]) -> None:
    published = [(ip, hport) for svc in services.values() for ip, hport, _ in _ports(svc)]
    assert all(ip == "127.0.0.1" for ip, _ in published)
    assert len(published) == len(set(published))
    for name in ZK_SERVICES:
        assert [c for _, _, c in _ports(services[name])] == [2181]


def test_depends_on_conditions(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        deps = svc.get("depends_on") or {}
        assert isinstance(deps, dict), f"{name}: use the long depends_on syntax"
        for target, spec in deps.items():
            assert target in services, f"{name} depends on unknown {target}"
            condition = spec["condition"]
            assert condition in CONDITIONS
            if condition == "service_healthy":
                assert services[target].get("healthcheck"), f"{target} has no healthcheck"
            if condition == "service_completed_successfully":
                assert services[target].get("restart") == "no", f"{target} is not one-shot"
    for name in LOCSTATUS_SERVICES:
        deps = services[name]["depends_on"]
        for store in (*ZK_SERVICES, "mongo"):
            assert deps[store]["condition"] == "service_healthy", (name, store)
        if name != "locations-sync":
            assert deps["locations-sync"]["condition"] == "service_completed_successfully"
    # No cycle: a topological order exists.
    done: set[str] = set()
    pending = dict(services)
    while pending:
        ready = [n for n, s in pending.items() if set(s.get("depends_on") or {}) <= done]
        assert ready, f"depends_on cycle among {sorted(pending)}"
        for n in ready:
            done.add(n)
            del pending[n]


def test_named_volumes_are_declared(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    used = {
        v.split(":")[0]
        for svc in compose["services"].values()
        for v in svc.get("volumes", [])
        if not v.startswith((".", "/"))
    }
    assert used and used <= declared


# -- build: everything it needs is in the repository ---------------------------------------------


def test_every_build_exists_and_installs_real_extras(services: dict[str, dict[str, Any]]) -> None:
    builds = {name: svc["build"] for name, svc in services.items() if "build" in svc}
    assert set(builds) == set(LOCSTATUS_SERVICES)
    images = {services[name]["image"] for name in builds}
    assert len(images) == 1, "one image for every locstatus service"
    for build in builds.values():
        context = (ROOT / build["context"]).resolve()
        assert context == ROOT
        assert (context / build.get("dockerfile", "Dockerfile")).is_file()
    for name, svc in services.items():
        if "build" not in svc:
            assert ":" in svc["image"] and not svc["image"].endswith(":latest"), name


def _dockerfile() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instr, _, rest = line.partition(" ")
            out.append((instr.upper(), rest.strip()))
    return out


def test_dockerfile() -> None:
    instructions = _dockerfile()
    froms = [arg for instr, arg in instructions if instr == "FROM"]
    assert froms == ["python:3.11-slim"]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    project = pyproject["project"]
    # COPY sources exist, including the README the package build reads.
    copied = []
    for instr, arg in instructions:
        if instr == "COPY":
            *sources, _dest = shlex.split(arg)
            copied += [s for s in sources if not s.startswith("--")]
    assert project["readme"] in copied and "pyproject.toml" in copied
    for src in copied:
        assert (ROOT / src).exists(), src
    # It installs the package with the zk, mongo and server extras, which exist.
    run = " ".join(arg for instr, arg in instructions if instr == "RUN")
    m = re.search(r"pip install \"?[^\s\"]*\[([a-z,]+)\]", run)
    assert m, run
    extras = set(m.group(1).split(","))
    assert extras == {"zk", "mongo", "server"}
    assert extras <= set(project["optional-dependencies"])
    # Non-root, and the entry point is the package's console script.
    users = [arg for instr, arg in instructions if instr == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    entry = [json.loads(arg) for instr, arg in instructions if instr == "ENTRYPOINT"]
    assert entry == [["locstatus"]]
    assert "locstatus" in project["scripts"]
    assert "8080" in [arg for instr, arg in instructions if instr == "EXPOSE"]


# -- every command the containers run is real ---------------------------------------------------


def _image_argv(svc: Mapping[str, Any]) -> list[str]:
    """What the container runs: the service's entrypoint (or the image's, ``locstatus``)
    followed by its command."""
    entry = _argv(svc.get("entrypoint")) or ["locstatus"]
    return entry + _argv(svc.get("command"))


def _run_locstatus(
    args: list[str], env: Mapping[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "locstatus", *args],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout,
    )


def test_help_lists_every_command_the_stack_uses(services: dict[str, dict[str, Any]]) -> None:
    top = subprocess.run(
        [sys.executable, "-m", "locstatus", "--help"], capture_output=True, text=True, timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    ).stdout
    used = {_image_argv(services[n])[1] for n in ("locations-sync", "sidecar")} | {"check"}
    for command in used:
        assert re.search(rf"^\W*{command}\b", top, re.M), f"'locstatus {command}' missing"


def test_locations_sync_and_check_commands_run(
    services: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    env = {"LOCSTATUS_BACKEND": f"sqlite:///{tmp_path / 'stack.db'}"}
    sync = _image_argv(services["locations-sync"])
    assert sync[0] == "locstatus"
    done = _run_locstatus(sync[1:], env)
    assert done.returncode == 0, done.stderr
    with connect(env["LOCSTATUS_BACKEND"]) as mgr:
        assert {r.location for r in mgr.statuses()} == set(load_sample())
    again = _run_locstatus(sync[1:], env)  # one-shot, but safe to run again
    assert again.returncode == 0, again.stderr


def test_check_loop_runs_the_check_repeatedly(
    services: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    check = services["check"]
    argv = _image_argv(check)
    assert argv[:2] == ["/bin/sh", "-c"] and len(argv) == 3
    script = argv[2]
    assert "locstatus check" in script and "sleep" in script
    store = f"sqlite:///{tmp_path / 'stack.db'}"
    with connect(store) as mgr:
        mgr.sync_locations(load_sample())
    metrics = tmp_path / "check.prom"
    script = script.replace("/tmp/locstatus-check.prom", str(metrics))
    assert str(metrics) in script, "the metrics file path moved: update this test"
    env = {
        **os.environ,
        **_env_of(check),
        "LOCSTATUS_BACKEND": store,
        "CHECK_INTERVAL_SECONDS": "0.2",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    assert _env_of(check)["CHECK_INTERVAL_SECONDS"].isdigit()
    proc = subprocess.Popen(
        ["/bin/sh", "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )
    out = ""
    try:
        deadline = time.monotonic() + 90
        lines: Iterator[str] = iter(proc.stdout)  # type: ignore[arg-type]
        while out.count("locstatus check exit code") < 2:
            assert time.monotonic() < deadline, out
            line = next(lines, None)
            assert line is not None, out
            out += line
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    assert out.count("locstatus check exit code 0") == 2, out
    assert "locstatus_check" in metrics.read_text(encoding="utf-8")


def test_sidecar_command_reaches_serve_with_the_stack_settings(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    sidecar = services["sidecar"]
    argv = _image_argv(sidecar)
    assert argv[0] == "locstatus"
    calls: list[tuple[Any, dict[str, Any]]] = []
    monkeypatch.setattr(
        locstatus.api.server, "serve", lambda url, **kw: calls.append((url, kw))
    )
    result = CliRunner().invoke(app, argv[1:], env=_env_of(sidecar))
    assert result.exit_code == 0, result.output
    [(url, kw)] = calls
    assert url == "zk://zk1:2181,zk2:2181,zk3:2181/locstatus"
    assert kw["host"] == "0.0.0.0" and kw["port"] == 8080
    assert kw["token"] == TOKEN, "the token reaches the server: non-loopback bind allowed"
    assert kw["insecure"] is False
    assert kw["reconcile_interval"] > 0


def test_worker_commands_parse_and_match_their_healthchecks(
    services: dict[str, dict[str, Any]],
) -> None:
    ids = set()
    for name in ("worker-1", "worker-2"):
        svc = services[name]
        argv = _image_argv(svc)
        assert argv[:3] == ["python", "-m", "locstatus.demo.worker"]
        assert argv[2] == demo_worker.__name__
        args = demo_worker.parse_args(argv[3:])
        assert not args.healthcheck and args.status_file is not None
        ids.add(args.worker_id)
        assert args.worker_id == name
        hc = svc["healthcheck"]["test"]
        assert hc[:4] == ["CMD", "python", "-m", "locstatus.demo.worker"]
        hc_args = demo_worker.parse_args(hc[4:])
        assert hc_args.healthcheck and hc_args.status_file == args.status_file
        assert hc_args.max_age > _duration(svc["healthcheck"]["interval"])
    assert len(ids) == 2
