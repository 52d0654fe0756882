"""scripts/system_setup.py, the first step of `make test`: the Debian packages of the Go code and
of the monitoring tests are installed as root and named (then the run stops) otherwise.

A fresh machine cannot be had here (the packages are installed on this one), so dpkg and apt are
faked: in-process through the runner the script takes, and as real programs on a fake PATH for
the script and for `make test` itself, run as an unprivileged user when the tests run as root.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "system_setup.py"
NOBODY = 65534


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("system_setup", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


setup = _load()
PACKAGES: tuple[str, ...] = setup.packages()
GO: tuple[str, ...] = setup.go_packages()
MONITORING = ("prometheus",)
ALL_INSTALLED = ("== Debian packages: all 8 installed (Go toolchain for clients/go, "
                 "Prometheus for the monitoring tests)")


class FakeDebian:
    """dpkg-query and apt-get over a set of installed package names."""

    def __init__(self, installed: Sequence[str] = (), *, statuses: Mapping[str, str] | None = None,
                 apt_fails: bool = False, apt_installs: bool = True) -> None:
        self.statuses = {name: "ii" for name in installed} | dict(statuses or {})
        self.apt_fails = apt_fails
        self.apt_installs = apt_installs
        self.commands: list[list[str]] = []
        self.apt_env: dict[str, str] = {}

    def __call__(self, command: Sequence[str], env: Mapping[str, str],
                 capture: bool) -> subprocess.CompletedProcess[str]:
        command = list(command)
        self.commands.append(command)
        if command[0] == "dpkg-query":
            names = [arg for arg in command[1:] if not arg.startswith("-")]
            # dpkg answers with the package's own name, name:arch for a multi-arch one.
            known = [k for n in names for k in self.statuses if k.split(":")[0] == n]
            out = "".join(f"{k} {self.statuses[k]} \n" for k in known)
            return subprocess.CompletedProcess(command, int(len(known) < len(names)), out, "")
        assert command[0] == "apt-get", command
        assert not capture, "apt-get's output is the progress of the install: never captured"
        self.apt_env = dict(env)
        if self.apt_fails:
            return subprocess.CompletedProcess(command, 100, "", "")
        if command[1] == "install" and self.apt_installs:
            for name in command[2:]:
                if not name.startswith("-"):
                    self.statuses[name] = "ii"
        return subprocess.CompletedProcess(command, 0, "", "")

    @property
    def apt_commands(self) -> list[list[str]]:
        return [c for c in self.commands if c[0] == "apt-get"]


def run_main(debian: FakeDebian, *argv: str, euid: int) -> tuple[int, list[str]]:
    lines: list[str] = []
    code = setup.main(list(argv), run=debian, env={"PATH": "/usr/bin"}, euid=euid,
                      out=lines.append)
    return code, lines


def test_the_packages_are_the_go_toolchain_with_protobuf_1_5_and_prometheus() -> None:
    assert (*GO, *MONITORING) == PACKAGES
    assert "golang-go" in GO and "protobuf-compiler" in GO
    # apt picks 1.3 unless 1.5 is named in the same install; 1.3's codec panics at the first RPC.
    assert "golang-github-golang-protobuf-1-5-dev" in PACKAGES
    assert len(set(PACKAGES)) == len(PACKAGES)


def test_the_go_client_doc_installs_exactly_these_packages() -> None:
    doc = (ROOT / "docs" / "go-clients.md").read_text()
    command = doc.split("apt-get install -y", 1)[1].split("\n\n", 1)[0].split("\n#", 1)[0]
    assert command.replace("\\", " ").split() == list(GO)


@pytest.mark.parametrize("euid", [0, 1000], ids=["root", "user"])
def test_everything_installed_is_one_line_and_no_apt(euid: int) -> None:
    debian = FakeDebian(PACKAGES)
    code, lines = run_main(debian, euid=euid)
    assert code == setup.EXIT_OK
    assert lines == [ALL_INSTALLED]
    assert debian.apt_commands == []
    assert len(debian.commands) == 1  # one dpkg-query for every package


def test_as_root_the_missing_packages_are_installed_in_one_apt_get_install() -> None:
    missing = ("protoc-gen-go-grpc", "golang-github-golang-protobuf-1-5-dev")
    debian = FakeDebian([p for p in PACKAGES if p not in missing])
    code, lines = run_main(debian, euid=0)
    assert code == setup.EXIT_OK
    assert debian.apt_commands == [
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", *missing],
    ]
    assert debian.apt_env["DEBIAN_FRONTEND"] == "noninteractive"
    assert any("installing " + " ".join(missing) in line for line in lines)
    assert lines[-1] == "== Debian packages: all 8 installed"


def test_as_root_on_a_fresh_machine_everything_is_installed() -> None:
    debian = FakeDebian()
    code, _lines = run_main(debian, euid=0)
    assert code == setup.EXIT_OK
    # Prometheus without what it only recommends (node-exporter and its collectors).
    assert debian.apt_commands == [
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", *GO],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *MONITORING],
    ]


def test_only_prometheus_missing_is_one_install_without_recommends() -> None:
    debian = FakeDebian(GO)
    code, _lines = run_main(debian, euid=0)
    assert code == setup.EXIT_OK
    assert debian.apt_commands == [
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "prometheus"],
    ]


def test_not_root_names_each_missing_package_and_the_command_then_stops() -> None:
    missing = ("golang-go", "protoc-gen-go")
    debian = FakeDebian([p for p in PACKAGES if p not in missing])
    code, lines = run_main(debian, euid=1000)
    assert code == setup.EXIT_NOT_ROOT
    assert debian.apt_commands == []
    text = "\n".join(lines)
    assert f"apt-get update && apt-get install -y {' '.join(missing)}'" in text
    for name in PACKAGES:
        assert (name in text) == (name in missing), name


def test_check_mode_reports_and_never_installs_even_as_root() -> None:
    debian = FakeDebian(PACKAGES[1:])
    code, lines = run_main(debian, "--check", euid=0)
    assert code == setup.EXIT_MISSING
    assert debian.apt_commands == []
    assert lines == [f"== Debian packages: missing {PACKAGES[0]}"]


def test_a_failed_apt_get_fails_the_set_up() -> None:
    debian = FakeDebian(apt_fails=True)
    code, lines = run_main(debian, euid=0)
    assert code == setup.EXIT_MISSING
    assert debian.apt_commands == [["apt-get", "update", "-q"]]
    assert "apt-get update failed with exit code 100" in lines[-1]


def test_packages_apt_did_not_install_fail_the_set_up() -> None:
    debian = FakeDebian(apt_installs=False)
    code, lines = run_main(debian, euid=0)
    assert code == setup.EXIT_MISSING
    assert lines[-1].startswith("system_setup: still missing after apt-get install: golang-go")


@pytest.mark.parametrize(
    "status, installed",
    [("ii", True), ("hi", True), ("un", False), ("rc", False), ("iU", False), ("iF", False)],
)
def test_only_an_installed_and_configured_status_counts(status: str, installed: bool) -> None:
    debian = FakeDebian(PACKAGES[1:], statuses={PACKAGES[0]: status})
    assert (PACKAGES[0] in setup.query(PACKAGES, debian, {}).missing) is not installed


def test_a_multiarch_name_counts_as_its_package() -> None:
    debian = FakeDebian(PACKAGES[1:], statuses={f"{PACKAGES[0]}:amd64": "ii"})
    assert setup.query(PACKAGES, debian, {}).missing == ()


# --- the real script and `make test`, with dpkg-query and apt-get faked on PATH -----------------

FAKE_DPKG_QUERY = """#!/bin/sh
# Prints "name ii" for each asked package listed in $FAKE_DEBIAN_DIR/installed.
status=0
for arg in "$@"; do
  case "$arg" in -*) continue ;; esac
  if grep -qx "$arg" "$FAKE_DEBIAN_DIR/installed" 2>/dev/null; then
    echo "$arg ii "
  else
    echo "dpkg-query: no packages found matching $arg" >&2; status=1
  fi
