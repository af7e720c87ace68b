"""What the test suites share, and nothing else: how each suite reaches each backend (``kits``,
``kits_zk``, ``kits_mongo``), the real servers they start (``servers``: ZooKeeper, SecantusDB),
a controllable clock (``fakeclock``), processes with a skewed clock (``skew``, libfaketime), a
small tmpfs that really fills up (``fulldisk``), the damaged-record shapes (``corrupt_shapes``),
the history checker (``history_check``) and a worker program the tests run as a separate
process (``agent_worker``). Imported as ``from support.kits import Kit``: ``tests/`` is on the
path of every pytest run (its conftest), and the scripts here need only ``locstatus``.
"""
