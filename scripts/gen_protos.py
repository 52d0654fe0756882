"""Generates gen/hami/accounting/v1 from protos/ (the only way gen/ is written).

Usage:
    python scripts/gen_protos.py          # regenerate gen/ in place
    python scripts/gen_protos.py --check  # regenerate into a temporary folder and fail on any
                                          # difference with the checked-in gen/
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
GEN_ROOT = ROOT / "gen"
PACKAGE_DIR = Path("hami") / "accounting" / "v1"


def generate(out_dir: Path) -> None:
    """Runs grpc_tools.protoc with the mypy-protobuf plugins into out_dir."""
    protos = sorted(
        str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / PACKAGE_DIR).glob("*.proto")
    )
    # mypy-protobuf's protoc plugins live next to the interpreter in the virtual environment.
    env_path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *protos,
    ]
    subprocess.run(command, check=True, cwd=ROOT, env={"PATH": env_path})
    # Packages need __init__.py files so setuptools and mypy find them.
    for package in (Path("hami"), Path("hami") / "accounting", PACKAGE_DIR):
        init = out_dir / package / "__init__.py"
        init.parent.mkdir(parents=True, exist_ok=True)
        init.write_text('"""Generated from protos/ by scripts/gen_protos.py; do not edit."""\n')
    # types.proto declares no service: its _grpc modules are empty noise.
    for stub in ("types_pb2_grpc.py", "types_pb2_grpc.pyi"):
        (out_dir / PACKAGE_DIR / stub).unlink(missing_ok=True)


def differences(left: Path, right: Path) -> list[str]:
    """Lists files that differ, are missing, or are extra between two trees."""
    found: list[str] = []
    comparison = filecmp.dircmp(left, right, ignore=["__pycache__"])

    def walk(cmp: filecmp.dircmp[str], prefix: str) -> None:
        found.extend(f"{prefix}{name}: only in regenerated output" for name in cmp.left_only)
        found.extend(f"{prefix}{name}: not produced by the generator" for name in cmp.right_only)
        # dircmp compares shallowly (size and mtime); compare contents to be sure.
        for name in cmp.common_files:
            if not filecmp.cmp(Path(cmp.left) / name, Path(cmp.right) / name, shallow=False):
                found.append(f"{prefix}{name}: differs")
        for name, sub in cmp.subdirs.items():
            walk(sub, f"{prefix}{name}/")

    walk(comparison, "gen/")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if gen/ is out of date")
    args = parser.parse_args()
    if not args.check:
        shutil.rmtree(GEN_ROOT / "hami", ignore_errors=True)
        generate(GEN_ROOT)
        print(f"regenerated {GEN_ROOT / PACKAGE_DIR}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        problems = differences(Path(tmp) / "hami", GEN_ROOT / "hami")
    if problems:
        print("gen/ is out of date with protos/ (run `make proto`):", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        return 1
    print("gen/ matches protos/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
