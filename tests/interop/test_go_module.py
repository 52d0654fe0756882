"""The Go module in clients/go: its Go tests pass, and it builds as users build it.

* GOPATH mode (how this repository builds it: Debian's Go packages, no module proxy): `go test`
  of accountingv1 and hamiaccounting, every Test function of the package reported PASS.
* Module mode (how a user builds it): a copy of clients/go built, vetted and tested with
  GO111MODULE=on and no module proxy, Debian's sources of its dependencies vendored in place of
  the proxy. This holds go.mod to the module path the code imports itself by and to the modules
  it requires; the versions go.mod names are not fetched here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.go

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "go_module.py"
PACKAGE_DIR = ROOT / "clients" / "go" / "hamiaccounting"
TEST_FUNCTION = re.compile(r"^func (Test\w+)\(t \*testing\.T\)", re.MULTILINE)
TOOLCHAIN_MISSING_EXIT = 2


def run_script(*args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True,
                            text=True, timeout=timeout_s, check=False)
    if result.returncode == TOOLCHAIN_MISSING_EXIT:
        pytest.fail(f"the Go toolchain is required (`make test` installs it as root: "
                    f"scripts/system_setup.py):\n{result.stderr}", pytrace=False)
    return result


def test_every_go_test_of_the_client_package_passes() -> None:
    declared = sorted({name for path in PACKAGE_DIR.glob("*_test.go")
                       for name in TEST_FUNCTION.findall(path.read_text())})
    assert len(declared) >= 10, f"too few Go tests found in {PACKAGE_DIR}: {declared}"
    result = run_script("test", "-count=1", "-v", timeout_s=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"go test failed:\n{output[-8000:]}"
    passed = set(re.findall(r"^--- PASS: (Test\w+) ", output, re.MULTILINE))
    assert not re.search(r"^\s*--- (FAIL|SKIP)", output, re.MULTILINE), output[-8000:]
    missing = [name for name in declared if name not in passed]
    assert not missing, f"Go tests not reported as passed: {missing}\n{output[-4000:]}"


def test_the_module_builds_vets_and_tests_in_module_mode() -> None:
    result = run_script("module-mode", timeout_s=600)
    assert result.returncode == 0, f"module mode failed:\n{result.stdout}\n{result.stderr}"
