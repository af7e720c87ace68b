"""``locstatus import backbeat`` from real ZooKeeper nodes and MongoDB documents written in
Backbeat's format (docs/backbeat.md, "1. Import"): every state imported through the manager
(one history entry per change, actor ``import:backbeat``), a second run writes nothing,
``--dry-run`` writes nothing, a past scheduled resume is a resume, bad legacy data of every
shape is reported per location while the others are imported, and locations known on one
side only are reported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from typer.testing import CliRunner, Result

from locstatus import Manager, State, open_backend
from locstatus.backbeat_state import js_date
from locstatus.cli import app
from locstatus.importers import backbeat as importer
from locstatus.models import HistoryEntry, WorkerInfo

from support.kits import Kit
from support.kits_zk import raw_client
from support.servers import MongoHandle

NOW = datetime.now(UTC)
LATER = (NOW + timedelta(hours=5)).replace(microsecond=123000)
PAST = (NOW - timedelta(hours=1)).replace(microsecond=0)
LOCATIONS = {
    "zenko": ["replication"],
    "aws-location": ["replication", "lifecycle"],
    "wontwork-location": ["replication", "lifecycle"],
    "a-zenko-location": ["ingestion"],
    "us-east-1": ["lifecycle"],
    "us-east-2": ["lifecycle"],
    "only-here": ["replication"],
}
BACKBEAT = Path(__file__).resolve().parents[1] / ".." / "shared" / "fixtures" / "backbeat"
ENV = {"LOCSTATUS_BACKEND": None, "LOCSTATUS_SERVICES": None}


def node(paused: bool, when: datetime | None = None, *, key: bool = True) -> bytes:
    """A state node as Backbeat's processors write it (JSON.stringify: no spaces)."""
    state: dict[str, Any] = {"paused": paused}
    if key:
        state["scheduledResume"] = None if when is None else js_date(when)
    return json.dumps(state, separators=(",", ":")).encode()


@dataclass
class Legacy:
    """A Backbeat deployment's state stores: a ZooKeeper chroot and a MongoDB database."""

    zk_hosts: str
    zk: KazooClient
    mongo: MongoHandle
    database: str

    @property
    def hosts(self) -> str:
        return self.zk_hosts

    def put(self, service: str, location: str, data: bytes) -> None:
        path = f"/backbeat/{service}/state/{location}"
        if self.zk.exists(path):
            self.zk.set(path, data)
        else:
            self.zk.create(path, data, makepath=True)

    def doc(self, location: str, value: Any) -> None:
        client = self.mongo.client()
        try:
            client[self.database]["__locationStatusStore"].replace_one(
                {"_id": location}, {"_id": location, "value": value}, upsert=True)
        finally:
            client.close()

    def args(self) -> list[str]:
        return ["--zookeeper", self.zk_hosts, "--mongodb", self.mongo.uri,
                "--mongodb-database", self.database]


@pytest.fixture
def legacy(zk_server: Any, mongo_server: MongoHandle) -> Iterator[Legacy]:
    chroot = f"/bb-{uuid.uuid4().hex[:10]}"
    with raw_client(zk_server.hosts) as root:
        root.create(chroot)
    hosts = f"{zk_server.hosts}{chroot}"
    with raw_client(hosts) as zk:
        yield Legacy(hosts, zk, mongo_server, f"bb_{uuid.uuid4().hex[:10]}")


def lifecycle(paused: bool, when: datetime | None = None) -> dict[str, Any]:
    entry = {"paused": paused, "scheduledResume": None if when is None else js_date(when)}
    return {"crr": None, "ingestion": None, "lifecycle": entry}


def good_state(legacy: Legacy) -> None:
    legacy.put("replication", "zenko", node(True))
    legacy.put("replication", "aws-location", node(True, LATER))
    legacy.put("replication", "wontwork-location", node(False, key=False))  # a fresh node
    legacy.put("ingestion", "a-zenko-location", node(True, PAST))
    legacy.put("replication", "gone-from-config", node(True))
    legacy.doc("us-east-1", lifecycle(True))
    legacy.doc("aws-location", lifecycle(True, LATER))
    legacy.doc("wontwork-location", lifecycle(False))
    legacy.doc("us-east-2", {"crr": None, "ingestion": None, "lifecycle": None})


