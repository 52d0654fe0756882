"""docs/go-clients.md quotes the Go client verbatim: every snippet is a doc region of main.go.

A region in tests/interop/go/src/hamiclient/main.go runs from a `// doc:begin NAME` line to the
matching `// doc:end NAME` line. In the doc, each ```go block is preceded by
`<!-- snippet: NAME -->` and must equal the region with its common indentation removed.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAIN_GO = ROOT / "tests" / "interop" / "go" / "src" / "hamiclient" / "main.go"
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


def regions() -> dict[str, str]:
    found = {m["name"]: textwrap.dedent(m["body"]).strip("\n") for m in REGION.finditer(
        MAIN_GO.read_text())}
    assert found, f"no doc regions in {MAIN_GO}"
    return found


def snippets() -> list[tuple[str, str]]:
    return [(m["name"], m["body"].strip("\n")) for m in SNIPPET.finditer(DOC.read_text())]


def test_every_go_block_in_the_doc_is_a_named_snippet() -> None:
    text = DOC.read_text()
    assert len(GO_BLOCK.findall(text)) == len(snippets()), (
        "every ```go block in docs/go-clients.md needs a `<!-- snippet: NAME -->` line before it"
    )


def test_doc_snippets_match_main_go_verbatim() -> None:
    code = regions()
    for name, body in snippets():
        assert name in code, f"docs/go-clients.md quotes {name!r}: main.go has no such region"
        assert body == code[name], (
            f"docs/go-clients.md snippet {name!r} differs from main.go; it should read:\n"
            f"```go\n{code[name]}\n```"
        )


def test_every_region_is_quoted_in_the_doc() -> None:
    quoted = {name for name, _ in snippets()}
    missing = sorted(set(regions()) - quoted)
    assert not missing, f"main.go doc regions not quoted in docs/go-clients.md: {missing}"
