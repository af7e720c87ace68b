"""The CLI's progress bar of a bulk operation (``pause all``...; docs/cli.md, "Bulk: `all`"):
drawn on a terminal as locations are decided, never into a pipe, a capture or ``--json``."""

from __future__ import annotations

from io import StringIO

from rich.console import Console

from locstatus.cli.rendering import bulk_progress


def test_a_terminal_sees_the_count_of_locations_decided() -> None:
    out = StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with bulk_progress("pause all", console=console) as bar:
        bar(1, None)
        bar(3, 3)
    assert "pause all" in out.getvalue() and "3/3" in out.getvalue()


def test_a_pipe_or_json_output_gets_no_bar() -> None:
    for console, enabled in (
        (Console(file=StringIO(), force_terminal=False), True),
        (Console(file=StringIO(), force_terminal=True), False),
    ):
        with bulk_progress("pause all", console=console, enabled=enabled) as bar:
            bar(3, 3)
        assert console.file.getvalue() == ""  # type: ignore[attr-defined]