def run(url: str, *args: str) -> Result:
    return CliRunner().invoke(app, ["--backend", url, "import", "backbeat", *args], env=ENV,
                              catch_exceptions=False)


def imported(mgr: Manager, loc: str) -> list[HistoryEntry]:
    return [h for h in mgr.history(loc) if h.actor == importer.ACTOR]


def test_import_every_state_once(kit: Kit, legacy: Legacy) -> None:
    mgr = Manager(open_backend(kit.url))
    try:
        mgr.sync_locations(LOCATIONS)
        mgr.pause("wontwork-location", "replication")  # Backbeat says running: resumed
        mgr.pause("a-zenko-location", "ingestion")
        good_state(legacy)
        result = run(kit.url, *legacy.args(), "--json")
        assert result.exit_code == 0, (result.stdout, result.stderr)
        report = json.loads(result.stdout)
        events = sorted((c["location"], c["service"], c["event"]) for c in report["changes"])
        assert events == [
            ("a-zenko-location", "ingestion", "resume"),
            ("aws-location", "lifecycle", "pause"),
            ("aws-location", "lifecycle", "schedule_resume"),
            ("aws-location", "replication", "pause"),
            ("aws-location", "replication", "schedule_resume"),
            ("us-east-1", "lifecycle", "pause"),
            ("wontwork-location", "replication", "resume"),
            ("zenko", "replication", "pause"),
        ]
        assert [c["due"] for c in report["changes"] if c["location"] == "a-zenko-location"] == [True]
        assert report["errors"] == []
        assert report["only_in_backbeat"] == ["gone-from-config/replication"]
        # us-east-2's document says lifecycle: null (Backbeat has no lifecycle there)
        assert report["only_in_locstatus"] == ["only-here/replication", "us-east-2/lifecycle"]
        assert sorted(report["unchanged"]) == ["wontwork-location/lifecycle"]

        def svc(loc: str, service: str) -> Any:
            return mgr.status(loc).services[service]

        assert svc("zenko", "replication").state is State.PAUSED
        assert svc("zenko", "replication").resume_at is None
        assert svc("aws-location", "replication").paused
        assert svc("aws-location", "replication").resume_at == LATER
        assert svc("aws-location", "lifecycle").resume_at == LATER
        assert svc("us-east-1", "lifecycle").paused
        assert svc("us-east-2", "lifecycle").state is State.RUNNING
        assert svc("wontwork-location", "replication").state is State.RUNNING
        assert svc("a-zenko-location", "ingestion").state is State.RUNNING
        # one history entry per change, each naming the import
        changes = [h for h in imported(mgr, "aws-location") if h.event != "settle"]
        assert sorted(h.event for h in changes) == ["pause", "pause", "schedule_resume",
                                                    "schedule_resume"]
        assert len(imported(mgr, "zenko")) == 1 + sum(
            1 for h in imported(mgr, "zenko") if h.event == "settle")
        versions = {loc: mgr.status(loc).version for loc in LOCATIONS}
        # idempotent: a second run writes nothing
        again = json.loads(run(kit.url, *legacy.args(), "--json").stdout)
        assert again["changes"] == []
        assert {loc: mgr.status(loc).version for loc in LOCATIONS} == versions
    finally:
        mgr.close()


def js_to_string(when: datetime, tz: str) -> str:
    """``when`` as Node's ``Date.prototype.toString`` writes it in time zone ``tz``: what
    Backbeat's ``LocationStatus.setServiceResumeSchedule`` stores in a lifecycle document
    (``date.toString()``, ``Fri Jun 28 2030 07:40:20 GMT+0200 (Central European Summer
    Time)``), unlike the ISO date its processors write in ZooKeeper."""
    ms = int(when.timestamp() * 1000)
    out = subprocess.run(["node", "-e", f"process.stdout.write(new Date({ms}).toString())"],
                         env={**os.environ, "TZ": tz}, capture_output=True, text=True,
                         check=True, timeout=60)
    return out.stdout


