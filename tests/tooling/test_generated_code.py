"""scripts/gen_protos.py --check (make verify) fails on generated code that protos/ does not make.

Run on a copy of the generator's inputs and outputs (scripts, protos/, gen/, clients/go), each
case breaking the copy one way: the check must fail and name what is wrong, and `make proto`'s
regeneration must make it pass again. The Go code is generated with Debian's protoc and Go
plugins, which `make test` installs (scripts/system_setup.py).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.go

ROOT = Path(__file__).resolve().parents[2]
GO_PACKAGE = Path("clients") / "go" / "accountingv1"
TOOLCHAIN_MISSING_EXIT = 2


def checkout(tmp_path: Path) -> Path:
    """What the generator reads and writes, copied."""
    copy = tmp_path / "checkout"
    (copy / "scripts").mkdir(parents=True)
    for script in ("gen_protos.py", "go_module.py"):
        shutil.copy(ROOT / "scripts" / script, copy / "scripts" / script)
    shutil.copytree(ROOT / "protos", copy / "protos")
    shutil.copytree(ROOT / "gen", copy / "gen", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "clients" / "go", copy / "clients" / "go",
                    ignore=shutil.ignore_patterns("vendor"))
    return copy


def gen_protos(copy: Path, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, str(copy / "scripts" / "gen_protos.py"), *args],
                            cwd=copy, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode == TOOLCHAIN_MISSING_EXIT:
        pytest.fail(f"Debian's protoc and Go plugins are required (`make test` installs them "
                    f"as root: scripts/system_setup.py):\n{result.stderr}", pytrace=False)
    return result


def edit_by_hand(copy: Path) -> None:
    path = copy / GO_PACKAGE / "usage.pb.go"
    path.write_text(path.read_text().replace("package accountingv1", "package accountingv1\n\n"
                                             "// A line nobody generated.", 1))


def made_by_another_plugin(copy: Path) -> None:
    path = copy / GO_PACKAGE / "types.pb.go"
    text = path.read_text()
    assert "// \tprotoc-gen-go v" in text
    path.write_text(text.replace("// \tprotoc-gen-go v", "// \tprotoc-gen-go v0.0.1-", 1))


def delete_one(copy: Path) -> None:
    (copy / GO_PACKAGE / "admission_grpc.pb.go").unlink()


def add_a_file(copy: Path) -> None:
    (copy / GO_PACKAGE / "helpers.go").write_text("package accountingv1\n")


def change_the_schema(copy: Path) -> None:
    path = copy / "protos" / "hami" / "accounting" / "v1" / "admission.proto"
    text = path.read_text()
    marker = "  int64 min_usage_revision = 3;\n"
    assert marker in text
    path.write_text(text.replace(marker, marker + "  string added_by_the_test = 99;\n"))


@dataclass(frozen=True)
class Stale:
    id: str
    make_stale: Callable[[Path], None]
    named: tuple[str, ...]


CASES = [
    Stale("a generated .pb.go edited by hand", edit_by_hand,
          (f"{GO_PACKAGE}/usage.pb.go: differs",)),
    Stale("a .pb.go made by another protoc-gen-go", made_by_another_plugin,
          (f"{GO_PACKAGE}/types.pb.go: differs",
           f"{GO_PACKAGE}/types.pb.go: made by protoc-gen-go v0.0.1-")),
    Stale("a generated file deleted", delete_one,
          (f"{GO_PACKAGE}/admission_grpc.pb.go: only in regenerated output",)),
    Stale("a hand-written file in the generated package", add_a_file,
          (f"{GO_PACKAGE}/helpers.go: not produced by the generator",)),
    Stale("protos/ changed without make proto", change_the_schema,
          (f"{GO_PACKAGE}/admission.pb.go: differs", "gen/hami/accounting/v1/admission_pb2.py")),
]


def test_a_fresh_copy_passes(tmp_path: Path) -> None:
    result = gen_protos(checkout(tmp_path), "--check")
    assert result.returncode == 0, result.stderr
    assert f"gen/ and {GO_PACKAGE}/ match protos/" in result.stdout


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_stale_generated_code_fails_the_check_until_regenerated(tmp_path: Path,
                                                                case: Stale) -> None:
    copy = checkout(tmp_path)
    case.make_stale(copy)
    stale = gen_protos(copy, "--check")
    assert stale.returncode == 1, f"the check passed:\n{stale.stdout}\n{stale.stderr}"
    for name in case.named:
        assert name in stale.stderr, f"the check did not name {name!r}:\n{stale.stderr}"
    assert "run `make proto`" in stale.stderr

    regenerated = gen_protos(copy)
    assert regenerated.returncode == 0, regenerated.stderr
    fresh = gen_protos(copy, "--check")
    assert fresh.returncode == 0, f"still stale after regenerating:\n{fresh.stderr}"
