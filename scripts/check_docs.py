"""Checks that every Markdown file in the repository says only what the repository backs up.

Tooling, not product code (standard library only; run by ``make lint`` and by
tests/tooling/test_docs.py):

* **Links stay inside the repository and lead somewhere.** A Markdown link ``[text](target)``
  to a relative path must resolve, from the file's folder, to something that exists inside the
  repository; an absolute filesystem path is never a link. Outside fenced code blocks, any path
  written with ``../`` (in prose or in backquotes, e.g. a design note in a folder beside the
  checkout) must stay inside the repository and exist. Web links (``http:``, ``https:``,
  ``mailto:``) and anchors (``#...``) are not checked.
* **Every expected-to-fail test a doc claims exists.** A paragraph that speaks of an expected
  failure (``xfail``, ``expected to fail``, ``expected-to-fail``) must name at least one test
  (``test_...``, ``*`` allowed as a wildcard), and every test it names must be a test function
  under tests/ marked ``xfail`` (decorator, ``pytest.param(..., marks=...)`` or the module's
  ``pytestmark``).

Usage: python scripts/check_docs.py [ROOT]   (default: this checkout). Exit status 1 on any
finding, each printed as ``path:line: problem``.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SKIPPED_DIRS = {".git", ".venv", "venv", "node_modules", "build", "dist", ".pytest_cache",
                ".mypy_cache", ".ruff_cache", ".hypothesis", "__pycache__"}

_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_PARENT_PATH = re.compile(r"(?<![\w./-])((?:\.\./)+[\w.@~+-][\w./@~+-]*)")
_EXPECTED_FAILURE = re.compile(r"\bx-?fail|\bexpected[- ]to[- ]fail", re.IGNORECASE)
_TEST_NAME = re.compile(r"\btest_[A-Za-z0-9_*]+(?![A-Za-z0-9_*]|\.py)")
"""A test function's name; ``test_x.py`` is a file, not a test."""
_FENCE = re.compile(r"^\s*(```|~~~)")
_NOT_A_PATH = ("http://", "https://", "mailto:", "#")


@dataclass(frozen=True)
class Finding:
    path: Path
    line: int
    problem: str

    def show(self, root: Path) -> str:
        return f"{self.path.relative_to(root)}:{self.line}: {self.problem}"


def markdown_files(root: Path) -> list[Path]:
    """Every Markdown file of the checkout: git's tracked and untracked-not-ignored files, or a
    walk of the folder when it is not a git checkout."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-co", "--exclude-standard", "-z", "--",
             "*.md", "*.markdown"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout
        return sorted(root / name for name in listed.split("\0") if name)
    except (OSError, subprocess.CalledProcessError):
        return sorted(
            path for path in root.rglob("*")
            if path.suffix in (".md", ".markdown") and path.is_file()
            and not SKIPPED_DIRS.intersection(path.relative_to(root).parts)
        )


def _prose_lines(text: str) -> Iterator[tuple[int, str, bool]]:
    """(line number, line, inside a fenced code block)."""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
            yield number, line, True
            continue
        yield number, line, fenced


def _inside(root: Path, target: Path) -> bool:
    try:
        target.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


def check_paths(root: Path, doc: Path) -> list[Finding]:
    findings = []
    for number, line, fenced in _prose_lines(doc.read_text(encoding="utf-8")):
        if fenced:
            continue
        for match in _LINK.finditer(line):
            target = match.group(1)
            if target.startswith(_NOT_A_PATH):
                continue
            path_part = target.split("#", 1)[0].split("?", 1)[0]
            if path_part.startswith("/"):
                findings.append(Finding(doc, number, f"link to an absolute path {target!r}: "
                                        "link a file of the repository, relative to this one"))
                continue
            resolved = doc.parent / path_part
            if not _inside(root, resolved):
                findings.append(Finding(doc, number, f"link {target!r} leads outside the "
                                        "repository"))
            elif not resolved.exists():
                findings.append(Finding(doc, number, f"link {target!r}: no such file in the "
                                        "repository"))
        for match in _PARENT_PATH.finditer(_LINK.sub("", line)):
            written = match.group(1).rstrip(".,;:")
            resolved = doc.parent / written
            if not _inside(root, resolved):
                findings.append(Finding(doc, number, f"{written!r} points outside the repository: "
                                        "cite a file inside it"))
            elif not resolved.exists():
                findings.append(Finding(doc, number, f"{written!r}: no such file in the "
                                        "repository"))
    return findings


# -- expected-to-fail claims ---------------------------------------------------------------------


def _mentions_xfail(node: ast.AST) -> bool:
    return any(
        (isinstance(n, ast.Attribute) and n.attr == "xfail")
        or (isinstance(n, ast.Name) and n.id == "xfail")
        for n in ast.walk(node)
    )


def xfail_tests(tests_dir: Path) -> tuple[set[str], set[str]]:
    """(names of every test function under ``tests_dir``, names of those marked xfail)."""
    every: set[str] = set()
    marked: set[str] = set()
    for source in sorted(tests_dir.rglob("*.py")):
        try:
            module = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
        except SyntaxError:
            continue
        module_marked = any(
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
            and _mentions_xfail(node.value)
            for node in module.body
        )
        for node in ast.walk(module):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and \
                    node.name.startswith("test"):
                every.add(node.name)
                if module_marked or any(_mentions_xfail(d) for d in node.decorator_list):
                    marked.add(node.name)
    return every, marked


def _paragraphs(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, text) of each block between blank lines."""
    start, block = 0, []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            if not block:
                start = number
            block.append(line)
        elif block:
            yield start, "\n".join(block)
            block = []
    if block:
        yield start, "\n".join(block)


def check_xfail_claims(doc: Path, every: Iterable[str], marked: Iterable[str]) -> list[Finding]:
    every, marked = sorted(every), sorted(marked)
    findings = []
    for number, paragraph in _paragraphs(doc.read_text(encoding="utf-8")):
        if not _EXPECTED_FAILURE.search(paragraph):
            continue
        named = sorted(set(_TEST_NAME.findall(paragraph)))
        if not named:
            findings.append(Finding(doc, number, "claims an expected-to-fail test without "
                                    "naming it (name the test_... function)"))
        for name in named:
            if not fnmatch.filter(every, name):
                findings.append(Finding(doc, number, f"names {name}, which is no test under "
                                        "tests/"))
            elif not fnmatch.filter(marked, name):
                findings.append(Finding(doc, number, f"claims an expected failure, but {name} is "
                                        "not marked xfail"))
    return findings


def check(root: Path) -> list[Finding]:
    every, marked = xfail_tests(root / "tests")
    findings = []
    for doc in markdown_files(root):
        findings += check_paths(root, doc)
        findings += check_xfail_claims(doc, every, marked)
    return findings


def main(argv: list[str]) -> int:
    root = Path(argv[0]).resolve() if argv else REPO_ROOT
    findings = check(root)
    if not findings:
        print(f"check_docs: {len(markdown_files(root))} Markdown files, every link and "
              "expected-failure claim backed by the repository")
    for finding in findings:
        print(finding.show(root))
    if findings:
        print(f"check_docs: {len(findings)} problem(s) in the Markdown files", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
