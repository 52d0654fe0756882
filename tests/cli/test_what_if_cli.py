"""``hami-accounting what-if``: inputs (a directory of YAML, a kubectl List on stdin, a
generated workload), table and JSON output, the chart, and bad input (exit 2, the object and
the field named)."""

from __future__ import annotations

import io
import json
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from services.cli import app, what_if, what_if_chart

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "what-if"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

Json = dict[str, Any]


@pytest.fixture(autouse=True)
def wide_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)


def run(args: list[str], stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = what_if.main(args, stdin=io.StringIO(stdin), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def run_json(args: list[str], stdin: str = "") -> Json:
    code, out, err = run([*args, "--output", "json"], stdin)
    assert code == 0, err
    document: Json = json.loads(out)
    return document


def by_rule(document: Json) -> dict[str, Json]:
    return {rule["rule"]: rule for rule in document["rules"]}


def test_the_example_directory_replays_init_case_4_under_every_rule() -> None:
    document = run_json([str(EXAMPLE), "--window-s", "600", "--pods"])

    assert (document["pods"], document["nodes"], document["window_s"]) == (2, 1, 600)
    rules = by_rule(document)
    assert list(rules) == ["summed", "hami-v2.10", "shrink", "progressive"]
    for name in ("hami-v2.10", "shrink", "progressive"):
        rule = rules[name]
        warmup, newcomer = rule["pods"]
        # Recorded at 20Gi while convert-weights runs, 10Gi after: the 12Gi pod waits 70 s.
        assert (warmup["request_mib"], warmup["peak_stored_mib"]) == (20480, 20480)
        assert (newcomer["placed_s"], newcomer["waited_s"]) == (100, 70)
        assert rule["peak_reserved_mib"] == 10240 + 12288
        assert rule["namespaces"][0] == {
            "namespace": "team-a",
            "limit_mib": 24576,
            "peak_used_mib": 20480,
            "min_headroom_mib": 4096,
            "refused": 0,
        }
    summed = rules["summed"]
    assert summed["refused"] == {"MemoryQuotaExceeded": 1}
    assert summed["pods"][0]["request_mib"] == 20480 + 10240


def test_the_table_shows_each_rule_and_the_quota_headroom() -> None:
    code, out, err = run([str(EXAMPLE), "--window-s", "600"])

    assert code == 0, err
    assert out.startswith("2 GPU pods on 1 node (1 GPU, 24.0 GiB), 600 s window")
    header = next(line for line in out.splitlines() if "summed" in line)
    assert header.split() == ["summed", "hami-v2.10", "shrink", "progressive"]
    assert "refused: MemoryQuotaExceeded" in out
    headroom = next(line for line in out.splitlines() if line.strip().startswith("team-a"))
    assert headroom.split() == ["team-a", "24.0", "24.0", "(1", "refused)", "4.0", "4.0", "4.0"]
    assert "progressive: ordering-aware, and each init container's share released" in out


def test_a_kubectl_list_on_stdin_and_the_rules_chosen() -> None:
    items = [what_if._documents(p.read_text(), p.name) for p in sorted(EXAMPLE.glob("*.yaml"))]
    listing = {"kind": "List", "items": [o.obj for documents in items for o in documents]}

    document = run_json(
        ["-", "--rules", "progressive,summed", "--window-s", "600"], json.dumps(listing)
    )

    assert [rule["rule"] for rule in document["rules"]] == ["progressive", "summed"]
    assert by_rule(document)["progressive"]["placed"] == 2


def test_a_generated_workload_gives_the_same_figures_in_one_process_or_several(
    tmp_path: Path,
) -> None:
    saved = tmp_path / "generated.json"
    args = ["--generate", "200", "--seed", "9", "--save-generated", str(saved)]

    together = run_json([*args, "--jobs", "1"])
    apart = run_json([*args, "--jobs", "4"])

    assert together == apart
    assert together["pods"] == 200 and together["nodes"] == 10
    # The saved objects replay to the same figures as the generated ones.
    assert (
        run_json([str(saved), "--window-s", str(together["window_s"])])["rules"] == apart["rules"]
    )


def test_an_input_without_gpu_pods_says_so_and_succeeds(tmp_path: Path) -> None:
    (tmp_path / "web.yaml").write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: shop}\n"
        "spec: {containers: [{name: nginx, image: nginx}]}\n"
        "---\napiVersion: v1\nkind: Service\nmetadata: {name: web}\n"
    )

    code, out, err = run([str(tmp_path)])

    assert (code, err) == (0, "")
    assert "0 GPU pods on 0 nodes" in out
    assert "skipped: 1 Pod without a GPU request, 1 Service" in out
    assert "No pod asks for a GPU: nothing to replay." in out
    assert run_json([str(tmp_path)])["rules"] == []


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: bad, namespace: team-a}\n"
            "spec:\n  containers:\n  - name: main\n    resources:\n      limits:\n"
            "        nvidia.com/gpu: 1\n        nvidia.com/gpumem: lots\n",
            "  bad.yaml (Pod team-a/bad): spec.containers[0].resources.limits"
            '["nvidia.com/gpumem"]: must be a Kubernetes quantity such as 4096, 24Gi or 1500m, '
            'got "lots"',
        ),
        (
            "kind: Pod\nmetadata: {name: a}\n---\nkind: Node\nmetadata:\n  name: n1\n"
            "  annotations: {hami.io/node-nvidia-register: '[{\"id\": 7}]'}\n",
            "  bad.yaml[1] (Node n1): metadata.annotations",
        ),
        ("kind: Pod\nmetadata: [unclosed\n", "bad.yaml: not valid YAML"),
        ("kind: Pod\nmetadata: {name: " + "9" * 5000 + "}\n",
         "bad.yaml: not valid YAML (a number of thousands of digits)"),
        ("[" * 100_000 + "]" * 100_000, "bad.yaml: not valid JSON (nested too deeply)"),
        ("a:\n" + "".join("  " * i + "- a:\n" for i in range(1, 400)), "bad.yaml: not"),
    ],
    ids=[
        "a pod's GPU memory is not a quantity",
        "a node's register annotation",
        "not YAML",
        "a YAML number of 5000 digits",
        "JSON nested beyond the stack",
        "YAML nested very deeply",
    ],
)
def test_a_malformed_file_exits_2_naming_the_object_and_the_field(
    tmp_path: Path, content: str, expected: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(content)

    code, out, err = run([str(bad)])

    assert (code, out) == (2, "")
    assert expected.replace("bad.yaml", str(bad)) in err, err


def test_the_chart_is_a_png(tmp_path: Path) -> None:
    chart = tmp_path / "what-if.png"

    code, out, err = run([str(EXAMPLE), "--window-s", "600", "--chart", str(chart)])

    assert code == 0, err
    assert f"Chart: {chart}" in out
    assert chart.read_bytes().startswith(PNG_SIGNATURE)


def test_without_matplotlib_a_chart_is_refused_with_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(what_if.importlib.util, "find_spec", lambda name: None)

    code, out, err = run([str(EXAMPLE), "--chart", str(tmp_path / "c.png")])

    assert (code, out) == (2, "")
    assert "--chart needs matplotlib: install the project's what-if extra" in err
    assert "pip install -e '.[what-if]'" in err
    assert not (tmp_path / "c.png").exists()


def test_the_chart_module_names_the_extra_when_matplotlib_cannot_be_imported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)

    with pytest.raises(what_if_chart.ChartUnavailableError, match=r"-e '\.\[what-if\]'"):
        what_if_chart.write_chart([], tmp_path / "c.png")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give input files or directories, or --generate N"),
        (["x.json", "--generate", "5"], "give input files or directories, or --generate N"),
        (["--generate", "5", "--rules", "summed,fastest"], "--rules: must be a comma-separated"),
        (["missing.yaml"], "missing.yaml: cannot read the file"),
    ],
    ids=["no input", "an input and --generate", "an unknown rule", "a file that is not there"],
)
def test_bad_arguments_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(args)

    assert code == 2
    assert message in err + capsys.readouterr().err


