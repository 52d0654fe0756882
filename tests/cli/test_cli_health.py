"""``hami-accounting health``: the status printed, exit 0 only when SERVING, and what went
wrong said in words when the daemon cannot be asked."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from services.cli import app
from services.common.server import ServerHandle, build_server

USAGE_SERVICE = "hami.accounting.v1.UsageRecorder"
# A port nothing listens on.
DEAD_TARGET = "127.0.0.1:1"

ServeFn = Callable[..., ServerHandle]


@pytest.fixture
def serve() -> Iterator[ServeFn]:
    """Starts servers that report the recorder's health (and serve nothing else) through the
    real build_server; stops them after the test."""
    handles: list[ServerHandle] = []

    def start(serving: bool = True) -> ServerHandle:
        handle = build_server(service_names=[USAGE_SERVICE], register=lambda _server: None,
                              listen_addr="127.0.0.1:0", max_workers=4, serving=serving)
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.stop(grace_s=0)


@pytest.mark.parametrize(
    ("serving", "service", "want_exit", "want_output"),
    [
        (True, "", 0, "SERVING"),
        (True, USAGE_SERVICE, 0, "SERVING"),
        (False, USAGE_SERVICE, 1, "NOT_SERVING"),
    ],
    ids=["whole server serving", "named service serving", "not serving fails the probe"],
)
def test_health_prints_the_status_and_exits_0_only_when_serving(
    serve: ServeFn, capsys: pytest.CaptureFixture[str],
    serving: bool, service: str, want_exit: int, want_output: str,
) -> None:
    handle = serve(serving=serving)
    args = ["health", handle.target] + (["--service", service] if service else [])
    assert app.main(args) == want_exit
    assert capsys.readouterr().out.strip() == want_output


def test_health_of_an_unreachable_daemon_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert app.main(["health", DEAD_TARGET, "--timeout-s", "2"]) == 1
    assert capsys.readouterr().out.startswith("UNAVAILABLE: ")


def test_health_of_an_unknown_service_fails_naming_it_and_the_known_ones(
    serve: ServeFn, capsys: pytest.CaptureFixture[str]
) -> None:
    handle = serve()
    assert app.main(["health", handle.target, "--service", "x.Unknown"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("NOT_FOUND: ")
    # grpcio's own NOT_FOUND has empty details: the line must say what was not found.
    assert "'x.Unknown'" in out and handle.target in out
    for service in ("hami.accounting.v1.Admission", "hami.accounting.v1.Scheduler", USAGE_SERVICE):
        assert service in out
