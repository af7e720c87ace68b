"""Location lists (docs/design.md §5.2): plain lists, the project's own samples, the real Backbeat sample
configuration, and files an operator could get wrong. Every malformed file must be refused with
an :class:`InvalidInput` naming the file and the bad value, before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from locstatus import InvalidInput, connect
from locstatus.locations import (
    SAMPLE_FILES,
    load_locations,
    load_sample,
    sample_path,
)

ALL3 = ("ingestion", "lifecycle", "replication")
BACKBEAT = Path(__file__).resolve().parents[1] / ".." / "shared" / "fixtures" / "backbeat"


def write(tmp_path: Path, name: str, content: str | bytes | object) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_text(json.dumps(content), encoding="utf-8")
    return path


def backbeat_config(bootstrap: object = None, sources: object = None) -> dict[str, object]:
    return {
        "zookeeper": {"connectionString": "127.0.0.1:2181/backbeat"},
        "extensions": {
            "replication": {"destination": {"bootstrapList": bootstrap or []}},
            "ingestion": {"sources": sources or []},
        },
    }


# -- plain lists ------------------------------------------------------------------------------


def test_plain_list_ignores_comments_and_blank_lines_and_gives_every_service(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path,
        "sites.txt",
        "# production sites\n\nus-east-1\n  eu-west-par   # Paris\r\n\t\n"
        "ap-south-tokyo\nus-east-1\n#dr-site-a\n",
    )
    assert load_locations(path) == {
        "ap-south-tokyo": ALL3,
        "eu-west-par": ALL3,
        "us-east-1": ALL3,
    }


def test_plain_list_uses_the_configured_services_and_the_crr_alias(tmp_path: Path) -> None:
    path = write(tmp_path, "sites.txt", "site-1\nsite-2\n")
    assert load_locations(path, services=["crr", "gc"]) == {
        "site-1": ("gc", "replication"),
        "site-2": ("gc", "replication"),
    }


def test_utf8_bom_and_json_array_of_names(tmp_path: Path) -> None:
    assert load_locations(write(tmp_path, "bom.txt", "\ufeffsite-1\n".encode())) == {"site-1": ALL3}
    assert load_locations(write(tmp_path, "list.json", ["b", "a"])) == {"a": ALL3, "b": ALL3}


# -- the project's own samples ------------------------------------------------------------------

OWN_SAMPLE = {
    "ap-south-tokyo": ("ingestion", "replication"),
    "cold-archive-1": ("lifecycle",),
    "dr-site-a": ("replication",),
    "eu-west-par": ("lifecycle", "replication"),
    "us-east-1": ("ingestion", "lifecycle"),
}


def test_own_samples_are_package_data_in_the_backbeat_format() -> None:
    for name in SAMPLE_FILES:
        assert sample_path(name).is_file(), name
    config = json.loads(sample_path("config.json").read_text())
    assert "bootstrapList" in config["extensions"]["replication"]["destination"]
    assert load_sample() == OWN_SAMPLE
    assert load_locations(sample_path("config.json"), sample_path("locationConfig.json")) == (
        OWN_SAMPLE
    )


def test_own_plain_sample_lists_the_same_locations_with_every_service() -> None:
    loaded = load_locations(sample_path("locations.txt"))
    assert sorted(loaded) == sorted(OWN_SAMPLE)
    assert set(loaded.values()) == {ALL3}


def test_sample_path_refuses_other_names() -> None:
    with pytest.raises(InvalidInput, match=r"'\.\./pyproject\.toml'"):
        sample_path("../pyproject.toml")


# -- the real Backbeat samples ------------------------------------------------------------------

needs_backbeat = pytest.mark.skipif(
    not (BACKBEAT / "config.json").is_file(), reason=f"no Backbeat fixtures at {BACKBEAT}"
)


@needs_backbeat
def test_backbeat_config_and_location_config() -> None:
    loaded = load_locations(BACKBEAT / "config.json", BACKBEAT / "locationConfig.json")
    by_service: dict[str, set[str]] = {}
    for loc, services in loaded.items():
        for svc in services:
            by_service.setdefault(svc, set()).add(loc)
    assert by_service == {
        "replication": {"zenko", "wontwork-location", "aws-location"},
        "ingestion": {"a-zenko-location"},
        "lifecycle": {"us-east-1", "us-east-2", "wontwork-location", "location-dmf-v1"},
    }
    assert loaded["wontwork-location"] == ("lifecycle", "replication")


@needs_backbeat
def test_backbeat_files_alone() -> None:
    assert load_locations(BACKBEAT / "config.json") == {
        "a-zenko-location": ("ingestion",),
        "aws-location": ("replication",),
        "wontwork-location": ("replication",),
        "zenko": ("replication",),
    }
    assert load_locations(BACKBEAT / "locationConfig.json") == {
        "location-dmf-v1": ("lifecycle",),
        "us-east-1": ("lifecycle",),
        "us-east-2": ("lifecycle",),
        "wontwork-location": ("lifecycle",),
    }


@needs_backbeat
def test_backbeat_services_outside_the_configured_set_are_left_out() -> None:
    loaded = load_locations(
        BACKBEAT / "config.json",
        BACKBEAT / "locationConfig.json",
        services=("replication", "lifecycle"),
    )
    assert "a-zenko-location" not in loaded  # ingestion only
    assert loaded["zenko"] == ("replication",)


@needs_backbeat
def test_backbeat_locations_sync_into_sqlite_with_only_their_services(tmp_path: Path) -> None:
    wanted = load_locations(BACKBEAT / "config.json", BACKBEAT / "locationConfig.json")
    with connect(f"sqlite:///{tmp_path}/l.db") as mgr:
        report = mgr.sync_locations(wanted)
        assert report.added == sorted(wanted)
        stored = {r.location: tuple(sorted(r.services)) for r in mgr.statuses()}
    assert stored == wanted


# -- malformed files ---------------------------------------------------------------------------

REPL = "extensions.replication.destination.bootstrapList"
MALFORMED: list[tuple[str, str | bytes | object, list[str]]] = [
    ("empty.txt", "", ["no location found"]),
    ("comments.txt", "# nothing here\n\n   \n", ["no location found"]),
    ("bad-line.txt", "ok-1\n../etc\n", ["line 2", "'../etc'"]),
    ("spaces.txt", "us east 1\n", ["line 1", "'us east 1'"]),
    ("dot.txt", ".\n", ["line 1", "'.'"]),
    ("dotdot.txt", "ok\n..\n", ["line 2", "'..'"]),
    ("slash.txt", "a/b\n", ["'a/b'"]),
    ("leading-dash.txt", "-x\n", ["'-x'"]),
    ("leading-dot.txt", ".hidden\n", ["'.hidden'"]),
    ("unicode.txt", "café\n", ["'café'"]),
    ("control.txt", "a\x1bb\n", ["line 1", "'a\\x1bb'"]),
    ("long.txt", "x" * 10_000 + "\n", ["line 1", "'xxxx"]),
    ("reserved.txt", "all\n", ["'all'", "reserved"]),
    ("latin1.txt", "caf\xe9\n".encode("latin-1"), ["not UTF-8", "0xe9"]),
    ("broken.json", '{"extensions": {', ["invalid JSON", "line 1"]),
    ("nested.json", "[" * 100_000, ["invalid JSON"]),
    ("names.json", ["ok", 7], ["[1]", "number 7"]),
    ("ext.json", {"extensions": []}, ["extensions: expected an object"]),
    ("repl.json", {"extensions": {"replication": "zenko"}}, ["extensions.replication"]),
    ("bl.json", backbeat_config(bootstrap={"site": "x"}), [f"{REPL}: expected a list"]),
    ("item.json", backbeat_config(bootstrap=["zenko"]), [f"{REPL}[0]", "string 'zenko'"]),
    ("nosite.json", backbeat_config(bootstrap=[{"type": "aws_s3"}]), [f"{REPL}[0]", "'site'"]),
    ("numsite.json", backbeat_config(bootstrap=[{"site": 5}]), [f"{REPL}[0].site", "number 5"]),
    (
        "badsite.json",
        backbeat_config(bootstrap=[{"site": "a"}, {"site": "../x"}]),
        [f"{REPL}[1].site", "'../x'"],
    ),
    (
        "src.json",
        {"extensions": {"ingestion": {"sources": {}}}},
        ["extensions.ingestion.sources: expected a list"],
    ),
    (
        "nolc.json",
        backbeat_config(sources=[{"name": "s"}]),
        ["extensions.ingestion.sources[0]", "'locationConstraint'"],
    ),
    (
        "badlc.json",
        backbeat_config(sources=[{"locationConstraint": "a b"}]),
        ["sources[0].locationConstraint", "'a b'"],
    ),
    ("nothing.json", backbeat_config(), ["no location found"]),
    ("lc-value.json", {"us-east-1": "file"}, ["us-east-1", "string 'file'"]),
    ("lc-key.json", {"../../etc": {}}, ["'../../etc'"]),
]


@pytest.mark.parametrize(("name", "content", "expected"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_file_is_refused_naming_file_and_value(
    tmp_path: Path, name: str, content: str | bytes | object, expected: list[str]
) -> None:
    path = write(tmp_path, name, content)
    with pytest.raises(InvalidInput) as err:
        load_locations(path)
    message = str(err.value)
    assert str(path) in message
    for part in expected:
        assert part in message, (part, message)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="no such file") as err:
        load_locations(tmp_path / "absent.txt")
    assert "absent.txt" in str(err.value)
    with pytest.raises(InvalidInput, match="is a directory"):
        load_locations(tmp_path)


def test_bad_location_config_is_named(tmp_path: Path) -> None:
    config = write(tmp_path, "config.json", backbeat_config(bootstrap=[{"site": "zenko"}]))
    with pytest.raises(InvalidInput, match=r"missing-lc\.json: no such file"):
        load_locations(config, tmp_path / "missing-lc.json")
    lc = write(tmp_path, "lc.json", ["us-east-1"])
    with pytest.raises(InvalidInput, match=r"lc\.json: expected a locationConfig\.json object"):
        load_locations(config, lc)
    lc = write(tmp_path, "lc2.json", {"ok": {}, "bad name": {}})
    with pytest.raises(InvalidInput, match=r"lc2\.json: key 'bad name'"):
        load_locations(config, lc)


def test_location_config_is_refused_with_formats_that_do_not_take_one(tmp_path: Path) -> None:
    lc = write(tmp_path, "lc.json", {"us-east-1": {}})
    for name, content in [("a.txt", "site-1\n"), ("b.json", ["site-1"]), ("c.json", {"x": {}})]:
        path = write(tmp_path, name, content)
        with pytest.raises(InvalidInput, match=str(lc)):
            load_locations(path, lc)


def test_oversized_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("locstatus.locations.MAX_FILE_BYTES", 64)
    path = write(tmp_path, "big.txt", "site-1\n" * 20)
    with pytest.raises(InvalidInput, match="larger than 64 bytes"):
        load_locations(path)


def test_bad_configured_services_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "a.txt", "site-1\n")
    with pytest.raises(InvalidInput, match="'Bad Name'"):
        load_locations(path, services=["Bad Name"])
    with pytest.raises(InvalidInput, match="no service"):
        load_locations(path, services=[])
