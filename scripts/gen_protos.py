"""Generates the code of protos/: Python in gen/, Go in clients/go/accountingv1 (checked in).

The only way either is written. Python comes from grpcio-tools in .venv; Go from Debian's
protoc, protoc-gen-go and protoc-gen-go-grpc (scripts/go_module.py; scripts/system_setup.py
installs them), the same packages CI installs, so the checked-in Go code is what CI makes.

Usage:
    python scripts/gen_protos.py          # regenerate gen/ and clients/go/accountingv1 in place
    python scripts/gen_protos.py --check  # regenerate both into a temporary folder and fail on
                                          # any difference with the checked-in code
Exit codes: 0 up to date (or regenerated); 1 out of date; 2 a Go generator is missing.
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

import go_module

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
GEN_ROOT = ROOT / "gen"
PACKAGE_DIR = Path("hami") / "accounting" / "v1"


def generate(out_dir: Path) -> None:
    """Runs grpc_tools.protoc with the mypy-protobuf plugins into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
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


def differences(left: Path, right: Path, label: str) -> list[str]:
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

    walk(comparison, label)
    return found


def go_differences(regenerated: Path, checked_in: Path) -> list[str]:
    """differences() for the Go package; a differing file made by other generator versions
    than this machine's says which."""
    label = f"{checked_in.relative_to(ROOT)}/"
    if not checked_in.is_dir():
        return [f"{label}: missing"]
    found = differences(regenerated, checked_in, label)
    for name in sorted(p.name for p in regenerated.glob("*.pb.go")):
        old, new = checked_in / name, regenerated / name
        if not old.is_file() or filecmp.cmp(old, new, shallow=False):
            continue
        made_by, makes = go_module.generator_versions(old), go_module.generator_versions(new)
        if made_by != makes:
            found.append(f"{label}{name}: made by {made_by}; this machine has {makes} "
                         "(CI uses Debian 12's, which scripts/system_setup.py installs)")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if gen/ is out of date")
    args = parser.parse_args()
    try:
        return check() if args.check else regenerate()
    except go_module.ToolchainMissing as missing:
        print(missing, file=sys.stderr)
        return go_module.MISSING_TOOLCHAIN


def regenerate() -> int:
    shutil.rmtree(GEN_ROOT / "hami", ignore_errors=True)
    generate(GEN_ROOT)
    print(f"regenerated {GEN_ROOT / PACKAGE_DIR}")
    go_package = go_module.MODULE_DIR / go_module.GENERATED_PACKAGE
    with tempfile.TemporaryDirectory() as tmp:
        fresh = go_module.generate(Path(tmp))
        shutil.rmtree(go_package, ignore_errors=True)
        shutil.copytree(fresh, go_package)
    print(f"regenerated {go_package}")
    return 0


def check() -> int:
    go_package = go_module.MODULE_DIR / go_module.GENERATED_PACKAGE
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp) / "python")
        problems = differences(Path(tmp) / "python" / "hami", GEN_ROOT / "hami", "gen/hami/")
        go_problems = go_differences(go_module.generate(Path(tmp) / "go"), go_package)
    for what, found in (("gen/", problems),
                        (f"{go_package.relative_to(ROOT)}/", go_problems)):
        if found:
            print(f"{what} is out of date with protos/ (run `make proto`):", file=sys.stderr)
            for line in found:
                print(f"  {line}", file=sys.stderr)
    if problems or go_problems:
        return 1
    print(f"gen/ and {go_package.relative_to(ROOT)}/ match protos/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