def test_a_lifecycle_schedule_as_backbeat_writes_it_is_imported(
    tmp_path: Any, legacy: Legacy
) -> None:
    """Found by the hostile review of issue 18: Backbeat's lifecycle documents carry a
    scheduled resume as JavaScript's ``Date.toString()`` (its LocationStatus model), not ISO
    8601, and the import refused every such document as bad data (exit 1, not imported)."""
    url = f"sqlite:///{tmp_path}/ls.db"
    mgr = Manager(open_backend(url))
    try:
        mgr.sync_locations({"us-east-1": ["lifecycle"], "us-east-2": ["lifecycle"]})
        at = LATER.replace(microsecond=0)  # toString() has no milliseconds
        for loc, tz in (("us-east-1", "UTC"), ("us-east-2", "Asia/Kolkata")):
            text = js_to_string(at, tz)
            assert " GMT" in text and text.endswith(")"), text
            legacy.doc(loc, {"lifecycle": {"paused": True, "scheduledResume": text}})
        result = run(url, *legacy.args(), "--json")
        assert result.exit_code == 0, (result.stdout, result.stderr)
        for loc in ("us-east-1", "us-east-2"):
            svc = mgr.status(loc).services["lifecycle"]
            assert svc.paused and svc.resume_at == at, (loc, svc)
        legacy.doc("us-east-1", {"lifecycle": {
            "paused": True, "scheduledResume": "Fri Jun 31 2030 05:40:20 GMT+0000 (UTC)"}})
        result = run(url, *legacy.args(), "--json")
        assert result.exit_code == 1
        assert "is not a valid date" in json.loads(result.stdout)["errors"][0]["detail"]
    finally:
        mgr.close()


def test_dry_run_writes_nothing(tmp_path: Any, legacy: Legacy) -> None:
    url = f"sqlite:///{tmp_path}/ls.db"
    mgr = Manager(open_backend(url))
    try:
        mgr.sync_locations(LOCATIONS)
        good_state(legacy)
        versions = {loc: mgr.status(loc).version for loc in LOCATIONS}
        result = run(url, *legacy.args(), "--dry-run")
        assert result.exit_code == 0, result.stderr
        assert "would pause zenko/replication" in result.stdout
        assert "dry run: nothing written" in result.stdout
        assert {loc: mgr.status(loc).version for loc in LOCATIONS} == versions
        result = run(url, *legacy.args())
        assert result.exit_code == 0, result.stderr
        assert "did pause zenko/replication" in result.stdout
        assert mgr.status("zenko").services["replication"].paused
    finally:
        mgr.close()


def test_the_summary_counts_services_says_a_passed_schedule_and_an_unread_source(
    tmp_path: Any, legacy: Legacy
) -> None:
    """Found by the new-user review (issue 18): the summary counted writes on the first run
    and services on the second (``3 change(s), 2 unchanged`` then ``0 change(s), 4
    unchanged`` for the same 4 services); a ``scheduledResume`` already passed on a location
    locstatus already has running was only "unchanged" though docs/cli.md says it is
    reported; and lifecycle, with no MongoDB named, was left out without a word."""
    url = f"sqlite:///{tmp_path}/ls.db"
    mgr = Manager(open_backend(url))
    try:
        mgr.sync_locations({"zenko": ["replication"], "aws-location": ["replication"],
                            "quiet": ["replication"], "past-site": ["replication"],
                            "us-east-1": ["lifecycle"]})
        legacy.put("replication", "zenko", node(True))
        legacy.put("replication", "aws-location", node(True, LATER))  # a pause + a schedule
        legacy.put("replication", "quiet", node(False))
        legacy.put("replication", "past-site", node(True, PAST))  # locstatus: running already
        zk_only = ["--zookeeper", legacy.zk_hosts]
        first = run(url, *zk_only)
        assert first.exit_code == 0, first.stderr
        assert "2 service(s) changed (3 write(s)), 2 unchanged, 0 not imported" in first.stdout
        assert ("unchanged past-site/replication (its scheduled resume passed; running "
                "already)") in first.stdout, first.stdout
        assert "not importing lifecycle: no MongoDB named" in first.stderr, first.stderr
        again = run(url, *zk_only)
        assert "0 service(s) changed (0 write(s)), 4 unchanged, 0 not imported" in again.stdout
        report = json.loads(run(url, *zk_only, "--json").stdout)
        assert report["passed"] == ["past-site/replication"]
        assert list(report["skipped"]) == ["lifecycle"]
        assert mgr.status("past-site").services["replication"].state is State.RUNNING
    finally:
        mgr.close()