def test_the_cli_forwards_what_if(capsys: pytest.CaptureFixture[str]) -> None:
    assert app.main(["what-if", "--help"]) == 0
    assert "under each GPU accounting rule" in capsys.readouterr().out


def _doc_block(command: str) -> list[str]:
    """The lines docs/what-if.md shows under ``$ <command>`` in a fenced block."""
    lines = (ROOT / "docs" / "what-if.md").read_text().splitlines()
    start = lines.index(f"$ {command}") + 1
    end = lines.index("```", start)
    return lines[start:end]


def test_the_docs_show_what_the_example_run_prints() -> None:
    code, out, err = run([str(EXAMPLE), "--window-s", "600"])

    assert code == 0, err
    printed = [line.rstrip() for line in out.splitlines()]
    shown = _doc_block("hami-accounting what-if examples/what-if --window-s 600")
    # Everything but how long this run took.
    assert [line for line in printed if "replayed in" not in line] == [
        line for line in shown if "replayed in" not in line
    ]


def test_the_docs_run_and_chart_are_checked_in_and_the_readme_lists_the_command() -> None:
    shown = _doc_block(
        "hami-accounting what-if --generate 10000 --nodes 500 --seed 1 --chart docs/what-if.png"
    )
    assert shown[0].startswith("10,000 GPU pods on 500 nodes")
    assert any(line.split()[:2] == ["pods", "placed"] for line in shown)
    assert (ROOT / "docs" / "what-if.png").read_bytes().startswith(PNG_SIGNATURE)
    readme = (ROOT / "README.md").read_text()
    assert "| `hami-accounting what-if" in readme and "docs/what-if.md" in readme


