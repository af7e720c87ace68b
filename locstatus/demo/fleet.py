"""The demo's worker processes: start them, read their status files, stop them in order.

Each worker is ``python -m locstatus.demo.worker`` (:mod:`locstatus.demo.worker`), a real OS
process in its own session, so a Ctrl-C in the terminal reaches the demo only and the demo stops
its workers itself: SIGTERM first (a worker unregisters and writes its final counts), SIGKILL
after a timeout. Workers are started with ``--exit-with-parent``, so a demo killed with SIGKILL
leaves none behind. ``$LOCSTATUS_BACKEND`` is removed from their environment: the store is the
one the demo chose, given on the command line.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from locstatus.demo.errors import DemoFailed
from locstatus.demo.worker import read_status

__all__ = ["WORKER_LEASE", "Fleet", "Worker"]

WORKER_LEASE = 5.0
"""Lease of the demo's workers, in seconds."""


@dataclass
class Worker:
    """One worker process of the demo: its id, status file and log, once started its
    process."""

    worker_id: str
    status_file: Path
    log_file: Path
    proc: subprocess.Popen[bytes] | None = None
    log_fh: IO[bytes] | None = None
    exit_code: int | None = None


class Fleet:
    """The demo's worker processes (``python -m locstatus.demo.worker``), each in its own
    session so a Ctrl-C in the terminal reaches the demo only and the demo stops them in
    order."""

    def __init__(
        self, url: str, services: Sequence[str], workdir: Path, count: int
    ) -> None:
        self.url = url
        self.services = tuple(services)
        self.workers = [
            Worker(
                f"demo-{i}",
                workdir / f"demo-{i}.json",
                workdir / f"demo-{i}.log",
            )
            for i in range(1, count + 1)
        ]

    @property
    def ids(self) -> list[str]:
        return [w.worker_id for w in self.workers]

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "LOCSTATUS_BACKEND"}
        env["PYTHONUNBUFFERED"] = "1"
        for w in self.workers:
            w.log_fh = open(w.log_file, "ab")  # noqa: SIM115 - closed in stop()
            w.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "locstatus.demo.worker",
                    "--backend", self.url,
                    "--id", w.worker_id,
                    "--services", ",".join(self.services),
                    "--status-file", str(w.status_file),
                    "--lease", str(WORKER_LEASE),
                    "--no-fire-resumes",
                    "--exit-with-parent",
                    "--log-every", "0",
                ],
                stdin=subprocess.DEVNULL,
                stdout=w.log_fh,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def statuses(self) -> dict[str, dict[str, Any] | None]:
        return {w.worker_id: read_status(w.status_file) for w in self.workers}

    def pids(self) -> dict[str, int | None]:
        return {w.worker_id: (w.proc.pid if w.proc else None) for w in self.workers}

    def running(self) -> dict[str, bool]:
        return {w.worker_id: w.proc is not None and w.proc.poll() is None for w in self.workers}

    def check_alive(self) -> None:
        """Raise :class:`DemoFailed` naming the first worker that exited, with its log."""
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is not None:
                raise DemoFailed(
                    f"worker {w.worker_id} (pid {w.proc.pid}) exited with code "
                    f"{w.proc.returncode}; last lines of {w.log_file}:\n{self.log_tail(w)}"
                )

    def stop(self, timeout: float = 15.0) -> dict[str, int | None]:
        """SIGTERM every worker, wait up to ``timeout`` seconds in all, SIGKILL what is left.
        Returns each worker's exit code (negative: killed by that signal). Idempotent."""
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for w in self.workers:
            if w.proc is None:
                continue
            try:
                w.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
            w.exit_code = w.proc.returncode
        for w in self.workers:
            if w.log_fh is not None:
                w.log_fh.close()
                w.log_fh = None
        return {w.worker_id: w.exit_code for w in self.workers}

    @staticmethod
    def log_tail(w: Worker, lines: int = 15) -> str:
        try:
            text = w.log_file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "  (no log)"
        tail = text.strip().splitlines()[-lines:]
        return "\n".join("  " + line for line in tail) or "  (empty log)"


# -- what the demo sees --------------------------------------------------------------------------

