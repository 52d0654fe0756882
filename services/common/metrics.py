"""Prometheus metrics every daemon serves, and the endpoint that serves them.

Layer: services (runtime). The metric objects are module-level singletons in the default
registry, created once at import: prometheus_client refuses to register a name twice, and tests
run several daemons in one process. Every series carries the ``service`` label that tells those
daemons apart. The recorder's own families (ledger totals, journal writes) live in
``services.usage.metrics``, so that only the recorder's process serves them.

The endpoint serves the default registry through prometheus_client's own WSGI app (format
negotiation included), followed by what a daemon writes at scrape time itself
(``set_scrape_text``: the recorder's per-device families, too many series for
prometheus_client's exposition, see ``services.usage.exposition``).
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import socket
import socketserver
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import prometheus_client
from prometheus_client.exposition import gzip_accepted

from accounting.policy import AccountingPolicy
from services.common.config import parse_host_port

# Sub-millisecond floor: a Python-to-Python unary call on loopback takes less than a
# millisecond (the no-op RPC of docs/benchmarks.md).
_RPC_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

RPC_DURATION = prometheus_client.Histogram(
    "hami_accounting_rpc_duration_seconds",
    "Time spent serving one gRPC call, by daemon, full method name and status code.",
    ["service", "method", "code"],
    buckets=_RPC_BUCKETS_S,
)
DECISIONS = prometheus_client.Counter(
    "hami_accounting_decisions",
    "Accounting decisions (quota allow/deny, fit/no-fit, reserve, shrink...) with their reason.",
    ["service", "decision", "reason"],
)
POLICY_INFO = prometheus_client.Gauge(
    "hami_accounting_policy_info",
    "The accounting policy a daemon answers under: 1 for the one in force, by its id (equal ids "
    "in every daemon mean equal rules).",
    ["service", "policy_id", "enforce_gpu_count"],
)
POLICY_MEMORY_FACTOR = prometheus_client.Gauge(
    "hami_accounting_policy_memory_factor",
    "The memory factor of each vendor in the accounting policy a daemon answers under.",
    ["service", "vendor"],
)

CACHE_SYNCED = prometheus_client.Gauge(
    "hami_accounting_cache_synced",
    "1 while the daemon's copy of the recorder's state is complete: the admission and "
    "scheduler daemons' WatchUsage caches (no series with the cache off), the recorder's sync "
    "with Kubernetes (always 1 without a Kubernetes source); 0 otherwise.",
    ["service"],
)

_policy_lock = threading.Lock()
_published_policies: dict[str, AccountingPolicy] = {}


class MetricsError(RuntimeError):
    """The metrics endpoint cannot be started (bad address or port in use)."""


def record_decision(service: str, decision: str, reason: str) -> None:
    """Counts one decision, e.g. ``("admission", "deny", "MEMORY_QUOTA_EXCEEDED")``."""
    _decision_series(service, decision, reason).inc()


def observe_rpc_duration(service: str, method: str, code: str, seconds: float) -> None:
    """Records the duration of one served call, e.g. ``("admission",
    "/hami.accounting.v1.Admission/CheckQuota", "OK", 0.0004)``."""
    _rpc_duration_series(service, method, code).observe(seconds)


# Each series is looked up once: ``labels()`` checks the label names and takes the metric's lock
# on every call, and these two run on every call of every daemon. The label values come from a
# closed set (daemons, registered methods, status codes, decision reasons), so the caches stay
# as small as the metrics themselves; no series of these two metrics is ever removed.
@functools.cache
def _decision_series(service: str, decision: str, reason: str) -> prometheus_client.Counter:
    return DECISIONS.labels(service=service, decision=decision, reason=reason)


@functools.cache
def _rpc_duration_series(service: str, method: str, code: str) -> prometheus_client.Histogram:
    return RPC_DURATION.labels(service=service, method=method, code=code)


def publish_policy(service: str, policy: AccountingPolicy) -> None:
    """Shows ``policy`` as the one ``service`` answers under, replacing the one it showed."""
    with _policy_lock:
        previous = _published_policies.get(service)
        if previous is not None:
            with contextlib.suppress(KeyError):
                POLICY_INFO.remove(service, previous.policy_id, _flag(previous.enforce_gpu_count))
            for vendor in previous.vendors:
                with contextlib.suppress(KeyError):
                    POLICY_MEMORY_FACTOR.remove(service, vendor.vendor)
        _published_policies[service] = policy
        POLICY_INFO.labels(service, policy.policy_id, _flag(policy.enforce_gpu_count)).set(1)
        for vendor in policy.vendors:
            POLICY_MEMORY_FACTOR.labels(service, vendor.vendor).set(vendor.memory_factor)


def bind_cache_synced(service: str, synced: Callable[[], bool]) -> None:
    """Reads ``service``'s cache-synced gauge from ``synced`` at every scrape."""
    CACHE_SYNCED.labels(service=service).set_function(lambda: 1.0 if synced() else 0.0)