BAD_NODES: dict[str, tuple[bytes, str]] = {
    "not-json": (b"{paused: true", "not JSON"),
    "not-utf8": (b"\xff\xfe{}", "not JSON"),
    "empty": (b"", "not JSON"),
    "a-list": (b"[true]", "expected a JSON object"),
    "no-paused": (b'{"scheduledResume":null}', "'paused' is missing"),
    "paused-string": (b'{"paused":"true"}', "'paused' must be true or false"),
    "paused-number": (b'{"paused":1}', "'paused' must be true or false"),
    "date-number": (b'{"paused":true,"scheduledResume":1530164420600}', "date string or null"),
    "date-garbage": (b'{"paused":true,"scheduledResume":"next tuesday"}', "not an ISO 8601"),
    "date-naive": (b'{"paused":true,"scheduledResume":"2030-06-28T05:40:20"}', "not an ISO 8601"),
    "date-impossible": (b'{"paused":true,"scheduledResume":"2030-02-31T05:40:20.000Z"}',
                        "not a valid date"),
    "date-too-far": (b'{"paused":true,"scheduledResume":"9999-12-31T23:59:59.999Z"}',
                     "more than ten years ahead"),
}
BAD_DOCS: dict[str, tuple[Any, str]] = {
    "doc-no-value": (None, "'value' is missing"),
    "doc-value-list": ([1], "'value' is missing or not an object"),
    "doc-no-lifecycle": ({"crr": None, "ingestion": None}, "'value.lifecycle' is missing"),
    "doc-lifecycle-string": ({"lifecycle": "paused"}, "expected a JSON object"),
    "doc-paused-null": ({"lifecycle": {"paused": None}}, "'paused' must be true or false"),
    "doc-bad-date": ({"lifecycle": {"paused": True, "scheduledResume": "2030-13-01T00:00:00Z"}},
                     "not a valid date"),
    "doc-date-too-far": ({"lifecycle": {"paused": True,
                                        "scheduledResume": "9999-12-31T23:59:59.999Z"}},
                         "more than ten years ahead"),
}


def test_bad_legacy_data_is_reported_per_location(tmp_path: Any, legacy: Legacy) -> None:
    url = f"sqlite:///{tmp_path}/ls.db"
    names = {**{k: ["replication"] for k in BAD_NODES}, **{k: ["lifecycle"] for k in BAD_DOCS},
             "good-site": ["replication"], "good-lc": ["lifecycle"]}
    mgr = Manager(open_backend(url))
    try:
        mgr.sync_locations(names)
        for loc, (data, _) in BAD_NODES.items():
            legacy.put("replication", loc, data)
        for loc, (value, _) in BAD_DOCS.items():
            client = legacy.mongo.client()
            try:
                doc: dict[str, Any] = {"_id": loc}
                if value is not None:
                    doc["value"] = value
                client[legacy.database]["__locationStatusStore"].insert_one(doc)
            finally:
                client.close()
        legacy.put("replication", "good-site", node(True))
        legacy.put("replication", "Bad Name!", node(True))
        legacy.doc("good-lc", lifecycle(True))
        versions = {loc: mgr.status(loc).version for loc in names}
        result = run(url, *legacy.args(), "--json")
        assert result.exit_code == 1, result.stderr
        report = json.loads(result.stdout)
        errors = {e["location"]: e for e in report["errors"]}
        for loc, (_, why) in {**BAD_NODES, **BAD_DOCS}.items():
            assert why in errors[loc]["detail"], (loc, errors[loc])
            assert loc in errors[loc]["detail"]  # names the node or document
            assert mgr.status(loc).version == versions[loc]
        assert "Bad Name!" in errors and "zk:/backbeat/replication/state/Bad Name!" in (
            errors["Bad Name!"]["source"])
        assert len(errors) == len(BAD_NODES) + len(BAD_DOCS) + 1
        # the others are imported
        assert mgr.status("good-site").services["replication"].paused
        assert mgr.status("good-lc").services["lifecycle"].paused
        text = run(url, *legacy.args())
        assert text.exit_code == 1
        assert "not imported: not-json/replication: zk:/backbeat/replication/state/not-json: " \
               "not JSON" in text.stderr
    finally:
        mgr.close()


