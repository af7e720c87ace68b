"""This process's instance id: a random name made once per process, written into the
registrations that must tell their writer apart from any other (docs/backbeat.md, "2. The
bridge", One bridge publishes).

A host name and a pid do not name a process: two containers with a fixed host name (or on
the host's network) each run their main process as pid 1 in its own pid namespace, and read
each other's registrations as their own. A random id made in the process itself (made again
in a forked child, whose pid differs) tells them apart with no coordination.
"""

from __future__ import annotations

import os
import uuid

_made: tuple[int, str] | None = None


def process_instance() -> str:
    """This process's instance id (32 hex digits, :func:`uuid.uuid4`), the same for the
    process's lifetime; a child forked from it gets its own."""
    global _made
    pid = os.getpid()
    if _made is None or _made[0] != pid:
        _made = (pid, uuid.uuid4().hex)
    return _made[1]