def _flag(value: bool) -> str:
    return "true" if value else "false"


ScrapeText = Callable[[], str]
"""Writes text-format lines of gauge families at scrape time."""

_scrape_text: ScrapeText | None = None
_OPENMETRICS_EOF = b"# EOF\n"
_GZIP_LEVEL = 1
"""The recorder's /metrics runs to tens of MB at 5,000 nodes: level 1 compresses it in a
fraction of the time of gzip's default 9, for a few more bytes (docs/observability.md)."""


def set_scrape_text(source: ScrapeText | None) -> None:
    """Appends ``source()`` to every scrape of this process's /metrics (None: nothing)."""
    global _scrape_text
    _scrape_text = source


def scrape_text() -> ScrapeText | None:
    """The source ``set_scrape_text`` installed, or None."""
    return _scrape_text


def _with_scrape_text(inner: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        source = _scrape_text
        if source is None or environ.get("REQUEST_METHOD") != "GET" or (
            environ.get("PATH_INFO") == "/favicon.ico"
        ):
            return inner(environ, start_response)
        answer: list[Any] = []

        def keep(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
            answer[:] = [status, headers]

        # Uncompressed here: the written text is added before compressing the whole.
        body = b"".join(inner({**environ, "HTTP_ACCEPT_ENCODING": ""}, keep))
        status, headers = answer
        extra = source().encode()
        content_type = dict(headers).get("Content-Type", "")
        if content_type.startswith("application/openmetrics-text") and body.endswith(
            _OPENMETRICS_EOF
        ):
            body = body[: -len(_OPENMETRICS_EOF)] + extra + _OPENMETRICS_EOF
        else:
            body += extra
        headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            body = gzip.compress(body, compresslevel=_GZIP_LEVEL)
            headers.append(("Content-Encoding", "gzip"))
        start_response(status, headers)
        return [body]

    return app


class _SilentHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # the base's name
        """One line per scrape on stderr would drown the JSON logs."""


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


def start_metrics_server(addr: str | None) -> int | None:
    """Serves /metrics on ``host:port`` in a daemon thread; returns the bound port.

    None does nothing and returns None. Port 0 picks a free port (tests).
    """
    if addr is None:
        return None
    try:
        host, port = parse_host_port(addr)
    except ValueError as error:
        raise MetricsError(f"metrics address {error}") from None
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except OSError as error:
        raise MetricsError(f"cannot serve metrics on {addr}: {error.strerror or error}") from None

    class Server(_ThreadingServer):
        address_family = family

    app = _with_scrape_text(prometheus_client.make_wsgi_app(prometheus_client.REGISTRY))
    try:
        http_server = make_server(host, port, app, Server, handler_class=_SilentHandler)
    except OSError as error:
        raise MetricsError(f"cannot serve metrics on {addr}: {error.strerror or error}") from None
    threading.Thread(target=http_server.serve_forever, name="metrics", daemon=True).start()
    return int(http_server.server_port)
