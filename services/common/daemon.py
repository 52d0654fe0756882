"""The one command line of the three daemons: flags -> environment -> config -> start -> serve.

Layer: services (runtime). Each daemon's ``__main__`` is a table (``DaemonSpec``): its flags,
how it reads its config, how it starts, what its "serving" log line says. ``run`` does the rest
the same way for all three:

1. flags override the ``HAMI_ACCOUNTING_*`` variables one to one (the config is read from one
   place, the environment);
2. a bad configuration prints every problem and exits 2;
3. logging, tracing (the standard ``OTEL_*`` variables) and the metrics endpoint start;
4. a daemon that cannot start (an address taken, a journal it cannot open) logs why and exits
   1 (3: the recorder's journal is damaged), without a stack trace for the expected causes;
5. it serves until SIGTERM or SIGINT, then drains and stops (exit 0).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from opentelemetry.sdk.trace import TracerProvider

from services.common import telemetry
from services.common.config import (
    DEFAULT_PORTS,
    DEFAULT_USAGE_ADDR,
    RECORDER_SETTINGS,
    CommonConfig,
    ConfigError,
    env_name,
    environment_with_flags,
)
from services.common.logging import configure_logging
from services.common.metrics import MetricsError, start_metrics_server
from services.common.server import (
    ServerHandle,
    ServerStartError,
    StopSignals,
    run_until_signalled,
)

EXIT_SERVED = 0
EXIT_CANNOT_START = 1
EXIT_BAD_CONFIG = 2


@dataclass(frozen=True)
class Flag:
    """One command-line flag, standing for one ``HAMI_ACCOUNTING_*`` variable."""

    name: str
    """``--usage-addr``"""
    key: str
    """The variable after the prefix: ``USAGE_ADDR``."""
    help: str
    """What it sets and its default; the variable's name is added. ``argparse.SUPPRESS``
    hides the flag."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """More ``add_argument`` options (``metavar``, ``choices``)."""

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")


def common_flags(service: str) -> tuple[Flag, ...]:
    """The flags every daemon has, with its default ports in their help."""
    ports = DEFAULT_PORTS[service]
    return (
        Flag("--listen", "LISTEN_ADDR", f"gRPC address; default 127.0.0.1:{ports.grpc}",
             {"metavar": "HOST:PORT"}),
        Flag("--metrics", "METRICS_ADDR", f"Prometheus address; default 127.0.0.1:{ports.metrics}",
             {"metavar": "HOST:PORT|off"}),
        Flag("--log-level", "LOG_LEVEL", "DEBUG, INFO, WARNING, ERROR or CRITICAL; default INFO",
             {"metavar": "LEVEL"}),
    )


USAGE_ADDR_FLAG = Flag(
    "--usage-addr", "USAGE_ADDR", f"usage recorder address; default {DEFAULT_USAGE_ADDR}",
    {"metavar": "HOST:PORT"},
)
"""Where the admission and scheduler daemons reach the usage recorder."""

RECORDER_SETTING_FLAGS = (
    Flag("--memory-factor", "MEMORY_FACTOR", argparse.SUPPRESS),
    Flag("--enforce-gpu-count", "ENFORCE_GPU_COUNT", argparse.SUPPRESS),
    Flag("--vendors", "VENDORS", argparse.SUPPRESS),
)
"""Flags of the recorder's accounting policy, hidden on the other daemons: given there, they
are refused like their variables (``config.recorder_settings_problems``), naming where they
belong, instead of an argparse "unrecognized arguments"."""
assert {flag.key for flag in RECORDER_SETTING_FLAGS} == set(RECORDER_SETTINGS)


class Configured(Protocol):
    """A daemon's config: it has the common settings."""

    @property
    def common(self) -> CommonConfig: ...


class Started(Protocol):
    """A started daemon."""

    @property
    def handle(self) -> ServerHandle: ...

    @property
    def target(self) -> str: ...

    def shutdown_background(self) -> None:
        """Stops what runs beside the server (after the server stopped)."""
        ...


C = TypeVar("C", bound=Configured)
D = TypeVar("D", bound=Started)


@dataclass(frozen=True)
class DaemonSpec(Generic[C, D]):
    """What makes one daemon's command line its own."""

    name: str
    """admission, scheduler or usage (the ``serve`` subcommand, logger and tracer names)."""
    description: str
    flags: tuple[Flag, ...]
    """Beyond ``common_flags``."""
    read_config: Callable[[Mapping[str, str]], C]
    """``XConfig.from_env``; raises ``ConfigError`` listing every problem."""
    start: Callable[[C, TracerProvider | None], D]
    serving_fields: Callable[[C, D], Mapping[str, object]]
    """What the "serving" log line reports beyond the address."""
    start_errors: tuple[type[Exception], ...] = ()
    """Expected reasons not to start, logged without a stack (beyond an address or metrics
    port that cannot be bound)."""
    exit_codes: tuple[tuple[type[Exception], int], ...] = ()
    """Start errors with an exit code of their own (the recorder's damaged journal: 3);
    every other reason not to start exits 1."""

    @property
    def prog(self) -> str:
        return f"hami-accounting serve {self.name}"

    def parser(self) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(
            prog=self.prog,
            description=f"{self.description} Flags override the HAMI_ACCOUNTING_* variables.",
        )
        for flag in (*common_flags(self.name), *self.flags):
            text = flag.help
            if text != argparse.SUPPRESS:
                text = f"{text} ({env_name(flag.key)})"
            parser.add_argument(flag.name, dest=flag.dest, help=text, **flag.options)
        return parser


def run(spec: DaemonSpec[C, D], argv: Sequence[str] | None = None) -> int:
    """Runs the daemon until SIGTERM/SIGINT; returns the process exit code."""
    log = logging.getLogger(f"services.{spec.name}")
    args = spec.parser().parse_args(argv)
    flags = {flag.dest: flag.key for flag in (*common_flags(spec.name), *spec.flags)}
    env = environment_with_flags(args, flags, os.environ)
    try:
        config = spec.read_config(env)
    except ConfigError as error:
        print(f"{spec.prog}: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    configure_logging(spec.name, config.common.log_level)
    tracer_provider = telemetry.tracer_provider_from_env(spec.name)
    expected: tuple[type[Exception], ...] = (MetricsError, ServerStartError, *spec.start_errors)
    # Before the start: the daemon reports SERVING while its start may still run, and a
    # SIGTERM in that window must stop it gracefully, not kill it.
    signals = StopSignals()
    try:
        start_metrics_server(config.common.metrics_addr)
        daemon = spec.start(config, tracer_provider)
    except expected as error:
        signals.restore()
        log.error("cannot start the %s daemon: %s", spec.name, error)
        telemetry.shutdown(tracer_provider)
        return next(
            (code for kind, code in spec.exit_codes if isinstance(error, kind)), EXIT_CANNOT_START
        )
    except Exception as error:
        signals.restore()
        # A bad environment the daemon has no word for (a kubeconfig that does not load):
        # still a clean exit, with the stack for whoever debugs it.
        log.error("cannot start the %s daemon: %s", spec.name, error, exc_info=True)
        telemetry.shutdown(tracer_provider)
        return EXIT_CANNOT_START
    log.info(
        "%s daemon serving",
        spec.name,
        extra={"target": daemon.target, **spec.serving_fields(config, daemon)},
    )
    run_until_signalled(daemon.handle, on_stop=daemon.shutdown_background, signals=signals)
    return EXIT_SERVED
