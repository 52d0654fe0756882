"""Installs the Debian packages verify and the tests need, or says at once what to install.

The first step of ``make verify`` and ``make test`` (and so of CI's ``.ci/run``). Two parts
need something outside the virtual environment: the Go code, Debian's protoc, Go toolchain and
Go gRPC/protobuf packages, for the Go module in clients/go (its generated code regenerated and
diffed, gofmt, go vet, its tests) and the Go interop test, built in GOPATH mode
(docs/go-clients.md); and the monitoring tests, Debian's Prometheus server and promtool
(deploy/monitoring/). Everything else comes from PyPI into ``.venv``.

* Every package installed: one line, nothing else (one ``dpkg-query`` call, well under a second).
* Something missing, run as root: ``apt-get update`` then one ``apt-get install -y`` of the
  missing Go packages and one of the missing monitoring packages, the latter without the
  packages they only recommend.
* Something missing, not root: names the packages and the exact command, exits 2 and installs
  nothing, so ``make verify`` and ``make test`` stop before the virtual environment and the
  tests.

Standard library only: it runs with the system ``python3``, before ``.venv`` exists.

Usage: python3 scripts/system_setup.py [--check]
  --check  report what is missing and exit 1 if anything is; never install.
Exit codes: 0 everything present (or installed); 1 missing (--check) or apt-get failed;
2 missing and not root.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

GO_PACKAGES: tuple[tuple[str, str], ...] = (
    ("golang-go", "go, gofmt: builds, vets and tests clients/go and the Go interop client"),
    ("protobuf-compiler", "protoc: generates clients/go/accountingv1 from protos/"),
    ("protoc-gen-go", "protoc's Go messages plugin"),
    ("protoc-gen-go-grpc", "protoc's Go gRPC plugin (grpc-go 1.33's SupportPackageIsVersion7)"),
    ("golang-google-grpc-dev", "grpc-go, in /usr/share/gocode"),
    ("golang-google-protobuf-dev", "google.golang.org/protobuf"),
    # Must be in the same install: apt otherwise picks 1.3, whose codec panics on protoc-gen-go
    # v1.28 messages at the first RPC ("protobuf tag not enough fields").
    ("golang-github-golang-protobuf-1-5-dev", "github.com/golang/protobuf 1.5"),
)
"""(package, why) of the Go code, in install order (installed with what they recommend: the Go
toolchain's C compiler among it)."""
MONITORING_PACKAGES: tuple[tuple[str, str], ...] = (
    ("prometheus", "prometheus, promtool: the dashboard and alert rules are tested with them"),
)
"""(package, why) of the monitoring tests, installed without what they only recommend (for
prometheus: node-exporter and its collectors, about 30 packages and 300 MB no test uses)."""
DEBIAN_PACKAGES: tuple[tuple[str, str], ...] = GO_PACKAGES + MONITORING_PACKAGES
"""(package, why) for everything ``make verify`` and ``make test`` need from Debian, in install
order."""

EXIT_OK = 0
EXIT_MISSING = 1
EXIT_NOT_ROOT = 2

INSTALLED = "i"
"""The second letter of dpkg's status abbreviation for an installed, configured package
(``ii``, or ``hi`` when held); ``un``, ``rc``, ``iU`` and the like are not."""

Runner = Callable[[Sequence[str], Mapping[str, str], bool], "subprocess.CompletedProcess[str]"]
"""Runs a command with an environment; captures its output when the flag is set."""


@dataclass(frozen=True)
class Status:
    """Which of the packages asked about are installed."""

    missing: tuple[str, ...]

    @property
    def complete(self) -> bool:
        return not self.missing


def packages() -> tuple[str, ...]:
    return tuple(name for name, _why in DEBIAN_PACKAGES)


def go_packages() -> tuple[str, ...]:
    return tuple(name for name, _why in GO_PACKAGES)


def install_groups(missing: Sequence[str]) -> list[list[str]]:
    """The ``apt-get install`` arguments that install ``missing``: the Go packages with their
    recommendations, then the monitoring ones without (each group only when it has any)."""
    without = {name for name, _why in MONITORING_PACKAGES}
    groups = [[name for name in missing if name not in without],
              ["--no-install-recommends", *(name for name in missing if name in without)]]
    return [group for group in groups if any(not arg.startswith("-") for arg in group)]


def install_command(missing: Sequence[str]) -> str:
    """The command a person runs as root to install ``missing``."""
    return " && ".join(["apt-get update"] + [
        "apt-get install -y " + " ".join(group) for group in install_groups(missing)])


def _run(command: Sequence[str], env: Mapping[str, str],
         capture: bool) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(command), env=dict(env), text=True, capture_output=capture,
                          check=False)


