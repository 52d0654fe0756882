"""Writes the values table of charts/hami-accounting/README.md from the chart itself.

Tooling, not product code. One row per setting: its key, its type and description from
values.schema.json (which Helm enforces), its default from values.yaml. The table sits between
the ``BEGIN values`` and ``END values`` comments of the README; ``--check`` (run by
``make verify`` and tests/deploy) fails when a value was added, removed or re-described
without the table following.

Usage:
    python scripts/gen_chart_docs.py            # rewrite the table
    python scripts/gen_chart_docs.py --check    # fail when the table is stale
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
CHART_DIR = REPO_ROOT / "charts" / "hami-accounting"
README = CHART_DIR / "README.md"
BEGIN = "<!-- BEGIN values: written by scripts/gen_chart_docs.py from values.schema.json -->"
END = "<!-- END values -->"

_MISSING = object()
_ANGLED = re.compile(r"(\S*<[^>\s]+>\S*?)(?=[\s,;:)]|$)")
"""A word with a <placeholder> (limits.<vendor>/...): code, or Markdown would read a tag."""


def rows(
    schema: dict[str, Any], values: Any, path: str = ""
) -> Iterator[tuple[str, str, str, str]]:
    """(key, type, default, description) of every setting, depth first in schema order."""
    for key, node in schema.get("properties", {}).items():
        where = f"{path}.{key}" if path else key
        default = values.get(key, _MISSING) if isinstance(values, dict) else _MISSING
        if node.get("type") == "object" and node.get("properties") and default != {}:
            yield from rows(node, default if isinstance(default, dict) else {}, where)
            continue
        description = node.get("description", "")
        if node.get("properties"):  # an object empty by default: name its keys
            description += f" (keys: {', '.join(node['properties'])})"
        if default is _MISSING:
            raise ValueError(f"{where}: in values.schema.json but not in values.yaml")
        yield where, type_of(node), shown(default), description


def type_of(node: dict[str, Any]) -> str:
    if "anyOf" in node:
        return " or ".join(type_of(choice) for choice in node["anyOf"])
    if "enum" in node:
        return " \\| ".join(f"`{choice}`" for choice in node["enum"])
    if "const" in node:
        return f"`{node['const']}`"
    return str(node.get("type", "any"))


def shown(value: Any) -> str:
    text = json.dumps(value, separators=(", ", ": "))
    return f"`{text}`" if len(text) <= 60 else f"`{text[:57]}...`"


def missing_from_schema(schema: dict[str, Any], values: Any, path: str = "") -> list[str]:
    """Keys of values.yaml the schema does not describe (it would refuse them anyway)."""
    found = []
    if not isinstance(values, dict) or not schema.get("properties"):
        return found
    for key, value in values.items():
        where = f"{path}.{key}" if path else key
        node = schema["properties"].get(key)
        if node is None:
            found.append(where)
        else:
            found += missing_from_schema(node, value, where)
    return found


def table() -> str:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    undescribed = missing_from_schema(schema, values)
    if undescribed:
        raise ValueError(f"values.yaml keys without a schema: {', '.join(undescribed)}")
    lines = ["| key | type | default | what it does |", "|---|---|---|---|"]
    for key, kind, default, description in rows(schema, values):
        cell = _ANGLED.sub(r"`\1`", description.replace("|", "\\|"))
        lines.append(f"| `{key}` | {kind} | {default} | {cell} |")
    return "\n".join(lines)


def render(current: str) -> str:
    """The README with its values table rewritten.

    Raises:
        ValueError: the README has no BEGIN/END block.
    """
    start, end = current.find(BEGIN), current.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{README}: expected '{BEGIN}' ... '{END}'")
    return current[: start + len(BEGIN)] + "\n" + table() + "\n" + current[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the table is stale")
    args = parser.parse_args(argv)
    current = README.read_text()
    wanted = render(current)
    if args.check:
        if wanted != current:
            print(f"{README.relative_to(REPO_ROOT)}: the values table does not follow "
                  "values.schema.json and values.yaml: run python scripts/gen_chart_docs.py")
            return 1
        return 0
    README.write_text(wanted)
    print(f"wrote {README.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
