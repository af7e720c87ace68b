"""Processes whose wall clock is off, with Debian's libfaketime (package ``faketime``).

:func:`skew_env` is the environment of a process whose ``time()`` / ``clock_gettime(REALTIME)``
(and so ``datetime.now``) runs ``offset`` away from this host's, e.g. ``+30s``, ``+3h``, ``-3h``:
libfaketime preloaded directly (not through the ``faketime`` wrapper, which forks: a signal to
the PID the test holds would miss the real process), the monotonic clock left real
(``FAKETIME_DONT_FAKE_MONOTONIC``: a host whose clock is off still counts seconds),
``FAKETIME_FORCE_MONOTONIC_FIX=0`` (without it libfaketime 0.9.10 ends every timed wait on a
monotonic condition variable at once, CPython's GIL hand-off among them: every thread waiting
for the GIL spins, and a loaded host's faked processes fall seconds behind; docs/time.md,
"Reproducing a skewed host"), and ``faketime_shim/sitecustomize.py`` on the path for the one
call that combination still breaks (``time.sleep``). The servers of the suite (ZooKeeper, the MongoDB-wire server, the kernel that
stamps SQLite's clock file) run unfaked: they are the backend's clock.

:class:`Skewed` is one such process, stopped by PID at teardown.
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

LIBFAKETIME = "/usr/$LIB/faketime/libfaketime.so.1"
"""As the ``faketime`` wrapper preloads it (the dynamic loader expands ``$LIB``)."""

SHIM = Path(__file__).resolve().parent / "faketime_shim"
HERE = Path(__file__).resolve().parent


def require_libfaketime() -> None:
    """Raise (a failure, never a skip) when libfaketime is not installed."""
    if not glob.glob("/usr/lib/*/faketime/libfaketime.so.1") and not glob.glob(
        "/usr/lib/faketime/libfaketime.so.1"
    ):
        raise RuntimeError(
            "libfaketime is not installed: apt-get install faketime (scripts/setup.sh does)"
        )


def skew_env(offset: str | None) -> dict[str, str]:
    """Environment additions for a process ``offset`` off (``None``: unfaked)."""
    if offset is None:
        return {}
    require_libfaketime()
    path = os.pathsep.join(p for p in (str(SHIM), os.environ.get("PYTHONPATH", "")) if p)
    return {
        "LD_PRELOAD": LIBFAKETIME,
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_FORCE_MONOTONIC_FIX": "0",
        "PYTHONPATH": path,
    }


def mono_to_wall(mono: float) -> float:
    """A ``time.monotonic()`` reading of any process of this host (the monotonic clock is
    left real) as this process's wall time, which is the backend's."""
    return mono + (time.time() - time.monotonic())


class Skewed:
    """``python ARGS`` with its wall clock ``offset`` off; standard output to ``log``, standard
    error to ``log`` + ``.err``."""

    def __init__(self, offset: str | None, args: Sequence[str], log: Path) -> None:
        self.offset = offset
        self.log = log
        self.errors = log.with_name(log.name + ".err")
        self.started = time.time()
        with log.open("ab") as out, self.errors.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **skew_env(offset)},
                start_new_session=True,
            )

    @classmethod
    def cli(cls, offset: str | None, url: str, args: Sequence[str], log: Path) -> Skewed:
        """``locstatus --backend URL ARGS`` (stdout and stderr in ``log``)."""
        return cls(offset, ["-m", "locstatus", "--backend", url, *args], log)

    @classmethod
    def worker(cls, offset: str | None, url: str, worker_id: str, record: Path,
               args: Sequence[str], log: Path) -> Skewed:
        """One ``tests/support/agent_worker.py`` (handler calls recorded to ``record``)."""
        return cls(offset, [str(HERE / "agent_worker.py"), "--url", url, "--id", worker_id,
                            "--record", str(record), *args], log)

    def wait(self, timeout: float) -> int:
        """The exit code; raises ``AssertionError`` with the log if it runs past ``timeout``."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"{self.proc.args} still running after {timeout:g}s:\n"
                                 f"{self.output()}") from None

    def stdout(self) -> str:
        return self.log.read_text(errors="replace")

    def output(self) -> str:
        """The tail of both outputs, for failure messages."""
        err = self.errors.read_text(errors="replace") if self.errors.exists() else ""
        return f"stdout: {self.stdout()[-2000:]}\nstderr: {err[-3000:]}"

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds: by PID only."""
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