done
exit $status
"""

FAKE_APT_GET = """#!/bin/sh
# Logs its arguments; "install" adds the named packages to $FAKE_DEBIAN_DIR/installed.
echo "$*" >> "$FAKE_DEBIAN_DIR/apt.log"
if [ "$1" = install ]; then
  for arg in "$@"; do
    case "$arg" in install|-*) ;; *) echo "$arg" >> "$FAKE_DEBIAN_DIR/installed" ;; esac
  done
fi
echo "fake apt-get $1 done"
"""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A temporary directory the unprivileged user can use (pytest's tmp_path is root-only)."""
    path = Path(tempfile.mkdtemp(prefix="hami-system-setup-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fake_debian(shared_dir: Path) -> Path:
    """bin/dpkg-query, bin/apt-get and the list of installed packages they share."""
    root = shared_dir / "debian"
    (root / "bin").mkdir(parents=True)
    for name, text in (("dpkg-query", FAKE_DPKG_QUERY), ("apt-get", FAKE_APT_GET)):
        (root / "bin" / name).write_text(text)
        (root / "bin" / name).chmod(0o755)
    (root / "installed").write_text("")
    root.chmod(0o777)  # the unprivileged run writes its log here
    return root


def _env(fake: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    env["PATH"] = f"{fake / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    env["FAKE_DEBIAN_DIR"] = str(fake)
    return env


def _system_python() -> str:
    """A python3 any user can run (the tests may run from a root-only pyenv)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("python3")
    assert found is not None
    return found


def _unprivileged() -> list[str]:
    """Prefix that runs a command as nobody when the tests run as root."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    assert setpriv is not None, "setpriv (util-linux) is needed to test the non-root path as root"
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def test_script_as_root_installs_then_the_second_run_is_one_line(fake_debian: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("this test runs as root (CI and the project's machines are root)",
                    pytrace=False)
    first = subprocess.run([sys.executable, str(SCRIPT)], env=_env(fake_debian),
                           capture_output=True, text=True, timeout=60, check=False)
    assert first.returncode == 0, first.stdout + first.stderr
    log = (fake_debian / "apt.log").read_text().splitlines()
    assert log == ["update -q", f"install -y -q {' '.join(GO)}",
                   "install -y -q --no-install-recommends prometheus"]
    # Our lines come before apt's output: it is flushed before apt-get runs.
    assert first.stdout.index("installing") < first.stdout.index("fake apt-get update done")

    second = subprocess.run([sys.executable, str(SCRIPT)], env=_env(fake_debian),
                            capture_output=True, text=True, timeout=60, check=False)
    assert second.returncode == 0
    assert second.stdout.strip().splitlines() == [ALL_INSTALLED]
    assert (fake_debian / "apt.log").read_text().splitlines() == log


@pytest.mark.parametrize("target", ["test", "verify"])
def test_make_as_a_user_stops_at_once_naming_the_packages(
    fake_debian: Path, shared_dir: Path, target: str
) -> None:
    """`make test` or `make verify` on a fresh machine, not root: the first lines say what to
    install, and nothing else happens (no .venv, no pytest, no generator)."""
    checkout = shared_dir / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "Makefile", checkout / "Makefile")
    shutil.copy(SCRIPT, checkout / "scripts" / "system_setup.py")
    (checkout / "pyproject.toml").write_text("")
    for path in (checkout, checkout / "scripts"):
        path.chmod(0o777)
    (fake_debian / "installed").write_text("golang-go\n")
    result = subprocess.run(
        [*_unprivileged(), "make", "--no-print-directory", "-C", str(checkout), target,
         f"SYSTEM_PYTHON={_system_python()}"],
        env=_env(fake_debian), capture_output=True, text=True, timeout=120, check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert output.splitlines()[0] == (
        "== Debian packages: verify and the tests need these, which are not installed:"), output
    assert (f"apt-get install -y {' '.join(GO[1:])} && apt-get install -y "
            "--no-install-recommends prometheus") in output
    assert not (checkout / ".venv").exists(), "set-up went on after the Debian check failed"
    assert "pytest" not in output and "run_tests" not in output
    assert "gen_protos" not in output
    assert not (fake_debian / "apt.log").exists()
