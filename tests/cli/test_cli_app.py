"""The hami-accounting dispatcher: ``serve`` and the tools get their arguments verbatim, every
subcommand reaches its own module, and a usage error is said in one line."""

from __future__ import annotations

import sys
import types

import pytest

from services.cli import app
from services.common.config import ConfigError


def _fake_module(monkeypatch: pytest.MonkeyPatch, name: str, exit_code: int) -> list[list[str]]:
    calls: list[list[str]] = []
    module = types.ModuleType(name)

    def main(argv: list[str]) -> int:
        calls.append(argv)
        return exit_code

    module.main = main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, name, module)
    return calls


def test_serve_runs_the_daemon_main_with_the_remaining_arguments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _fake_module(monkeypatch, "services.scheduler.__main__", exit_code=5)
    assert app.main(["serve", "scheduler", "--help", "extra"]) == 5
    assert calls == [["--help", "extra"]]


def test_forwarded_tools_get_their_arguments_verbatim(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_module(monkeypatch, "services.cli.demo", exit_code=0)
    assert app.main(["demo", "--usage", "127.0.0.1:1", "--help"]) == 0
    assert calls == [["--usage", "127.0.0.1:1", "--help"]]


@pytest.mark.parametrize(
    ("args", "prog"),
    [
        (["demo", "--help"], "hami-accounting demo"),
        (["explain", "--help"], "hami-accounting explain"),
        (["usage", "--help"], "hami-accounting usage"),
        (["what-if", "--help"], "hami-accounting what-if"),
        (["journal", "--help"], "hami-accounting journal"),
        (["serve", "admission", "--help"], "hami-accounting serve admission"),
        (["serve", "scheduler", "--help"], "hami-accounting serve scheduler"),
        (["serve", "usage", "--help"], "hami-accounting serve usage"),
    ],
    ids=["demo", "explain", "usage", "what-if", "journal", "serve admission", "serve scheduler",
         "serve usage"],
)
def test_every_subcommand_reaches_its_own_module(
    args: list[str], prog: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = app.main(args)
    except SystemExit as exit_:  # argparse's --help in a module that lets it through
        code = exit_.code  # type: ignore[assignment]
    assert code == 0
    assert capsys.readouterr().out.startswith(f"usage: {prog} ")


def test_a_tool_refusing_its_configuration_is_a_usage_error_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = types.ModuleType("services.cli.explain")

    def main(argv: list[str]) -> int:
        raise ConfigError(["HAMI_ACCOUNTING_TLS_CERT: no such file"])

    module.main = main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "services.cli.explain", module)
    assert app.main(["explain", "pod.json"]) == 2
    assert capsys.readouterr().err == (
        "hami-accounting explain: invalid configuration: HAMI_ACCOUNTING_TLS_CERT: no such file\n"
    )


def test_unknown_daemon_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        app.main(["serve", "billing"])
    assert caught.value.code == 2
    assert "invalid choice: 'billing'" in capsys.readouterr().err


def test_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        app.main(["--help"])
    out = capsys.readouterr().out
    for command in ("serve", "up", "health", "demo", "explain", "usage"):
        assert command in out