def test_a_chart_into_a_missing_directory_is_refused_before_the_replay(tmp_path: Path) -> None:
    code, out, err = run([str(EXAMPLE), "--chart", str(tmp_path / "no" / "c.png")])

    assert (code, out) == (2, "")
    assert "no such directory" in err


@pytest.mark.parametrize(
    "name", ["c.txt", "c", "c.svg"], ids=["another ending", "no ending", "another image format"]
)
def test_a_chart_path_that_is_not_a_png_is_refused_before_the_replay(
    tmp_path: Path, name: str
) -> None:
    chart = tmp_path / name

    code, out, err = run([str(EXAMPLE), "--chart", str(chart)])

    assert (code, out) == (2, "")
    assert f"--chart {chart}: the chart is a PNG; give a path ending in .png" in err
    assert list(tmp_path.iterdir()) == []


def test_a_chart_path_ending_in_upper_case_png_is_written_exactly_there(tmp_path: Path) -> None:
    chart = tmp_path / "WHAT-IF.PNG"

    code, out, err = run([str(EXAMPLE), "--window-s", "600", "--chart", str(chart)])

    assert code == 0, err
    assert f"Chart: {chart}" in out
    assert [p.name for p in tmp_path.iterdir()] == ["WHAT-IF.PNG"]
    assert chart.read_bytes().startswith(PNG_SIGNATURE)


def test_the_docs_install_only_extras_pyproject_defines_and_never_from_pypi() -> None:
    """hami-accounting is not published: a doc that says ``pip install 'hami-accounting[...]'``
    sends the reader to a package that does not exist."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = set(project["optional-dependencies"])
    assert "what-if" in extras
    named: list[tuple[str, str]] = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for command in re.findall(r"pip install[^`\n]*", page.read_text()):
            assert "hami-accounting" not in command, (page.name, command)
            named += [(page.name, extra) for extra in re.findall(r"\.\[([\w,-]+)\]", command)]
    assert ("what-if.md", "what-if") in named
    assert {extra for _, extra in named} <= extras, named
