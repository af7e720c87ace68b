"""Every command block of the README and docs/*.md runs, on SQLite, as a reader would run it
(issue 20, "Docs that match"): a doc cannot drift from the product again.

- A block fenced ```` ```sh ```` (or ``bash``/``shell``) is a script: it runs with ``bash -e -o
  pipefail`` and must exit 0. A ```` ```console ```` block is a session: each ``$ `` line runs
  and must exit 0, and the first line it shows as output (timestamps aside) must be the first
  line the command prints.
- A block that cannot run here (Docker, a ZooKeeper ensemble, a long benchmark) says so in its
  first line, visibly: ``# not run by tests/test_docs_commands.py: <why>``. Nothing is skipped
  silently: a block without that line runs.
- Synopses (```` ```text ````) are not run; each ``locstatus ...`` command they name must exist
  (``--help`` answers).

The blocks of one document run in order in one fresh directory (the store of the default
``sqlite:///./locstatus.db`` included), where ``locstatus/samples`` is the package's, with the
installed ``locstatus`` first on ``PATH``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = "# not run by tests/test_docs_commands.py: "
SCRIPT = {"sh", "bash", "shell"}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)")


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    @property
    def reason(self) -> str | None:
        first = self.text.split("\n", 1)[0]
        return first[len(NOT_RUN):].strip() if first.startswith(NOT_RUN) else None


def blocks(doc: Path) -> list[Block]:
    text = doc.read_text()
    return [
        Block(doc, text[: m.start()].count("\n") + 1, m.group(1), m.group(2))
        for m in FENCE.finditer(text)
    ]


def command_blocks(doc: Path) -> list[Block]:
    return [b for b in blocks(doc) if b.lang in SCRIPT or b.lang == "console"]


def sandbox(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    work = tmp_path / "work"
    work.mkdir()
    (work / "locstatus").mkdir()
    (work / "locstatus" / "samples").symlink_to(ROOT / "locstatus" / "samples")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCSTATUS_")}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        COLUMNS="200", USER="ops", HOME=str(tmp_path),
    )
    return work, env


def run(script: str, work: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A script block: stops at the first command that fails."""
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=work, env=env, capture_output=True, text=True, timeout=240, check=False,
    )


def typed(command: str, work: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """One ``$`` line of a session, as typed at a prompt (``cmd; echo $?`` goes on after
    ``cmd`` fails); stderr interleaved with stdout, as a terminal shows them."""
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", command], cwd=work, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=240, check=False,
    )


def session(text: str) -> list[tuple[str, list[str]]]:
    """The ``$ command`` lines of a console block, each with the output lines shown after it."""
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
    return steps


def _shown(line: str) -> str:
    return " ".join(STAMP.sub("<time>", line).split())


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_command_block_runs_on_sqlite_or_says_why_not(doc: Path, tmp_path: Path) -> None:
    found = command_blocks(doc)
    work, env = sandbox(tmp_path)
    for block in found:
        if block.reason is not None:
            assert len(block.reason) > 10, f"{block.where}: say why the block cannot run"
            continue
        if block.lang in SCRIPT:
            done = run(block.text, work, env)
            assert done.returncode == 0, (block.where, done.stdout[-3000:], done.stderr[-3000:])
            continue
        steps = session(block.text)
        assert steps, f"{block.where}: a console block with no '$ ' command"
        for command, shown in steps:
            done = typed(command, work, env)
            assert done.returncode == 0, (block.where, command, done.stdout[-3000:])
            expected = next((line for line in shown if line.strip() not in ("", "...")), None)
            if expected is None:
                continue
            got = done.stdout.splitlines()
            assert got and _shown(got[0]) == _shown(expected), (
                block.where, command, expected, done.stdout[:2000]
            )


def test_every_command_a_synopsis_names_exists(tmp_path: Path) -> None:
    _, env = sandbox(tmp_path)
    named: dict[tuple[str, ...], str] = {}
    for doc in DOCS:
        for block in blocks(doc):
            if block.lang != "text":
                continue
            for line in block.text.splitlines():
                words = line.split()
                if not words or words[0] != "locstatus":
                    continue
                cmd: list[str] = []
                for word in words[1:]:
                    if not re.fullmatch(r"[a-z][a-z-]*", word):
                        break
                    cmd.append(word)
                named.setdefault(tuple(cmd), block.where)
    assert named, "no synopsis found"
    for cmd, where in sorted(named.items()):
        done = subprocess.run(
            [sys.executable, "-m", "locstatus", *cmd, "--help"],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )
        assert done.returncode == 0, (where, cmd, done.stderr[-1000:])


def test_the_annotation_is_the_only_way_out() -> None:
    """The rule itself: every command block of every document is run or carries the visible
    annotation, and the documents do have blocks that run (the quick start among them)."""
    runnable = [
        b.where for doc in DOCS for b in command_blocks(doc) if b.reason is None
    ]
    assert any(w.startswith("README.md:") for w in runnable), runnable
    assert any(w.startswith("docs/cli.md:") for w in runnable), runnable
    for doc in DOCS:
        for b in blocks(doc):
            assert NOT_RUN not in b.text.split("\n", 1)[-1], (
                f"{b.where}: the annotation belongs on the block's first line"
            )
            if b.lang == "":  # diagrams, layouts, reports: never a command to copy
                commands = [ln for ln in b.text.splitlines()
                            if ln.startswith(("locstatus ", "python ", "$ "))]
                assert not commands, f"{b.where}: fence it sh (run), console or text (synopsis)"
