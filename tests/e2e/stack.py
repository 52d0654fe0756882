"""End-to-end helpers: the three daemons as real subprocesses, and an in-process OTLP receiver.

* ``OtlpSink``: an OTLP/gRPC ``TraceService`` on 127.0.0.1:0 that keeps every span it receives
  (as ``ReceivedSpan``, ids in hex, attributes as Python values, with the sender's
  ``service.name``).
* ``Stack``: ``python -m services.cli serve usage|admission|scheduler`` in three processes on
  free ports, their output in log files, stopped with SIGTERM (so their tracer providers flush);
  ``Stubs``, a client of each.
* ``span_tree``: a trace drawn as an indented tree, for failure messages and the docs.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from hami.accounting.v1 import admission_pb2_grpc, scheduler_pb2_grpc, usage_pb2_grpc
from services.cli.health import check_health

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0

SERVICE_NAMES = {
    "usage": "hami.accounting.v1.UsageRecorder",
    "admission": "hami.accounting.v1.Admission",
    "scheduler": "hami.accounting.v1.Scheduler",
}

KIND_NAMES = {
    trace_pb2.Span.SPAN_KIND_INTERNAL: "INTERNAL",
    trace_pb2.Span.SPAN_KIND_SERVER: "SERVER",
    trace_pb2.Span.SPAN_KIND_CLIENT: "CLIENT",
    trace_pb2.Span.SPAN_KIND_PRODUCER: "PRODUCER",
    trace_pb2.Span.SPAN_KIND_CONSUMER: "CONSUMER",
}


# -- ports and environment ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_block(count: int, avoid: Iterable[int] = ()) -> int:
    """A base port such that base .. base+count-1 are all free (and not in ``avoid``)."""
    avoided = set(avoid)
    for _ in range(200):
        base = free_port()
        ports = range(base, base + count)
        if base + count < 65536 and not avoided & set(ports) and all(map(_bindable, ports)):
            return base
    raise RuntimeError(f"no block of {count} free ports found")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without OTEL_* and HAMI_ACCOUNTING_* settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "HAMI_ACCOUNTING_"))}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# -- the OTLP receiver -------------------------------------------------------------------------


def _any_value(value: common_pb2.AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


def _attributes(keyvalues: Iterable[common_pb2.KeyValue]) -> dict[str, Any]:
    return {kv.key: _any_value(kv.value) for kv in keyvalues}


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span; ids are lowercase hex ("" for no parent)."""

    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: Mapping[str, Any]
    links: tuple[tuple[str, str], ...]
    """(trace id, span id) of each link."""
    event_attributes: tuple[Mapping[str, Any], ...] = field(default=())
    start_ns: int = 0

    @classmethod
    def from_pb(cls, service: str, span: trace_pb2.Span) -> ReceivedSpan:
        return cls(
            service=service,
            name=span.name,
            kind=KIND_NAMES.get(span.kind, str(span.kind)),
            trace_id=span.trace_id.hex(),
            span_id=span.span_id.hex(),
            parent_span_id=span.parent_span_id.hex(),
            attributes=_attributes(span.attributes),
            links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
            event_attributes=tuple(_attributes(e.attributes) for e in span.events),
            start_ns=span.start_time_unix_nano,
        )


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.exports = 0
        self.cv = threading.Condition()

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        received = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            service = str(resource.get("service.name", "?"))
            for scope_spans in resource_spans.scope_spans:
                received += [ReceivedSpan.from_pb(service, s) for s in scope_spans.spans]
        with self.cv:
            self.spans += received
            self.exports += 1
            self.cv.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpSink:
    """An OTLP/gRPC trace receiver on 127.0.0.1:<free port>."""

    def __init__(self) -> None:
        self._service = _TraceService()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
            self._service, self._server
        )
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def exports(self) -> int:
        with self._service.cv:
            return self._service.exports

    def spans(self) -> list[ReceivedSpan]:
        with self._service.cv:
            return list(self._service.spans)

    def wait_for(self, predicate: Callable[[list[ReceivedSpan]], bool], timeout_s: float) -> bool:
        with self._service.cv:
            return self._service.cv.wait_for(
                lambda: predicate(list(self._service.spans)), timeout_s
            )

    def stop(self) -> None:
        self._server.stop(0).wait()


# -- the daemons -------------------------------------------------------------------------------


@dataclass
class Daemon:
    name: str
    addr: str
    process: subprocess.Popen[bytes]
    log: Path
    metrics_addr: str | None = None
    """Where its /metrics is served (None: off)."""


class StackError(AssertionError):
    """A daemon did not come up or did not stop cleanly (with its log)."""


