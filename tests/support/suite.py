"""Which length of the test suite runs: CI's bounded one (the default) or the long one.

The project keeps CI under 20 minutes (README, "Tests"). Rather than leaving the long tests out
of CI, every test runs in both suites with the same assertions; only its size changes:

- ``ci`` (``scripts/test.sh``, what ``.ci/run`` calls): hypothesis profile ``ci`` (each
  property test's examples divided by :data:`CI_EXAMPLE_DIVISOR`, at least
  :data:`CI_MIN_EXAMPLES`), the reliability scenarios at ``LOCSTATUS_RELIABILITY_SECONDS=120``,
  the large-scale tests at their bounded sizes;
- ``long`` (``scripts/long.sh``, ``LOCSTATUS_TEST_SUITE=long``): hypothesis profile
  ``thorough`` (every property test at its full example count), the reliability scenarios at
  ``LOCSTATUS_RELIABILITY_SECONDS=1200``, the large-scale tests at full size.

A test asks :func:`sized` for a size (``sized(ci=150, long=500)``) and :func:`examples` for a
hypothesis example count, so what a suite runs is read in the test itself.
"""

from __future__ import annotations

import os
from typing import TypeVar

SUITE_ENV = "LOCSTATUS_TEST_SUITE"
"""Environment variable naming the suite: ``ci`` (default) or ``long``."""

SUITES = ("ci", "long")

CI_EXAMPLE_DIVISOR = 4
"""The ``ci`` profile runs a quarter of a property test's full example count..."""

CI_MIN_EXAMPLES = 25
"""...but never fewer than this (nor more than the full count)."""

T = TypeVar("T")


def suite() -> str:
    """The suite this session runs: ``"ci"`` or ``"long"``.

    Raises:
        ValueError: ``LOCSTATUS_TEST_SUITE`` names neither.
    """
    raw = os.environ.get(SUITE_ENV, "") or "ci"
    if raw not in SUITES:
        raise ValueError(f"{SUITE_ENV}={raw!r}: expected one of {', '.join(SUITES)}")
    return raw


def is_long() -> bool:
    """True in the long suite (``LOCSTATUS_TEST_SUITE=long``)."""
    return suite() == "long"


def sized(ci: T, long: T) -> T:
    """``long`` in the long suite, ``ci`` otherwise: the size of a large-scale test."""
    return long if is_long() else ci


def examples(full: int) -> int:
    """Hypothesis examples of a property test whose full count is ``full``: ``full`` in the
    long suite (profile ``thorough``), ``max(CI_MIN_EXAMPLES, full // CI_EXAMPLE_DIVISOR)``
    capped at ``full`` in CI (profile ``ci``)."""
    if is_long():
        return full
    return min(full, max(CI_MIN_EXAMPLES, full // CI_EXAMPLE_DIVISOR))


def hypothesis_profile() -> str:
    """The hypothesis profile of this suite (registered by ``tests/conftest.py``)."""
    return "thorough" if is_long() else "ci"
