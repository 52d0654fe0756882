"""The Go module in clients/go, built on this machine with Debian's Go packages in GOPATH mode.

The module (path MODULE_PATH, docs/go-clients.md) holds the generated Go code of protos/
(clients/go/accountingv1, checked in) and the client package (clients/go/hamiaccounting). There
is no module proxy here, so every go command runs with GO111MODULE=off over a GOPATH whose
src/<MODULE_PATH> is a symbolic link to clients/go: the packages keep their module import
paths, and go.mod is not read.

* ``generate(out_dir)``: Debian's protoc, protoc-gen-go and protoc-gen-go-grpc write
  ``out_dir/accountingv1/*.pb.go`` (scripts/gen_protos.py writes and checks clients/go with it).
* ``go_environment(...)``: the environment of every go command.
* ``lint()``: gofmt and go vet over the module and the interop client (``make lint``).
* ``module_mode(work_dir)``: the module built, vetted and tested in module mode, as a user
  builds it, with Debian's sources of its dependencies vendored in place of the module proxy.

Usage: python scripts/go_module.py lint | test [go test flags...] | module-mode
Exit codes: 0 clean; 1 gofmt, go vet or go test found a problem; 2 a tool or Debian package is
missing (the message names it; scripts/system_setup.py installs it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULE_DIR = ROOT / "clients" / "go"
MODULE_PATH = "github.com/hami-accounting/hami-accounting/clients/go"
GENERATED_PACKAGE = "accountingv1"
CLIENT_PACKAGE = "hamiaccounting"
PACKAGES = (f"{MODULE_PATH}/{GENERATED_PACKAGE}", f"{MODULE_PATH}/{CLIENT_PACKAGE}")
PROTO_ROOT = ROOT / "protos"
PROTO_PACKAGE = Path("hami") / "accounting" / "v1"
INTEROP_GOPATH = ROOT / "tests" / "interop" / "go"
INTEROP_PACKAGE = "hamiclient"
MODULE_GOPATH = ROOT / "go" / "module"
"""GOPATH entry holding only the link src/<MODULE_PATH> -> clients/go (go/ is git-ignored)."""
DEBIAN_GOCODE = Path("/usr/share/gocode")

GENERATORS = ("protoc", "protoc-gen-go", "protoc-gen-go-grpc")
GO_TOOLS = ("go", "gofmt")
INSTALL_HINT = (
    "the Debian packages are listed, and installed when run as root, by scripts/system_setup.py "
    "(make verify and make test run it first): python3 scripts/system_setup.py --check"
)

MISSING_TOOLCHAIN = 2


class ToolchainMissing(Exception):
    """A Go tool or Debian Go package needed here is not installed."""


def check_generators() -> None:
    """Raises ToolchainMissing unless protoc and Debian's two Go plugins are on PATH."""
    missing = [tool for tool in GENERATORS if shutil.which(tool) is None]
    if missing:
        raise ToolchainMissing(f"Go code generators missing: {', '.join(missing)}\n{INSTALL_HINT}")


def check_toolchain() -> None:
    """Raises ToolchainMissing naming what of the Go build toolchain is absent."""
    missing = [tool for tool in (*GO_TOOLS, *GENERATORS) if shutil.which(tool) is None]
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
            "Go toolchain missing: " + ", ".join(missing) + f"\n{INSTALL_HINT}"
        )


def module_gopath() -> Path:
    """The GOPATH entry that maps MODULE_PATH onto clients/go (made or repaired on demand)."""
    link = MODULE_GOPATH / "src" / MODULE_PATH
    if not (link.is_symlink() and link.resolve() == MODULE_DIR.resolve()):
        if link.is_symlink() or link.is_file():
            link.unlink()
        elif link.exists():
            shutil.rmtree(link)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(MODULE_DIR.resolve(), target_is_directory=True)
    return MODULE_GOPATH


