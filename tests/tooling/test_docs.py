"""Every Markdown file in the repository: no link or path leads outside it, and every
expected-to-fail test a doc claims exists and is marked xfail (scripts/check_docs.py).

The checker is first shown to catch each kind of untrue doc in a small made-up repository, then
run over this one.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_docs.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_docs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


check_docs = _load()

TESTS = '''
import pytest

@pytest.mark.xfail(strict=True, reason="a known gap")
def test_known_gap():
    assert False

def test_plain():
    pass

@pytest.mark.parametrize("x", [1, pytest.param(2, marks=pytest.mark.xfail(strict=True))])
def test_one_case_fails(x):
    assert x == 1
'''


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A made-up repository (not a git checkout) beside a folder of notes it must not cite."""
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "tests" / "test_things.py").write_text(TESTS)
    (root / "docs" / "other.md").write_text("# other\n")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "notes.md").write_text("outside\n")
    return root


def problems(root: Path, text: str, name: str = "docs/page.md") -> list[str]:
    (root / name).write_text(text)
    return [f.problem for f in check_docs.check(root)]


@pytest.mark.parametrize(
    "text",
    [
        "See [the notes](../../shared/notes.md).",
        "See `../../shared/notes.md` for the design.",
        "See ../../shared/notes.md for the design.",
        "![diagram](../../shared/diagram.png)",
    ],
    ids=["link", "backquoted path", "bare path", "image"],
)
def test_a_path_outside_the_repository_is_found(repo: Path, text: str) -> None:
    found = problems(repo, f"# page\n\n{text}\n")
    assert len(found) == 1 and "outside the repository" in found[0], found


def test_the_readme_at_the_root_is_checked_too(repo: Path) -> None:
    found = problems(repo, "See `../shared/notes.md`.\n", name="README.md")
    assert len(found) == 1 and "outside the repository" in found[0], found


@pytest.mark.parametrize(
    "text, problem",
    [
        ("[gone](missing.md)", "no such file"),
        ("[abs](/etc/passwd)", "absolute path"),
        ("see `../docs/missing.md`", "no such file"),
    ],
)
def test_a_link_to_nothing_is_found(repo: Path, text: str, problem: str) -> None:
    found = problems(repo, text + "\n")
    assert len(found) == 1 and problem in found[0], found


@pytest.mark.parametrize(
    "text",
    [
        "[other](other.md), [readme section](../docs/other.md#top), [web](https://example.com), "
        "[anchor](#page)",
        "```sh\nkustomize build ../../base\n```",
    ],
    ids=["links that resolve", "a fenced command"],
)
def test_what_resolves_inside_the_repository_passes(repo: Path, text: str) -> None:
    assert problems(repo, text + "\n") == []


@pytest.mark.parametrize(
    "text, problem",
    [
        ("Refused with INTERNAL (pinned by an expected-to-fail test).", "without naming it"),
        ("Known gaps, each a strict xfail:\n* ForgetPod without metadata.", "without naming it"),
        ("`test_gone` is expected to fail.", "test_gone, which is no test"),
        ("`test_plain` is a strict xfail.", "test_plain is not marked xfail"),
        ("`test_things.py` holds an xfail.", "without naming it"),
    ],
    ids=["unnamed", "unnamed list", "no such test", "not marked", "a file is not a test"],
)
def test_a_claimed_expected_failure_that_does_not_exist_is_found(
    repo: Path, text: str, problem: str
) -> None:
    found = problems(repo, text + "\n")
    assert len(found) == 1 and problem in found[0], found


@pytest.mark.parametrize(
    "text",
    [
        "`test_known_gap` is a strict xfail.",
        "One case of `test_one_case_fails` is expected to fail.",
        "The `test_known_*` tests are expected-to-fail.",
        "`test_plain` checks it.\n\nNothing here fails on purpose.",
    ],
    ids=["decorator", "param marks", "wildcard", "no claim"],
)
def test_a_true_claim_passes(repo: Path, text: str) -> None:
    assert problems(repo, text + "\n") == []


def test_a_module_pytestmark_marks_every_test_in_it(repo: Path) -> None:
    (repo / "tests" / "test_gaps.py").write_text(
        "import pytest\npytestmark = [pytest.mark.xfail(strict=True)]\ndef test_gap(): pass\n"
    )
    assert problems(repo, "`test_gap` is a strict xfail.\n") == []


def test_every_markdown_file_of_this_repository_is_true() -> None:
    docs = check_docs.markdown_files(ROOT)
    assert ROOT / "README.md" in docs
    assert len(docs) >= 8, docs  # README and docs/*.md at least
    findings = check_docs.check(ROOT)
    assert findings == [], "\n".join(f.show(ROOT) for f in findings)


def test_the_command_line_fails_on_a_finding(repo: Path) -> None:
    (repo / "README.md").write_text("See `../shared/notes.md`.\n")
    result = subprocess.run([sys.executable, str(SCRIPT), str(repo)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert "README.md:1: '../shared/notes.md' points outside the repository" in result.stdout