def _say(line: str) -> None:
    print(line, flush=True)  # before apt-get's own output, also when stdout is a pipe


def query(names: Sequence[str], run: Runner = _run,
          env: Mapping[str, str] | None = None) -> Status:
    """Asks dpkg which of ``names`` are installed (one dpkg-query call for all of them).

    dpkg-query prints nothing for a package it has never heard of and exits 1; a package it
    knows but that is not installed has another status than ``ii``. Both count as missing.
    """
    env = os.environ if env is None else env
    try:
        result = run(["dpkg-query", "-W", "-f=${Package} ${db:Status-Abbrev}\\n", *names], env,
                     True)
    except FileNotFoundError:
        raise SystemExit("system_setup: dpkg-query not found: this needs a Debian machine "
                         f"with {', '.join(names)}") from None
    installed = set()
    for line in result.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[1][1:2] == INSTALLED:
            # A multi-arch name comes back as name:arch.
            installed.add(fields[0].split(":", 1)[0])
    return Status(missing=tuple(name for name in names if name not in installed))


def install(missing: Sequence[str], run: Runner = _run,
            env: Mapping[str, str] | None = None, out: Callable[[str], None] = _say) -> int:
    """apt-get update, then an apt-get install per group of ``missing`` (``install_groups``);
    apt's output is shown."""
    apt_env = dict(os.environ if env is None else env)
    apt_env["DEBIAN_FRONTEND"] = "noninteractive"
    commands = [["apt-get", "update", "-q"]] + [
        ["apt-get", "install", "-y", "-q", *group] for group in install_groups(missing)]
    for command in commands:
        out("+ " + " ".join(command))
        # Not captured: apt's own lines are the progress of this phase.
        result = run(command, apt_env, False)
        if result.returncode != 0:
            out(f"system_setup: {' '.join(command[:2])} failed with exit code "
                f"{result.returncode}")
            return EXIT_MISSING
    return EXIT_OK


def main(argv: Sequence[str] | None = None, *, run: Runner = _run,
         env: Mapping[str, str] | None = None, euid: int | None = None,
         out: Callable[[str], None] = _say) -> int:
    parser = argparse.ArgumentParser(
        prog="system_setup.py", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true",
                        help="report what is missing; never install")
    args = parser.parse_args(argv)
    names = packages()
    status = query(names, run, env)
    if status.complete:
        out(f"== Debian packages: all {len(names)} installed (Go toolchain for clients/go, "
            "Prometheus for the monitoring tests)")
        return EXIT_OK
    listed = " ".join(status.missing)
    if args.check:
        out(f"== Debian packages: missing {listed}")
        return EXIT_MISSING
    root = (os.geteuid() if euid is None else euid) == 0
    if not root:
        out("== Debian packages: verify and the tests need these, which are not installed:")
        why = dict(DEBIAN_PACKAGES)
        for name in status.missing:
            out(f"     {name:<40} {why[name]}")
        out("   Install them as root, then run this again:")
        out(f"     sudo sh -c '{install_command(status.missing)}'")
        return EXIT_NOT_ROOT
    out(f"== Debian packages: installing {listed} (as root, with apt-get)")
    code = install(status.missing, run, env, out)
    if code != EXIT_OK:
        return code
    after = query(names, run, env)
    if not after.complete:
        out(f"system_setup: still missing after apt-get install: {' '.join(after.missing)}")
        return EXIT_MISSING
    out(f"== Debian packages: all {len(names)} installed")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
