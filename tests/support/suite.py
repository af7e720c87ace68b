"""Which length of the test suite runs: CI's bounded one (the default) or the long one.

The project keeps CI under 20 minutes (README, "Tests"). Rather than leaving the long tests out
of CI, every test runs in both suites with the same assertions; only its size changes:

- ``ci`` (``scripts/test.sh``, what ``.ci/run`` calls): hypothesis profile ``ci``, the
  reliability scenarios at ``LOCSTATUS_RELIABILITY_SECONDS=120``, the large-scale tests at
  their bounded sizes;
- ``long`` (``scripts/long.sh``, ``LOCSTATUS_TEST_SUITE=long``): hypothesis profile
  ``thorough``, the reliability scenarios at ``LOCSTATUS_RELIABILITY_SECONDS=1200``, the
  large-scale tests at full size.

A test asks :func:`sized` for a size (``sized(ci=200, long=500)``), so what each suite runs is
read in the test itself. A property test that sets its own ``max_examples`` keeps it in both
profiles unless it is among the long ones and asks :func:`sized` for it; a cheap one stays at
its full count in CI, where bounding it would save seconds and lose examples.
"""

from __future__ import annotations

import os
from typing import TypeVar

SUITE_ENV = "LOCSTATUS_TEST_SUITE"
"""Environment variable naming the suite: ``ci`` (default) or ``long``."""

SUITES = ("ci", "long")

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


def hypothesis_profile() -> str:
    """The hypothesis profile of this suite (registered by ``tests/conftest.py``)."""
    return "thorough" if is_long() else "ci"
