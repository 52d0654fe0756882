"""Builds the Go interop client (tests/interop/go/src/hamiclient) in GOPATH mode.

The client calls the daemons through the Go module in clients/go (its checked-in generated code
and the hamiaccounting package), found under its module path through the GOPATH link that
scripts/go_module.py keeps; nothing is generated here. `go build` runs with GO111MODULE=off
GOPATH=<go/module>:<repo>/tests/interop/go:/usr/share/gocode.

Usage:
    python scripts/build_go_client.py                      # -> go/bin/hamiclient
    python scripts/build_go_client.py --output /tmp/gp/bin/hamiclient --vet

Exit codes: 0 built; 2 a tool or Debian package is missing (the message names what, and
scripts/system_setup.py installs it); 1 build, vet or gofmt failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from go_module import (
    INTEROP_PACKAGE,
    MISSING_TOOLCHAIN,
    ROOT,
    ToolchainMissing,
    check_toolchain,
    go_environment,
    lint,
    run,
)

__all__ = ["ToolchainMissing", "build", "check_toolchain", "go_environment"]


def build(output: Path, vet: bool) -> float:
    """Builds the client (optionally gofmt + go vet first); returns the go build seconds."""
    check_toolchain()
    if vet:
        problems = lint()
        if problems:
            raise subprocess.CalledProcessError(1, ["gofmt -l", "go vet"],
                                                output="\n".join(problems))
    output.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    run(["go", "build", "-o", str(output), INTEROP_PACKAGE], env=go_environment())
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "go" / "bin" / INTEROP_PACKAGE,
                        help="binary to write (default: go/bin/hamiclient)")
    parser.add_argument("--vet", action="store_true", help="also run gofmt -l and go vet")
    args = parser.parse_args()
    output = args.output.resolve()
    try:
        elapsed = build(output, args.vet)
    except ToolchainMissing as missing:
        print(missing, file=sys.stderr)
        return MISSING_TOOLCHAIN
    except subprocess.CalledProcessError as failed:
        detail = "".join(f"\n{text}" for text in (failed.output, failed.stderr) if text)
        print(f"failed ({failed.returncode}): {' '.join(map(str, failed.cmd))}{detail}",
              file=sys.stderr)
        return 1
    print(f"built {output} (go build {elapsed:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
