"""docs/go-clients.md quotes the Go code verbatim: every snippet is a doc region of a Go file.

The Go files are the client package of the Go module (clients/go/hamiaccounting, tests left
out) and the interop client that uses it (tests/interop/go/src/hamiclient). A region runs from a
`// doc:begin NAME` line to the matching `// doc:end NAME` line; names are unique across the
files. In the doc, each ```go block is preceded by `<!-- snippet: NAME -->` and must equal the
region with its common indentation removed.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GO_DIRS = (ROOT / "clients" / "go" / "hamiaccounting", ROOT / "tests" / "interop" / "go" / "src"
           / "hamiclient")
DOC = ROOT / "docs" / "go-clients.md"

REGION = re.compile(
    r"^[ \t]*// doc:begin (?P<name>[\w-]+)[ \t]*\n(?P<body>.*?)^[ \t]*// doc:end (?P=name)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
SNIPPET = re.compile(
    r"<!-- snippet: (?P<name>[\w-]+) -->[ \t]*\n```go\n(?P<body>.*?)^```",
    re.MULTILINE | re.DOTALL,
)
GO_BLOCK = re.compile(r"^```go$", re.MULTILINE)


def go_files() -> list[Path]:
    return sorted(path for folder in GO_DIRS for path in folder.glob("*.go")
                  if not path.name.endswith("_test.go"))


def regions() -> dict[str, str]:
    found: dict[str, str] = {}
    where: dict[str, Path] = {}
    for path in go_files():
        for m in REGION.finditer(path.read_text()):
            name = m["name"]
            assert name not in found, f"doc region {name!r} is in both {where[name]} and {path}"
            found[name] = textwrap.dedent(m["body"]).strip("\n")
            where[name] = path
    assert found, f"no doc regions in {GO_DIRS}"
    return found


def snippets() -> list[tuple[str, str]]:
    return [(m["name"], m["body"].strip("\n")) for m in SNIPPET.finditer(DOC.read_text())]


def test_every_go_block_in_the_doc_is_a_named_snippet() -> None:
    text = DOC.read_text()
    assert len(GO_BLOCK.findall(text)) == len(snippets()), (
        "every ```go block in docs/go-clients.md needs a `<!-- snippet: NAME -->` line before it"
    )


def test_doc_snippets_match_the_go_code_verbatim() -> None:
    code = regions()
    for name, body in snippets():
        assert name in code, f"docs/go-clients.md quotes {name!r}: no Go file has such a region"
        assert body == code[name], (
            f"docs/go-clients.md snippet {name!r} differs from the Go code; it should read:\n"
            f"```go\n{code[name]}\n```"
        )


def test_every_region_is_quoted_in_the_doc() -> None:
    quoted = {name for name, _ in snippets()}
    missing = sorted(set(regions()) - quoted)
    assert not missing, f"Go doc regions not quoted in docs/go-clients.md: {missing}"
