"""The pieces every backend shares, on their own: record versions across lives
(``backends/versions.py``), history pages (``backends/history.py``), URL redaction
(``backends/urls.py``) and hint coalescing (``backends/hints.py``). The contract suite checks
them through every backend; these tests state their rules directly, with generated inputs.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from locstatus.backends import Backend, codec, missing_store, open_backend, redact_url
from locstatus.backends.hints import HintBatch
from locstatus.backends.history import HistoryPage
from locstatus.backends.mongo import MongoBackend
from locstatus.backends.versions import LIVES, VersionScheme
from locstatus.backends.zookeeper import ZooKeeperBackend
from locstatus.errors import InvalidInput
from locstatus.models import Hint, HistoryEntry, State

T0 = datetime(2026, 1, 1, tzinfo=UTC)

lives = st.integers(min_value=0, max_value=2**20)
seqs = st.integers(min_value=1, max_value=(1 << 20) - 1)


# -- versions ----------------------------------------------------------------------------------


@given(lives, seqs)
def test_a_version_splits_back_into_its_life_and_write(life: int, seq: int) -> None:
    assert LIVES.split(LIVES.join(life, seq)) == (life, seq)
    assert LIVES.writes_since_create(LIVES.join(life, seq)) == seq - 1


@given(lives, seqs, st.integers(min_value=1, max_value=5))
def test_a_recreated_record_starts_above_every_version_of_its_earlier_lives(
    life: int, seq: int, later: int
) -> None:
    assert LIVES.first(life + later) > LIVES.join(life, seq)


def test_the_first_life_counts_like_a_plain_counter() -> None:
    assert [LIVES.join(0, n) for n in (1, 2, 3)] == [1, 2, 3]
    assert LIVES.first(0) == 1
    assert LIVES.seq_mask == (1 << 20) - 1
    assert VersionScheme(shift=32).first(1) == (1 << 32) + 1


# -- history pages -----------------------------------------------------------------------------


def _write(version: int, n: int) -> tuple[int, str]:
    """A stored write of ``n`` entries, stamped with ``version``."""
    entries = [
        HistoryEntry(op_id=f"op-{version}-{i}", at=T0, location="loc", service="replication",
                     event="pause", from_state=State.RUNNING, to_state=State.PAUSING, generation=i)
        for i in range(n)
    ]
    return version, codec.encode_history(codec.stamp(entries, version))


writes_strategy = st.lists(st.integers(min_value=0, max_value=3), max_size=12)


@given(writes_strategy, st.integers(min_value=0, max_value=15),
       st.none() | st.integers(min_value=1, max_value=14))
def test_a_page_holds_whole_writes_newest_first_until_the_limit(
    sizes: list[int], limit: int, before: int | None
) -> None:
    writes = [_write(v, n) for v, n in enumerate(sizes, start=1)]
    page = HistoryPage("loc", limit, before=before)
    page.take(reversed(writes))
    # the reference: each eligible write whole, newest first, until the limit is reached,
    # and at least one write read
    expected: list[str | None] = []
    read = False
    for version, n in reversed(list(enumerate(sizes, start=1))):
        if before is not None and version >= before:
            continue
        if read and len(expected) >= limit:
            break
        expected.extend(f"op-{version}-{i}" for i in reversed(range(n)))
        read = True
    assert [e.op_id for e in page.entries] == expected


def test_a_full_page_draws_no_further_write() -> None:
    drawn: list[int] = []

    def writes() -> object:
        for version in (3, 2, 1):
            drawn.append(version)
            yield _write(version, 2)

    page = HistoryPage("loc", 2)
    assert page.take(writes()) is True  # type: ignore[arg-type]
    assert drawn == [3] and page.full
    assert page.take([_write(0, 1)]) is True and len(page.entries) == 2


# -- URL redaction -----------------------------------------------------------------------------


def test_credentials_never_show_in_a_redacted_url() -> None:
    assert redact_url("mongodb://u:secret@db1,db2/?replicaSet=rs") == "mongodb://***@db1,db2/?replicaSet=rs"
    assert redact_url("zk://ops:p%40ss@zk1:2181/locstatus") == "zk://***@zk1:2181/locstatus"
    assert redact_url("sqlite:///./locstatus.db") == "sqlite:///./locstatus.db"
    assert redact_url("zk://u:secret@[::1") == "zk://***@[::1"  # does not split: still hidden


@given(st.text(alphabet=st.characters(blacklist_characters="/@?#[]", min_codepoint=33,
                                       max_codepoint=126), min_size=1, max_size=20))
def test_no_password_survives_redaction(password: str) -> None:
    for scheme, rest in (("mongodb", "db1:27017/"), ("zk", "zk1/chroot?timeout=5")):
        assert redact_url(f"{scheme}://user:{password}@{rest}") == f"{scheme}://***@{rest}"


# -- hint coalescing ---------------------------------------------------------------------------


def test_a_batch_keeps_one_hint_per_kind_and_location_in_first_seen_order() -> None:
    batch = HintBatch()
    for hint in (Hint(kind="location", location="a"), Hint(kind="workers"),
                 Hint(kind="location", location="b"), Hint(kind="location", location="a")):
        batch.add(hint)
    assert [(h.kind, h.location) for h in batch.take()] == [
        ("location", "a"), ("workers", None), ("location", "b")
    ]
    assert not batch


@given(st.lists(st.booleans(), min_size=1, max_size=6))
def test_a_lost_session_is_never_taken_back_by_a_later_resync(lost: list[bool]) -> None:
    batch = HintBatch()
    for flag in lost:
        batch.add(Hint(kind="resync", session_lost=flag))
    (resync,) = batch.take()
    assert resync.kind == "resync" and resync.session_lost is any(lost)


# -- what a front end asks a backend instead of reading its URL --------------------------------


def test_a_missing_sqlite_file_is_named_and_nothing_is_created(tmp_path: Path) -> None:
    db = tmp_path / "sub" / "typo.db"
    assert missing_store(f"sqlite:///{db}") == str(db.resolve())
    assert not db.exists() and not db.parent.exists()
    backend = open_backend(f"sqlite:///{tmp_path / 'there.db'}")
    backend.close()
    assert missing_store(f"sqlite:///{tmp_path / 'there.db'}") is None
    assert missing_store("memory://") is None  # no store to be missing


def test_a_bad_url_is_refused_before_anything_is_looked_up() -> None:
    with pytest.raises(InvalidInput, match="bogus"):
        missing_store("bogus://x")
    with pytest.raises(InvalidInput, match="timeout"):
        missing_store("sqlite:///./x.db?timeout=-1")


def test_reads_are_local_only_where_the_store_is_on_this_host(tmp_path: Path) -> None:
    """The sidecar serves single reads on its event loop for these (docs/http.md)."""
    for url in ("memory://", f"sqlite:///{tmp_path / 'l.db'}"):
        backend = open_backend(url)
        try:
            assert backend.local_reads, url
        finally:
            backend.close()
    assert not Backend.local_reads
    assert not ZooKeeperBackend.local_reads and not MongoBackend.local_reads  # network stores
