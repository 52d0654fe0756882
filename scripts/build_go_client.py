"""Builds the Go interop client (tests/interop/go/src/hamiclient) in GOPATH mode.

Generates the Go code of protos/hami/accounting/v1 with Debian's protoc-gen-go and
protoc-gen-go-grpc into <gopath>/src/hami-accounting/gen/go/hami/accounting/v1 (never into
the Python package; the default <repo>/go/src/hami-accounting/gen is git-ignored), then runs
`go build` with GO111MODULE=off GOPATH=<gopath>:<repo>/tests/interop/go:/usr/share/gocode.

Usage:
    python scripts/build_go_client.py                      # -> go/bin/hamiclient
    python scripts/build_go_client.py --gopath /tmp/gp --output /tmp/gp/bin/hamiclient --vet

Exit codes: 0 built; 2 a tool or Debian package is missing (the message names what, and
scripts/system_setup.py installs it); 1 generation, build, vet or gofmt failed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PROTO_PACKAGE = Path("hami") / "accounting" / "v1"
GO_IMPORT_PATH = "hami-accounting/gen/go/hami/accounting/v1"
CLIENT_GOPATH = ROOT / "tests" / "interop" / "go"
CLIENT_PACKAGE = "hamiclient"
DEBIAN_GOCODE = Path("/usr/share/gocode")
INSTALL_HINT = (
    "the Debian packages are listed, and installed when run as root, by scripts/system_setup.py "
    "(make test runs it first): python3 scripts/system_setup.py --check"
)
TOOLS = ("go", "gofmt", "protoc", "protoc-gen-go", "protoc-gen-go-grpc")

MISSING_TOOLCHAIN = 2


class ToolchainMissing(Exception):
    """A Go tool or Debian Go package needed for the build is not installed."""


def check_toolchain() -> None:
    """Raises ToolchainMissing naming what is absent and how to install it."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    gocode = DEBIAN_GOCODE / "src"
    for package_dir in ("google.golang.org/grpc", "google.golang.org/protobuf",
                        "github.com/golang/protobuf"):
        if not (gocode / package_dir).is_dir():
            missing.append(str(gocode / package_dir))
    golang_protobuf = gocode / "github.com" / "golang" / "protobuf" / "proto"
    # golang-github-golang-protobuf-1-3-dev (apt's default pick) builds, then its codec panics
    # at the first RPC ("protobuf tag not enough fields"); 1.5 has registry.go, 1.3 does not.
    if golang_protobuf.is_dir() and not (golang_protobuf / "registry.go").is_file():
        missing.append("golang-github-golang-protobuf-1-5-dev (1.3 is installed)")
    if missing:
        raise ToolchainMissing(
            "Go toolchain for the interop client is missing: " + ", ".join(missing)
            + f"\n{INSTALL_HINT}"
        )


def go_environment(gopath: Path) -> dict[str, str]:
    """The environment of every go command: GOPATH mode, Debian's packages, no network."""
    env = dict(os.environ)
    env.update({
        "GO111MODULE": "off",
        "GOPATH": os.pathsep.join([str(gopath), str(CLIENT_GOPATH), str(DEBIAN_GOCODE)]),
        "GOFLAGS": "",
        "GOPROXY": "off",
    })
    if not any(env.get(name) for name in ("GOCACHE", "XDG_CACHE_HOME", "HOME")):
        env["GOCACHE"] = str(ROOT / "go" / "pkg" / "gocache")
    return env


def run(command: list[str], env: dict[str, str] | None = None) -> None:
    """Runs a command from the repository root, echoing it; raises CalledProcessError."""
    print("+ " + " ".join(command), file=sys.stderr, flush=True)
    subprocess.run(command, cwd=ROOT, env=env, check=True)


def generate(gopath: Path) -> Path:
    """Writes the Go code of the schema into <gopath>/src/<go_package import path>."""
    source_root = gopath / "src"
    out_dir = source_root / GO_IMPORT_PATH
    shutil.rmtree(out_dir, ignore_errors=True)
    source_root.mkdir(parents=True, exist_ok=True)
    protos = sorted(str(p.relative_to(ROOT)) for p in (PROTO_ROOT / PROTO_PACKAGE).glob("*.proto"))
    run([
        "protoc", f"-I{PROTO_ROOT.relative_to(ROOT)}",
        f"--go_out={source_root}", "--go_opt=paths=import",
        f"--go-grpc_out={source_root}", "--go-grpc_opt=paths=import",
        *protos,
    ])
    return out_dir


def build(gopath: Path, output: Path, vet: bool) -> float:
    """Generates and builds the client (optionally vet + gofmt); returns the build seconds."""
    check_toolchain()
    generate(gopath)
    env = go_environment(gopath)
    output.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    run(["go", "build", "-o", str(output), CLIENT_PACKAGE], env=env)
    elapsed = time.monotonic() - started
    if vet:
        run(["go", "vet", CLIENT_PACKAGE, GO_IMPORT_PATH], env=env)
        client_dir = CLIENT_GOPATH / "src" / CLIENT_PACKAGE
        unformatted = subprocess.run(
            ["gofmt", "-l", str(client_dir)], capture_output=True, text=True, check=True,
        ).stdout.split()
        if unformatted:
            raise subprocess.CalledProcessError(1, ["gofmt", "-l"], output=" ".join(unformatted))
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gopath", type=Path, default=ROOT / "go",
                        help="GOPATH entry that receives the generated code (default: go/)")
    parser.add_argument("--output", type=Path, default=None,
                        help="binary to write (default: <gopath>/bin/hamiclient)")
    parser.add_argument("--vet", action="store_true", help="also run go vet and gofmt -l")
    args = parser.parse_args()
    gopath = args.gopath.resolve()
    output = (args.output or gopath / "bin" / CLIENT_PACKAGE).resolve()
    try:
        elapsed = build(gopath, output, args.vet)
    except ToolchainMissing as missing:
        print(missing, file=sys.stderr)
        return MISSING_TOOLCHAIN
    except subprocess.CalledProcessError as failed:
        detail = f": {failed.output}" if failed.output else ""
        print(f"failed ({failed.returncode}): {' '.join(map(str, failed.cmd))}{detail}",
              file=sys.stderr)
        return 1
    print(f"built {output} (go build {elapsed:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
