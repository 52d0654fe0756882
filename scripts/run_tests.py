"""Runs pytest and turns "no tests collected" (exit code 5) into a failure."""

from __future__ import annotations

import sys

import pytest

NO_TESTS_COLLECTED = 5

if __name__ == "__main__":
    code = pytest.main(sys.argv[1:])
    if code == NO_TESTS_COLLECTED:
        print("pytest collected no tests: failing the run", file=sys.stderr)
        sys.exit(1)
    sys.exit(int(code))