def test_a_node_that_vanishes_mid_read_is_reported(
    tmp_path: Any, legacy: Legacy, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path}/ls.db"
    mgr = Manager(open_backend(url))
    try:
        mgr.sync_locations({"zenko": ["replication"], "vanishing": ["replication"]})
        legacy.put("replication", "zenko", node(True))
        legacy.put("replication", "vanishing", node(True))
        real_get = KazooClient.get

        def get_after_delete(self: KazooClient, path: str, *a: Any, **kw: Any) -> Any:
            if path.endswith("/vanishing"):  # listed, then deleted before its read
                legacy.zk.delete(path)
            return real_get(self, path, *a, **kw)

        monkeypatch.setattr(KazooClient, "get", get_after_delete)
        result = run(url, "--zookeeper", legacy.hosts, "--json")
        assert result.exit_code == 1, result.stderr
        report = json.loads(result.stdout)
        assert [(e["location"], "vanished" in e["detail"]) for e in report["errors"]] == [
            ("vanishing", True)]
        assert mgr.status("zenko").services["replication"].paused
        assert mgr.status("vanishing").services["replication"].state is State.RUNNING
    finally:
        mgr.close()


def test_config_json_names_the_sources(tmp_path: Any, legacy: Legacy) -> None:
    """Backbeat's own config.json (the shared sample, with its ZooKeeper pointed at the test
    server) tells where to read."""
    sample = json.loads((BACKBEAT / "config.json").read_text())
    sample["zookeeper"]["connectionString"] = legacy.hosts
    del sample["queuePopulator"]["mongo"]
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(sample))
    url = f"sqlite:///{tmp_path}/ls.db"
    mgr = Manager(open_backend(url))
    try:
        mgr.sync_locations({"zenko": ["replication", "lifecycle"]})
        legacy.put("replication", "zenko", node(True))
        result = run(url, "--config", str(cfg), "--json")
        assert result.exit_code == 0, result.stderr
        report = json.loads(result.stdout)
        assert [c["event"] for c in report["changes"]] == ["pause"]
        assert report["only_in_locstatus"] == []  # lifecycle was not read: not reported
    finally:
        mgr.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [([], "nothing to import from"),
     (["--zookeeper", "127.0.0.1:1", "--replication-namespace", "backbeat"], "ZooKeeper path"),
     (["--config", "/nonexistent/config.json"], "cannot read")],
)
def test_bad_options_are_refused(tmp_path: Any, args: list[str], message: str) -> None:
    url = f"sqlite:///{tmp_path}/ls.db"
    Manager(open_backend(url)).close()
    result = run(url, *args)
    assert result.exit_code == 2
    assert message in result.stderr


def test_an_unreachable_source_is_exit_2_and_writes_nothing(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path}/ls.db"
    mgr = Manager(open_backend(url))
    try:
        mgr.sync_locations({"zenko": ["replication"]})
        version = mgr.status("zenko").version
        from support.servers import free_ports
        port = free_ports(1)[0]
        result = CliRunner().invoke(
            app, ["--backend", url, "import", "backbeat", "--timeout", "0.5", "--mongodb",
                  f"mongodb://127.0.0.1:{port}/"],
            env=ENV, catch_exceptions=False)
        assert result.exit_code == 2, result.stdout
        assert "__locationStatusStore" in result.stderr
        # one line naming what did not answer, not pymongo's topology description
        assert result.stderr.strip().count("\n") == 0, result.stderr
        assert "Topology" not in result.stderr and "no MongoDB server answered" in result.stderr
        assert mgr.status("zenko").version == version
    finally:
        mgr.close()


