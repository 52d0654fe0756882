"""scripts/run_tests.py, the runner of `make test`: a line per test while it runs, the slow
tests listed at the end, and "no tests collected" is a failure."""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "scripts" / "run_tests.py"

TESTS = '''
import time

def test_quick():
    pass

def test_takes_a_while():
    time.sleep(1.2)
'''


def run(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # Run from the folder itself, so no pytest configuration of this repository applies.
    return subprocess.run([sys.executable, str(RUNNER), "-p", "no:cacheprovider", *args],
                          cwd=folder, capture_output=True, text=True, timeout=120, check=False)


def test_each_test_is_named_as_it_runs_and_the_slow_ones_are_listed(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(TESTS)
    result = run(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("test_sample.py::test_quick PASSED") for line in lines), lines
    assert any(line.startswith("test_sample.py::test_takes_a_while PASSED") for line in lines)
    slowest = result.stdout.split("slowest", 1)[1]
    assert "test_takes_a_while" in slowest and "test_quick" not in slowest


def test_the_callers_arguments_win(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(TESTS)
    result = run(tmp_path, "-q", "-k", "quick")
    assert result.returncode == 0
    assert "test_sample.py::test_quick PASSED" not in result.stdout  # -q: dots again
    assert "1 passed, 1 deselected" in result.stdout


def test_no_test_collected_fails_the_run(tmp_path: Path) -> None:
    result = run(tmp_path)
    assert result.returncode == 1
    assert "pytest collected no tests: failing the run" in result.stderr


def test_a_failing_test_fails_the_run(tmp_path: Path) -> None:
    (tmp_path / "test_bad.py").write_text("def test_bad():\n    assert 1 == 2\n")
    assert run(tmp_path).returncode == 1


def test_the_license_is_an_spdx_expression_that_setuptools_reads_without_a_warning() -> None:
    """A `license = {text = ...}` table made setuptools print its deprecation block on every
    install; a plain SPDX string needs setuptools 77 or newer to build."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    (setuptools,) = [r for r in project["build-system"]["requires"] if r.startswith("setuptools")]
    minimum = setuptools.split(">=", 1)[1].split(",")[0]
    assert int(minimum.split(".")[0]) >= 77, setuptools



def test_a_slow_hypothesis_example_is_not_a_failure() -> None:
    # tests/conftest.py's profile: an example past Hypothesis' default 200 ms deadline (as a
    # loaded machine makes them) fails nothing. Decorated here, as any test module's are.
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=2)
    @given(st.integers())
    def slow(_: int) -> None:
        time.sleep(0.25)

    assert settings.default.deadline is None
    slow()
