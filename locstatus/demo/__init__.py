"""The demo (docs/demo.md): ``locstatus demo`` and the worker program it runs.

Not library code: an application built on the library, the way an operator's own tools and
workers would be, kept in the package so that ``pip install 'locstatus[server]'`` is enough to
see the whole product at work. What lives here, from the top:

- :mod:`locstatus.demo.run`: :func:`run_demo`, the command's entry point (store, sidecar,
  workers, live table, clean-up, the JSON summary);
- :mod:`locstatus.demo.scenario`: the scripted operator, driving the sidecar's HTTP API and
  checking every outcome;
- :mod:`locstatus.demo.fleet`: the worker processes; :mod:`locstatus.demo.view`: what the demo
  reads from them and the sidecar, and the live table;
- :mod:`locstatus.demo.worker`: ``python -m locstatus.demo.worker``, a worker process (an
  :class:`~locstatus.agent.Agent` moving simulated objects), also run by the compose stack;
- :mod:`locstatus.demo.errors`: :class:`DemoFailed`.

``run_demo`` and ``DemoFailed`` are importable from here; ``run_demo`` is loaded only when
asked for: the demo needs the ``server`` extra (FastAPI, httpx), the worker does not, and
``python -m locstatus.demo.worker`` imports this package first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from locstatus.demo.errors import DemoFailed

if TYPE_CHECKING:
    from locstatus.demo.run import run_demo

__all__ = ["DemoFailed", "run_demo"]


def __getattr__(name: str) -> object:
    """``locstatus.demo.run_demo``, imported on first use (PEP 562): see above."""
    if name == "run_demo":
        from locstatus.demo.run import run_demo

        return run_demo
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