def test_with_json_a_refusal_is_a_json_error_on_stdout_too(tmp_path: Any) -> None:
    """``--json`` and a source that does not answer: the error object on stdout (it was
    empty), the line on stderr and exit 2 as without --json (docs/cli.md, "import
    backbeat")."""
    url = f"sqlite:///{tmp_path}/ls.db"
    Manager(open_backend(url)).close()
    from support.servers import free_ports
    port = free_ports(1)[0]
    args = ["--timeout", "0.5", "--mongodb", f"mongodb://127.0.0.1:{port}/"]
    for json_opt in ([], ["--json"]):
        result = run(url, *args, *json_opt)
        assert result.exit_code == 2, (result.stdout, result.stderr)
        line = result.stderr.strip()
        assert line.startswith("error: ") and "no MongoDB server answered" in line, line
        if not json_opt:
            assert result.stdout == ""
            continue
        error = json.loads(result.stdout)["error"]
        assert error["message"] == line.removeprefix("error: ")
        assert error["exit_code"] == 2 and error["type"] and error["title"]


def test_a_zookeeper_chroot_that_does_not_exist_is_refused(
    tmp_path: Any, legacy: Legacy
) -> None:
    """A mistyped chroot (``/bakbeat``) read as "no Backbeat state" listed every location as
    only in locstatus, exit 0 (a new-user review): a chroot that does not exist is an error
    naming it, and nothing is written."""
    url = f"sqlite:///{tmp_path}/ls.db"
    legacy.put("replication", "zenko", node(True))
    mgr = Manager(open_backend(url))
    try:
        mgr.sync_locations({"zenko": ["replication"]})
        version = mgr.status("zenko").version
        wrong = legacy.hosts + "-typo"
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            result = run(url, "--zookeeper", wrong)
        # kazoo's own warning about the chroot reached the operator's terminal as a second,
        # source-quoting message beside the import's one line (a new-user review)
        assert [str(w.message) for w in warned if "chroot" in str(w.message)] == []
        assert result.exit_code != 0, result.stdout
        assert f"no Backbeat state in ZooKeeper at {wrong}" in result.stderr, result.stderr
        assert "its chroot" in result.stderr and "does not exist" in result.stderr
        assert "only in locstatus" not in result.stdout
        assert mgr.status("zenko").version == version
        good = run(url, "--zookeeper", legacy.hosts)  # the right chroot still imports
        assert good.exit_code == 0, good.stderr
        assert mgr.status("zenko").services["replication"].state is State.PAUSED
    finally:
        mgr.close()


def test_after_the_bridge_took_over_the_import_refuses_unless_forced(
    kit: Kit, legacy: Legacy
) -> None:
    """docs/backbeat.md "1. Import": once the bridge's standing registrations exist, Backbeat's
    state nodes are a copy of locstatus's (the bridge cleared ``scheduledResume`` there), so a
    re-import would cancel locstatus's scheduled resume: refused (exit 1, naming the
    registrations, nothing written); ``--force`` imports as asked."""
    mgr = Manager(open_backend(kit.url))
    holder = kit.open()
    try:
        mgr.sync_locations({"zenko": ["replication"]})
        mgr.pause("zenko", "replication")
        mgr.resume("zenko", "replication", at=LATER)
        # what the bridge leaves: its registration, and the node as the processor wrote it
        holder.put_worker(WorkerInfo(
            worker_id="backbeat.replication.zenko", services=("replication",),
            locations=("zenko",), host="bridge-host", pid=42, standing=True,
            lease_expires_at=None if holder.session_leases else NOW + timedelta(hours=1)))
        legacy.put("replication", "zenko", node(True))
        version = mgr.status("zenko").version
        for args in ([], ["--dry-run"], ["--json"]):
            refused = run(kit.url, *legacy.args(), *args)
            assert refused.exit_code == 1, (refused.stdout, refused.stderr)
            assert "the Backbeat bridge has taken over" in refused.stderr
            assert "backbeat.replication.zenko" in refused.stderr
            assert "--force" in refused.stderr
            assert "cancel_scheduled_resume" not in refused.stdout
            if args == ["--json"]:  # a script reading stdout sees why too
                error = json.loads(refused.stdout)["error"]
                assert error["type"] == "BridgeTookOver" and error["exit_code"] == 1
                assert "backbeat.replication.zenko" in error["message"]
        assert mgr.status("zenko").version == version
        assert mgr.status("zenko").services["replication"].resume_at == LATER
        forced = run(kit.url, *legacy.args(), "--force")
        assert forced.exit_code == 0, (forced.stdout, forced.stderr)
        assert "did cancel_scheduled_resume zenko/replication" in forced.stdout
        assert mgr.status("zenko").services["replication"].resume_at is None
    finally:
        holder.close()
        mgr.close()


