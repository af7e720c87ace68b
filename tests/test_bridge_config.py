"""What the Backbeat bridge reads of its configuration (docs/backbeat.md, "2. The bridge"):
the project's sample ``config.json`` (Backbeat's format) read through the loader
``locstatus bridge backbeat --config`` uses, and what each service needs of it, as the
refusal of an asked-for service and the "not bridging" reason of one left alone say it.
Nothing connects: a :class:`Bridge` reaches Backbeat's stores only once started."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from locstatus import connect
from locstatus.backbeat_state import BackbeatConfig
from locstatus.bridge import Bridge
from locstatus.client import Client
from locstatus.errors import InvalidInput
from locstatus.importers.command import load_config
from locstatus.locations import sample_path

SERVICES = ["replication", "ingestion", "lifecycle"]


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    c = connect(f"sqlite:///{tmp_path}/ls.db", services=SERVICES)
    yield c
    c.close()


def test_the_sample_config_gives_the_bridge_every_store_it_reads(client: Client) -> None:
    """The sample has Backbeat's ``zookeeper``, ``redis`` and ``queuePopulator.mongo``
    sections and the processors' topics: read as the bridge command reads ``--config``, it
    bridges all three services, none left alone. (Once it had no ``redis`` nor
    ``queuePopulator.mongo``: the bridge had nothing to bridge.)"""
    cfg = load_config(Path(sample_path("config.json")))
    assert cfg.zookeeper == "127.0.0.1:2181/backbeat"
    assert cfg.redis == "redis://127.0.0.1:6379"
    assert cfg.mongodb == "mongodb://127.0.0.1:27017,127.0.0.1:27018,127.0.0.1:27019/?replicaSet=rs0"
    assert cfg.mongodb_database == "metadata"
    assert (cfg.topic("replication"), cfg.topic("ingestion")) == (
        "backbeat-replication", "backbeat-ingestion")
    bridge = Bridge(client, cfg)
    assert bridge.services == SERVICES and bridge.unbridged == {}
    given = load_config(Path(sample_path("config.json")), redis="redis://10.0.0.5:6380")
    assert given.redis == "redis://10.0.0.5:6380"  # the command's option replaces the file's


NO_ZK_REDIS = "no Backbeat ZooKeeper and Redis in the configuration (--zookeeper, --redis)"
NEEDS_ZK_REDIS = "needs Backbeat's ZooKeeper and Redis (--zookeeper, --redis)"


@pytest.mark.parametrize(("without", "left", "refusal"), [
    ("redis", {"replication": NO_ZK_REDIS, "ingestion": NO_ZK_REDIS}, NEEDS_ZK_REDIS),
    ("zookeeper", {"replication": NO_ZK_REDIS, "ingestion": NO_ZK_REDIS}, NEEDS_ZK_REDIS),
    ("mongodb", {"lifecycle": "no Backbeat MongoDB in the configuration (--mongodb)"},
     "needs Backbeat's MongoDB (--mongodb)"),
])
def test_each_service_is_bridged_only_with_what_it_needs(
    client: Client, without: str, left: dict[str, str], refusal: str
) -> None:
    """One part of the sample's configuration missing: the services that need it are left
    alone with why (the command prints it at start), the others bridged; asked for by
    ``--service``, one of them is refused naming what it needs (nothing started)."""
    cfg = replace(load_config(Path(sample_path("config.json"))), **{without: None})
    bridge = Bridge(client, cfg)
    assert bridge.unbridged == left
    assert bridge.services == [s for s in SERVICES if s not in left]
    for service in left:
        with pytest.raises(InvalidInput, match=re.escape(f"bridging {service} {refusal}")):
            Bridge(client, cfg, services=[service])


def test_a_configuration_with_nothing_to_bridge_is_refused(client: Client) -> None:
    with pytest.raises(InvalidInput, match="nothing to bridge"):
        Bridge(client, BackbeatConfig())


def test_a_store_that_does_not_exist_is_refused_not_created(tmp_path: Path) -> None:
    """Found by the hostile review of issue 18: ``locstatus bridge backbeat`` opened its
    ``--backend`` itself, so a typo in a SQLite path created an empty store, which it then
    bridged with no processor registered while pauses went to the real one; every other
    command refuses a store that does not exist (``locstatus import backbeat`` included)."""
    from typer.testing import CliRunner

    from locstatus.cli import app

    store = tmp_path / "typo.db"
    result = CliRunner().invoke(
        app, ["--backend", f"sqlite:///{store}", "bridge", "backbeat",
              "--zookeeper", "127.0.0.1:1", "--redis", "redis://127.0.0.1:1"],
        env={"LOCSTATUS_BACKEND": None, "LOCSTATUS_SERVICES": None})
    assert result.exit_code == 2, result.output
    assert f"no locstatus store at {store}" in result.output, result.output
    assert not store.exists()


def test_an_ipv6_redis_host_and_a_bad_database_name_are_read_as_backbeat_means_them() -> None:
    """Found by the hostile review of issue 18: ``redis.host: "::1"`` made the URL
    ``redis://::1:6390``, refused at start as ``Port could not be cast to integer value as
    ':1:6390'``; a ``queuePopulator.mongo.database`` MongoDB refuses (``x y``) was an
    ``unexpected InvalidName`` once MongoDB was read. The address is bracketed; the name is
    refused before anything starts, naming the field (or ``--mongodb-database``)."""
    from locstatus.bridge.legacy import Publisher

    cfg = BackbeatConfig.from_config({"redis": {"host": "::1", "port": 6390}})
    assert cfg.redis == "redis://[::1]:6390"
    Publisher(cfg.redis).close()  # parses: nothing connects until it publishes
    for name in ("x y", "a.b", "a/b", "a$b"):
        with pytest.raises(InvalidInput, match=r"queuePopulator\.mongo\.database: .* is not a "
                                               "MongoDB database name"):
            BackbeatConfig.from_config({"queuePopulator": {"mongo": {
                "replicaSetHosts": "127.0.0.1:27017", "database": name}}})
        with pytest.raises(InvalidInput, match="--mongodb-database"):
            load_config(None, mongodb="mongodb://127.0.0.1:27017", mongodb_database=name)
