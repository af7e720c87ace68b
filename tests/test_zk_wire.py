"""What the ZooKeeper backend writes on the wire itself, instead of through kazoo's builders, is
byte for byte what kazoo writes (property tests, no server): a multi-op of labelled operations
(``txn.Transaction``) as kazoo's ``Transaction.serialize``; multiRead requests cut within both
of their bounds. The servers' answers to both are in test_zk_backend.py and
test_zk_multiread.py."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from kazoo.client import KazooClient
from kazoo.protocol.serialization import Transaction as KazooTransaction
from kazoo.security import make_acl, make_digest_acl

from locstatus.backends.zookeeper import multiread
from locstatus.backends.zookeeper.multiread import node_bytes, requests
from locstatus.backends.zookeeper.txn import Transaction

paths = st.lists(  # as the layout builds them: absolute, normal, no "." or ".." (names checked)
    st.text(alphabet="abz09-._é", min_size=1, max_size=30).filter(lambda c: c not in (".", "..")),
    min_size=1, max_size=5,
).map(lambda parts: "/" + "/".join(parts))
data = st.binary(max_size=300)
versions = st.integers(min_value=-1, max_value=2**31 - 1)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("check"), paths, versions),
        st.tuples(st.just("set_data"), paths, data, versions),
        st.tuples(st.just("create"), paths, data, st.booleans()),
        st.tuples(st.just("delete"), paths, versions),
    ),
    max_size=40,
)
acls = st.sampled_from([
    None,
    [make_digest_acl("ops", "secret", all=True)],
    [make_digest_acl("ops", "secret", all=True), make_acl("world", "anyone", read=True)],
])


@given(operations, acls, st.sampled_from(["", "/tenant"]))
def test_a_multi_op_is_encoded_as_kazoo_encodes_it(
    ops: list[tuple[Any, ...]], acl: Any, chroot: str
) -> None:
    client = KazooClient(hosts="127.0.0.1:1" + chroot, default_acl=acl)  # never started
    ours, theirs = Transaction(client), client.transaction()
    for name, path, *args in ops:
        if name == "create":
            ours.create(name, path, args[0], ephemeral=args[1])
            theirs.create(path, args[0], ephemeral=args[1])
        else:
            getattr(ours, name)(name, path, *args)
            getattr(theirs, name)(path, *args)
    sent: list[Any] = []
    client._call = lambda request, result: sent.append(request)  # what the connection gets
    ours.tx.commit_async()
    assert len(sent) == 1 and sent[0].type == KazooTransaction.type
    assert sent[0].serialize() == bytes(KazooTransaction(theirs.operations).serialize())
    assert ours.labels == [name for name, *_ in ops]


@given(
    st.lists(st.text(alphabet="ab/é", min_size=1, max_size=300), max_size=700),
    st.integers(min_value=20, max_value=4096),
)
def test_multiread_requests_keep_every_path_in_order_within_both_bounds(
    paths: list[str], max_bytes: int
) -> None:
    runs = requests(paths, max_bytes)
    assert [p for run in runs for p in run] == paths
    for run in runs:
        assert 1 <= len(run) <= multiread.PER_REQUEST
        size = sum(node_bytes(p) for p in run) + 17  # + the end header, xid and opcode
        assert size <= max_bytes or len(run) == 1