class Stack:
    """The three daemons as subprocesses of this test, on free ports."""

    def __init__(self, workdir: Path, env: Mapping[str, str], *, metrics: bool = False) -> None:
        """``metrics``: each daemon serves /metrics on a free port (off otherwise)."""
        self.workdir = workdir
        self.env = dict(env)
        self.metrics = metrics
        self.daemons: dict[str, Daemon] = {}

    def addr(self, name: str) -> str:
        return self.daemons[name].addr

    def _spawn(self, name: str, extra: Mapping[str, str]) -> Daemon:
        addr = f"127.0.0.1:{free_port()}"
        metrics_addr = f"127.0.0.1:{free_port()}" if self.metrics else None
        env = {
            **self.env,
            **extra,
            "HAMI_ACCOUNTING_LISTEN_ADDR": addr,
            "HAMI_ACCOUNTING_METRICS_ADDR": metrics_addr or "off",
        }
        log = self.workdir / f"{name}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                [PYTHON, "-m", "services.cli", "serve", name],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        daemon = Daemon(name, addr, process, log, metrics_addr)
        self.daemons[name] = daemon
        return daemon

    def _wait_serving(self, daemon: Daemon) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        last = "no answer"
        while time.monotonic() < deadline:
            code = daemon.process.poll()
            if code is not None:
                raise StackError(f"{daemon.name} exited with {code}:\n{log_tail(daemon.log)}")
            try:
                last = check_health(daemon.addr, SERVICE_NAMES[daemon.name], timeout_s=0.5)
                if last == "SERVING":
                    return
            except grpc.RpcError as error:
                last = error.code().name if hasattr(error, "code") else str(error)
            time.sleep(0.05)
        raise StackError(
            f"{daemon.name} not SERVING on {daemon.addr} after {START_TIMEOUT_S} s "
            f"(last: {last}):\n{log_tail(daemon.log)}"
        )

    def start(self) -> Stack:
        self.workdir.mkdir(parents=True, exist_ok=True)
        # The admission and scheduler daemons only dial the recorder per call, so all three
        # can start at once; the recorder's address is fixed before any of them runs.
        usage = self._spawn("usage", {"HAMI_ACCOUNTING_DATA_DIR": str(self.workdir / "data")})
        others = [
            self._spawn(name, {"HAMI_ACCOUNTING_USAGE_ADDR": usage.addr})
            for name in ("admission", "scheduler")
        ]
        try:
            for daemon in (usage, *others):
                self._wait_serving(daemon)
        except BaseException:
            self.kill()
            raise
        return self

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> dict[str, int]:
        """Signals every daemon (recorder last) and waits; returns their exit codes."""
        order = [
            d
            for name in ("scheduler", "admission", "usage")
            if (d := self.daemons.get(name)) is not None
        ]
        for daemon in order:
            if daemon.process.poll() is None:
                daemon.process.send_signal(sig)
        codes = {}
        for daemon in order:
            try:
                codes[daemon.name] = daemon.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                daemon.process.kill()
                daemon.process.wait()
                raise StackError(
                    f"{daemon.name} ignored {sig.name} for {STOP_TIMEOUT_S} s:\n"
                    f"{log_tail(daemon.log)}"
                ) from None
        return codes

    def kill(self) -> None:
        for daemon in self.daemons.values():
            if daemon.process.poll() is None:
                daemon.process.kill()
                daemon.process.wait()

    def logs(self) -> str:
        return "\n".join(f"--- {d.name} ---\n{log_tail(d.log)}" for d in self.daemons.values())


@dataclass
class Stubs:
    """A client of each daemon of a stack."""

    usage: usage_pb2_grpc.UsageRecorderStub
    admission: admission_pb2_grpc.AdmissionStub
    scheduler: scheduler_pb2_grpc.SchedulerStub
    channels: list[grpc.Channel]

    @classmethod
    def dial(cls, stack: Stack) -> Stubs:
        channels = [
            grpc.insecure_channel(stack.addr(n)) for n in ("usage", "admission", "scheduler")
        ]
        return cls(
            usage_pb2_grpc.UsageRecorderStub(channels[0]),
            admission_pb2_grpc.AdmissionStub(channels[1]),
            scheduler_pb2_grpc.SchedulerStub(channels[2]),
            channels,
        )

    def close(self) -> None:
        for channel in self.channels:
            channel.close()


# -- drawing a trace ---------------------------------------------------------------------------

_SHOWN_ATTRIBUTES = ("decision", "reason", "node", "effective.memory_mib", "stored.memory_mib")


def span_tree(spans: Iterable[ReceivedSpan], trace_id: str) -> str:
    """The spans of one trace as an indented tree (service, kind, name, a few attributes);
    spans whose parent is not in the trace are drawn as roots, marked with their parent id."""
    in_trace = sorted((s for s in spans if s.trace_id == trace_id), key=lambda s: s.start_ns)
    ids = {s.span_id for s in in_trace}
    children: dict[str, list[ReceivedSpan]] = {}
    for span in in_trace:
        children.setdefault(span.parent_span_id if span.parent_span_id in ids else "", []).append(
            span
        )
    lines = [f"trace {trace_id}"]

    def draw(span: ReceivedSpan, depth: int) -> None:
        shown = ", ".join(
            f"{key}={span.attributes['hami.accounting.' + key]}"
            for key in _SHOWN_ATTRIBUTES
            if "hami.accounting." + key in span.attributes
        )
        orphan = (
            f" (parent {span.parent_span_id} not exported)"
            if span.parent_span_id and span.parent_span_id not in ids
            else ""
        )
        links = " +link" if span.links else ""
        lines.append(
            f"{'  ' * depth}{span.name} [{span.service.removeprefix('hami-accounting-')}"
            f" {span.kind}]{links}{orphan}" + (f"  {shown}" if shown else "")
        )
        for child in children.get(span.span_id, []):
            draw(child, depth + 1)

    for root in children.get("", []):
        draw(root, 1)
    return "\n".join(lines)
