"""The demo's one error: :class:`DemoFailed`, raised by every part of the demo that checks
what it shows (a process died, a step did not converge, the sidecar refused a request).

It is not a :class:`~locstatus.errors.LocstatusError`: those are the library's errors, with an
exit code and an HTTP status each; a failed demo is the demo's own verdict (exit 1, the message
naming the step, the states and the lagging workers), so it lives here, below every module of
the demo that raises it.
"""

from __future__ import annotations

__all__ = ["DemoFailed"]


class DemoFailed(Exception):
    """The scenario did not converge (or a process died); ``message`` says what and where."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