def test_a_service_the_bridge_does_not_bridge_yet_can_still_be_imported(
    kit: Kit, legacy: Legacy
) -> None:
    """A bridge ran without Backbeat's MongoDB (replication only) and lifecycle is to be added:
    its Backbeat state was unreachable to import (refused as taken over) and the bridge, given
    MongoDB, would write locstatus's over it (a new-user review). ``--service lifecycle``
    imports it while the bridge holds only replication; replication stays refused."""
    mgr = Manager(open_backend(kit.url))
    holder = kit.open()
    try:
        mgr.sync_locations({"aws-location": ["replication", "lifecycle"]})
        holder.put_worker(WorkerInfo(
            worker_id="backbeat.replication.aws-location", services=("replication",),
            locations=("aws-location",), host="bridge-host", pid=42, standing=True,
            lease_expires_at=None if holder.session_leases else NOW + timedelta(hours=1)))
        legacy.put("replication", "aws-location", node(True))
        legacy.doc("aws-location", lifecycle(True, LATER))
        for args in ([], ["--service", "replication"], ["--service", "lifecycle",
                                                         "--service", "replication"]):
            refused = run(kit.url, *legacy.args(), *args)
            assert refused.exit_code == 1 and "has taken over" in refused.stderr, args
        bad = run(kit.url, *legacy.args(), "--service", "nosuch")
        assert bad.exit_code != 0 and "--service 'nosuch': not a service" in bad.stderr
        done = run(kit.url, *legacy.args(), "--service", "lifecycle")
        assert done.exit_code == 0, (done.stdout, done.stderr)
        status = mgr.status("aws-location").services
        assert status["lifecycle"].paused and status["lifecycle"].resume_at == LATER
        assert status["replication"].state is State.RUNNING  # not read: the bridge's
        assert all(h.service == "lifecycle" for h in imported(mgr, "aws-location"))
    finally:
        holder.close()
        mgr.close()


@pytest.mark.parametrize(("command", "missing"), [
    (["import", "backbeat", "--zookeeper", "127.0.0.1:1"], "kazoo"),
    (["import", "backbeat", "--mongodb", "mongodb://127.0.0.1:1/"], "pymongo"),
    (["bridge", "backbeat", "--zookeeper", "127.0.0.1:1", "--redis", "redis://127.0.0.1:1"],
     "redis"),
])
def test_without_the_backbeat_extra_the_commands_say_what_to_install(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, command: list[str], missing: str
) -> None:
    """README "Extras": without the client library the command says which extra to install
    (as the zk:// backend does), not an unexpected ModuleNotFoundError."""
    url = f"sqlite:///{tmp_path}/ls.db"
    Manager(open_backend(url)).close()
    monkeypatch.setitem(sys.modules, missing, None)  # what an environment without it imports
    result = CliRunner().invoke(app, ["--backend", url, *command], env=ENV,
                                catch_exceptions=False)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "pip install 'locstatus[backbeat]'" in result.stderr, result.stderr
    assert "unexpected" not in result.stderr