def go_environment(*gopaths: Path) -> dict[str, str]:
    """The environment of every go command: GOPATH mode over ``gopaths`` (first), the module,
    the interop client and Debian's packages; no network."""
    env = dict(os.environ)
    entries = [*gopaths, module_gopath(), INTEROP_GOPATH, DEBIAN_GOCODE]
    env.update({
        "GO111MODULE": "off",
        "GOPATH": os.pathsep.join(str(entry) for entry in entries),
        "GOFLAGS": "",
        "GOPROXY": "off",
    })
    if not any(env.get(name) for name in ("GOCACHE", "XDG_CACHE_HOME", "HOME")):
        env["GOCACHE"] = str(ROOT / "go" / "pkg" / "gocache")
    return env


def run(command: Sequence[str], env: dict[str, str] | None = None,
        cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Runs a command, echoing it on stderr; raises CalledProcessError with its output."""
    print("+ " + " ".join(command), file=sys.stderr, flush=True)
    result = subprocess.run(list(command), cwd=cwd, env=env, capture_output=True, text=True,
                            check=False)
    if result.returncode != 0:
        raise subprocess.CalledProcessError(result.returncode, list(command),
                                            output=result.stdout, stderr=result.stderr)
    return result


def generate(out_dir: Path) -> Path:
    """Writes the Go code of protos/ into out_dir/accountingv1 (go_package is under
    MODULE_PATH; ``module=`` strips it); returns that folder."""
    check_generators()
    protos = sorted(str(p.relative_to(PROTO_ROOT))
                    for p in (PROTO_ROOT / PROTO_PACKAGE).glob("*.proto"))
    out_dir.mkdir(parents=True, exist_ok=True)
    run(["protoc", f"-I{PROTO_ROOT}",
         f"--go_out={out_dir}", f"--go_opt=module={MODULE_PATH}",
         f"--go-grpc_out={out_dir}", f"--go-grpc_opt=module={MODULE_PATH}",
         *protos])
    return out_dir / GENERATED_PACKAGE


def generator_versions(go_file: Path) -> str:
    """The ``// versions:`` lines protoc-gen-go writes at the head of a .pb.go file."""
    lines = go_file.read_text().splitlines()[:12]
    found = [" ".join(line.strip("/ \t").split()) for line in lines if line.startswith("// \t")]
    return ", ".join(found) or "no versions recorded"


def lint() -> list[str]:
    """gofmt -l and go vet over the module and the interop client; returns the problems."""
    check_toolchain()
    problems = []
    folders = [MODULE_DIR, INTEROP_GOPATH / "src" / INTEROP_PACKAGE]
    unformatted = run(["gofmt", "-l", *map(str, folders)]).stdout.split()
    problems += [f"{Path(name).relative_to(ROOT)}: not gofmt-formatted (gofmt -w it)"
                 for name in unformatted]
    try:
        run(["go", "vet", *PACKAGES, INTEROP_PACKAGE], env=go_environment())
    except subprocess.CalledProcessError as failed:
        problems.append(f"go vet:\n{failed.stdout}{failed.stderr}")
    return problems


ZERO_VERSION = "v0.0.0-00010101000000-000000000000"
"""The version Go itself writes for a module it has no version of; in vendor mode only the
modules go.mod requires are checked against their versions."""


def _module_of(package_dir: Path) -> tuple[str, Path]:
    """The module path and root of a Debian package folder: the nearest go.mod above it."""
    for folder in (package_dir, *package_dir.parents):
        go_mod = folder / "go.mod"
        if go_mod.is_file():
            found = re.search(r"^module\s+(\S+)", go_mod.read_text(), re.MULTILINE)
            if found:
                return found[1], folder
        if folder == DEBIAN_GOCODE / "src":
            break
    raise ToolchainMissing(f"{package_dir}: no go.mod above it in {DEBIAN_GOCODE / 'src'}")


def _go_version(module_root: Path) -> str | None:
    found = re.search(r"^go\s+(\S+)", (module_root / "go.mod").read_text(), re.MULTILINE)
    return found[1] if found else None


def module_mode(work_dir: Path) -> None:
    """Builds, vets and tests a copy of clients/go in module mode (GO111MODULE=on, no proxy),
    its dependencies vendored from Debian's sources: go.mod must name the module the code
    imports itself as, and require what it imports. Raises CalledProcessError on a failure."""
    check_toolchain()
    module = work_dir / "module"
    shutil.copytree(MODULE_DIR, module, ignore=shutil.ignore_patterns("vendor"))
    listed = run(["go", "list", "-deps", "-test", "-f",
                  "{{if not .Standard}}{{.ImportPath}} {{.Dir}}{{end}}", *PACKAGES],
                 env=go_environment()).stdout.split("\n")
    requires = dict(re.findall(r"^\s+(\S+)\s+(v\S+)$",
                               (MODULE_DIR / "go.mod").read_text(), re.MULTILINE))
    packages: dict[str, list[str]] = {}
    roots: dict[str, Path] = {}
    for line in filter(None, listed):
        import_path, folder = line.split(" ", 1)
        if import_path.startswith(MODULE_PATH) or " " in import_path:
            continue  # the module's own packages, and go list's test variants "p [p.test]"
        module_path, root = _module_of(Path(folder))
        packages.setdefault(module_path, []).append(import_path)
        roots[module_path] = root
        vendored = module / "vendor" / import_path
        vendored.mkdir(parents=True, exist_ok=True)
        for source in Path(folder).iterdir():
            if source.is_file() and not source.name.endswith("_test.go"):
                shutil.copy(source, vendored / source.name)
    lines = []
    for module_path in sorted(packages):
        lines.append(f"# {module_path} {requires.get(module_path, ZERO_VERSION)}")
        notes = ["explicit"] if module_path in requires else []
        version = _go_version(roots[module_path])
        if version:
            notes.append(f"go {version}")  # the language version its own go.mod states
        if notes:
            lines.append("## " + "; ".join(notes))
        lines += sorted(set(packages[module_path]))
    (module / "vendor" / "modules.txt").write_text("\n".join(lines) + "\n")
    env = dict(os.environ)
    # -trimpath keeps the temporary folder's path out of the build cache's keys, so the next
    # run (from another folder) is served from the cache: seconds instead of a minute or more.
    env.update({"GO111MODULE": "on", "GOFLAGS": "-mod=vendor -trimpath", "GOPROXY": "off",
                "GOPATH": str(work_dir / "gopath")})
    if not any(env.get(name) for name in ("GOCACHE", "XDG_CACHE_HOME", "HOME")):
        env["GOCACHE"] = str(ROOT / "go" / "pkg" / "gocache")
    for command in (["go", "build", "./..."], ["go", "vet", "./..."],
                    ["go", "test", "-count=1", "./..."]):
        run(command, env=env, cwd=module)


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] not in ("lint", "test", "module-mode"):
        print(__doc__, file=sys.stderr)
        return 1
    try:
        if argv[0] == "lint":
            problems = lint()
            for problem in problems:
                print(problem, file=sys.stderr)
            if not problems:
                print("clients/go and the interop client: gofmt and go vet clean")
            return 1 if problems else 0
        if argv[0] == "module-mode":
            with tempfile.TemporaryDirectory() as work_dir:
                module_mode(Path(work_dir))
            print("clients/go builds, vets and tests in module mode")
            return 0
        check_toolchain()
        done = subprocess.run(["go", "test", *argv[1:], *PACKAGES], cwd=ROOT,
                              env=go_environment(), check=False)
        return 1 if done.returncode else 0
    except ToolchainMissing as missing:
        print(missing, file=sys.stderr)
        return MISSING_TOOLCHAIN
    except subprocess.CalledProcessError as failed:
        print(f"failed ({failed.returncode}): {' '.join(map(str, failed.cmd))}\n"
              f"{failed.stdout}{failed.stderr}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
