"""The model checks (``model/check.sh``) run in the background from the start of the session.

Each run is CPU-bound (spin's ``pan``) and independent of everything else, while most of the
suite waits on sockets, processes and timers (on an idle 2-core machine ``.ci/run`` keeps about
half a core busy: 826 s of CPU in 1635 s, 2026-12-01). Run one after the other in their tests,
the model checks were the suite's largest file (about three minutes idle). So as soon as the
session has collected the tests of ``tests/test_model.py``, their runs start, one at a time in
the order of ``model/check.sh --list`` and at the lowest priority (``nice -n 19``: they take
only the CPU the other tests leave), and each test of a run takes that run's result: the same
runs, the same assertions, the time overlapped with the rest of the suite.

A test whose run has not started yet runs it itself, in the foreground. A test whose run is
under way raises that run's priority back to normal (when the OS lets this process: lowering a
nice value needs the privilege to) and gives it :data:`RUN_TIMEOUT` seconds from then, as a
foreground run gets. The session's end kills any run still going (its process group).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

CHECK = Path(__file__).resolve().parents[2] / "model" / "check.sh"
RUN_TIMEOUT = 290.0
"""Seconds a run may take once a test waits for it (at normal priority)."""


def list_runs() -> list[str]:
    """The run names of ``model/check.sh --list``, in its order."""
    out = subprocess.run([str(CHECK), "--list"], capture_output=True, text=True, check=True)
    return out.stdout.split()


@dataclass
class Outcome:
    """What a run of ``model/check.sh NAME`` gave: its exit status and its output."""

    returncode: int
    stdout: str
    stderr: str


@dataclass
class _Run:
    name: str
    started: bool = False
    proc: subprocess.Popen[str] | None = None
    outcome: Outcome | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class ModelRuns:
    """The runs named, started in the background by :meth:`start`; :meth:`result` gives one.

    Usage::

        runs = ModelRuns(["base", "join"]).start()  # check: another copy of check.sh
        outcome = runs.result("base")   # waits for it, or runs it if not started yet
        runs.close()                    # kills what still runs
    """

    def __init__(self, names: Iterable[str], check: Path = CHECK) -> None:
        self._check = check
        self._runs = {n: _Run(n) for n in names}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> ModelRuns:
        """Start the background thread that runs every run not claimed yet, in order."""
        self._thread = threading.Thread(target=self._background, name="model-runs",
                                        daemon=True)
        self._thread.start()
        return self

    def _claim(self, run: _Run) -> bool:
        with self._lock:
            if run.started or self._closed.is_set():
                return False
            run.started = True
            return True

    def _background(self) -> None:
        for run in self._runs.values():
            if self._closed.is_set():
                return
            if self._claim(run):
                self._execute(run, niced=True)

    def _execute(self, run: _Run, *, niced: bool) -> None:
        cmd = (["nice", "-n", "19"] if niced else []) + [str(self._check), run.name]
        try:
            with self._lock:
                if self._closed.is_set():
                    raise RuntimeError(f"model run {run.name}: the session ended")
                run.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            text=True, start_new_session=True)
            # niced: no deadline of its own; the test that waits for it gives it one
            out, err = run.proc.communicate(timeout=None if niced else RUN_TIMEOUT)
            run.outcome = Outcome(run.proc.returncode, out, err)
        except BaseException as exc:  # kept for the test, which raises it
            run.error = exc
            self._kill(run)
        finally:
            run.done.set()

    @staticmethod
    def _kill(run: _Run) -> None:
        proc = run.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def result(self, name: str) -> Outcome:
        """The outcome of run ``name``: run now if not started, else waited for (at most
        :data:`RUN_TIMEOUT` seconds, its priority raised back first).

        Raises:
            KeyError: ``name`` is not one of the runs.
            subprocess.TimeoutExpired: the run took longer than :data:`RUN_TIMEOUT`.
        """
        run = self._runs[name]
        if self._claim(run):
            self._execute(run, niced=False)
        else:
            proc = run.proc
            if proc is not None:
                with contextlib.suppress(OSError):  # not permitted: it keeps its nice value
                    os.setpriority(os.PRIO_PGRP, proc.pid, 0)
            if not run.done.wait(RUN_TIMEOUT):
                self._kill(run)
                raise subprocess.TimeoutExpired(str(self._check), RUN_TIMEOUT)
        if run.error is not None:
            raise run.error
        assert run.outcome is not None
        return run.outcome

    def close(self) -> None:
        """Kill any run still going and start no other. Idempotent."""
        with self._lock:
            self._closed.set()
        for run in self._runs.values():
            self._kill(run)
        if self._thread is not None:
            self._thread.join(timeout=10)


_session: ModelRuns | None = None


def start_for(items: Iterable[object]) -> None:
    """Start the runs of the collected tests of ``tests/test_model.py`` (``items``: pytest
    items; called by ``tests/conftest.py`` once collection is done)."""
    global _session
    names: list[str] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        path = getattr(item, "path", None)
        if (getattr(item, "originalname", None) == "test_model_check" and callspec is not None
                and path is not None and path.name == "test_model.py"):
            names.append(str(callspec.params["run"]))
    if names and _session is None:
        order = {n: i for i, n in enumerate(list_runs())}
        _session = ModelRuns(sorted(names, key=lambda n: order.get(n, len(order)))).start()


def session_runs() -> ModelRuns:
    """The runs of this session (started by :func:`start_for`, or here when a test comes
    first: a test module run without the suite's conftest hooks)."""
    global _session
    if _session is None:
        _session = ModelRuns(list_runs())
    return _session


def stop() -> None:
    """Kill what still runs (the session's end)."""
    if _session is not None:
        _session.close()
