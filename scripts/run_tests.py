"""Runs pytest for ``make test``: progress throughout, and "no tests collected" is a failure.

Progress: one line per test as it starts and ends (``-v``: the test's name is on screen while it
runs), and at the end the tests that took a second or more (``--durations``). Arguments given
here come after these defaults, so ``-q`` brings back the compact dots.

Exit code 5 ("no tests collected") becomes 1: a run that tested nothing must not pass.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import pytest

NO_TESTS_COLLECTED = 5
PROGRESS_ARGS = ("-v", "--durations=25", "--durations-min=1.0")


def pytest_args(argv: Sequence[str]) -> list[str]:
    """The progress defaults, then the caller's arguments (which win where they overlap)."""
    return [*PROGRESS_ARGS, *argv]


def main(argv: Sequence[str]) -> int:
    code = int(pytest.main(pytest_args(argv)))
    if code == NO_TESTS_COLLECTED:
        print("pytest collected no tests: failing the run", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
