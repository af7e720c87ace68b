"""Raw kazoo baseline for ``bench/transition.py``: the ZooKeeper I/O of one locstatus transition.

A locstatus pause/resume on ZooKeeper reads the location's znode and writes one multi-op (the
versioned ``set_data`` of the new payload plus the ``create`` of its history node; locstatus adds
a ``check`` of the incarnation counter to the same multi-op). The baseline does exactly that with
a bare kazoo client on the same server and chroot: ``get`` + JSON parse + ``transaction(set_data
(version), create(history))``, every result inspected.

Importing this module registers ``RAW["zk"]`` in the running ``transition`` module. Run it
directly to start a throwaway ZooKeeper (``tests/support/servers.py``, Debian's package) when no
``--url`` is given::

    python bench/raw_zk.py [--url zk://127.0.0.1:2181/bench] [--rounds 7] [--ops 300] [--json F]
    python bench/transition.py --backend zk --url zk://127.0.0.1:2181/bench   # existing server
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from kazoo.client import KazooClient  # noqa: E402

from locstatus.backends.zookeeper import parse_zk_url  # noqa: E402


def _transition() -> ModuleType:
    """The running transition module: ``__main__`` when transition.py is the script."""
    main = sys.modules.get("__main__")
    if main is not None and hasattr(main, "RAW") and hasattr(main, "raw_payloads"):
        return main
    import transition

    return transition


def raw_zk(url: str, location: str) -> tuple[Callable[[int], None], Callable[[], None]]:
    """``factory(url, location) -> (op(i), close)``: one raw transition per call."""
    params = parse_zk_url(url)
    auth = [("digest", ":".join(params.auth))] if params.auth else None
    client = KazooClient(hosts=params.hosts, timeout=params.session_timeout, auth_data=auth)
    client.start(timeout=params.timeout)
    path = f"{params.chroot}/locations/{location}"
    history_dir = f"{params.chroot}/bench-raw/{uuid.uuid4().hex[:8]}"
    client.ensure_path(history_dir)
    recs, hists = _transition().raw_payloads(location)
    # the same bytes locstatus stores (its payload carries the record's incarnation)
    records = [(r[:-1] + ',"incarnation":0}').encode() for r in recs]
    histories = [h.encode() for h in hists]
    counter = iter(range(1, 2**31))  # op(i) restarts i at 0 every round: name nodes apart

    def op(i: int) -> None:
        data, stat = client.get(path)
        json.loads(data)
        tx = client.transaction()
        tx.set_data(path, records[i % 2], stat.version)
        tx.create(f"{history_dir}/{next(counter):010d}", histories[i % 2])
        results = tx.commit()
        failed = [r for r in results if isinstance(r, Exception)]
        assert not failed, failed

    def close() -> None:
        client.stop()
        client.close()

    return op, close


_transition().RAW["zk"] = raw_zk


def main() -> None:
    """Same as ``python bench/transition.py --backend zk [--url ...] [--rounds N] [--ops N]
    [--json PATH]``: without ``--url`` it starts its own server."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import transition

    transition.main(["--backend", "zk", *sys.argv[1:]])


if __name__ == "__main__":
    main()
