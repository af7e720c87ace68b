"""The protocol model (model/locstatus.pml, model/README.md) checked with spin.

One test per run of ``model/check.sh``: each run on the protocol as designed (exhaustive for 2
operators x 2 workers x 1 location, bitstate for more) must find no counter-example, and each
variant (a seeded bug of the hostile review, a design requirement, a discrepancy found in the
code) must still fail: its counter-example kept in ``model/trails/`` replays, event for event, to
the property it violates. A model change
that breaks a kept trail fails here; ``model/check.sh --regen NAME`` searches it again.

The runs start in the background as soon as the session has collected them, at the lowest
priority, and each test takes its run's result (``support/model_runs.py``: the model checks are
CPU-bound, the rest of the suite mostly waits).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support import model_runs
from support.model_runs import CHECK


@pytest.mark.parametrize("run", model_runs.list_runs())
def test_model_check(run: str) -> None:
    proc = model_runs.session_runs().result(run)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    assert proc.stdout.startswith(f"ok   {run} "), report


def test_a_protocol_run_fails_on_a_counter_example(tmp_path: Path) -> None:
    """The harness itself: a model whose fixed protocol has a bug makes its run fail, taken
    as the suite takes it (started in the background, then waited for)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "check.sh").write_text(CHECK.read_text())
    (model / "check.sh").chmod(0o755)
    source = (CHECK.parent / "locstatus.pml").read_text()
    broken = source.replace("#ifdef BUG_SKEW_SETTLE", "#ifndef BUG_SKEW_SETTLE", 1)
    assert broken != source
    (model / "locstatus.pml").write_text(broken)
    runs = model_runs.ModelRuns(["join"], check=model / "check.sh").start()  # as the suite's
    try:
        proc = runs.result("join")
    finally:
        runs.close()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL join" in proc.stdout
    assert "VIOLATED: paused while a live worker runs" in proc.stdout
