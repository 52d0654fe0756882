"""One spelling of a daemon's address across the command line: ``--<daemon>-addr``, as the
daemons' own flags and the ``HAMI_ACCOUNTING_<DAEMON>_ADDR`` variables spell it; the short
spellings ``demo`` and ``usage`` once took still work and are no longer shown."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from services.cli import demo, explain, usage_report

PARSERS = {
    "demo": (demo._parser, ("usage", "admission", "scheduler")),
    "usage": (lambda: usage_report._parser("127.0.0.1:50053"), ("usage",)),
    "explain": (explain._parser, ("usage",)),
}
POSITIONAL = {"explain": ["pod.yaml"]}


@pytest.mark.parametrize("command", sorted(PARSERS))
def test_every_command_takes_the_addr_spelling_and_hides_the_old_one(command: str) -> None:
    build, daemons = PARSERS[command]
    parser: argparse.ArgumentParser = build()
    for daemon in daemons:
        new = parser.parse_args([*POSITIONAL.get(command, []), f"--{daemon}-addr", "10.0.0.1:1"])
        old = parser.parse_args([*POSITIONAL.get(command, []), f"--{daemon}", "10.0.0.1:1"])
        assert getattr(new, daemon) == getattr(old, daemon) == "10.0.0.1:1"

    shown = io.StringIO()
    with contextlib.redirect_stdout(shown), pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    for daemon in daemons:
        assert f"--{daemon}-addr HOST:PORT" in shown.getvalue()
        assert f"--{daemon} HOST:PORT" not in shown.getvalue()


def test_without_the_option_the_default_stands() -> None:
    args = demo._parser().parse_args([])
    assert (args.usage, args.admission, args.scheduler) == (
        "127.0.0.1:50053", "127.0.0.1:50051", "127.0.0.1:50052")
    assert explain._parser().parse_args(["pod.yaml"]).usage is None
