"""A bounded JSON-over-HTTP endpoint, over TLS or plain: the server under the AdmissionReview
webhook and the kube-scheduler extender.

Layer: services/common (runtime). Each endpoint is a few ``POST`` paths, each answered by a
function from the request body to an HTTP status and a JSON document (``Route``); what the
answer says is the caller's (services/admission/webhook.py, services/scheduler/extender.py).
This module only carries bytes, within bounds:

* the body must have a ``Content-Length`` (HTTP's ``1*DIGIT``), at most ``max_body_bytes``; a
  moderately larger one is read and dropped so the client gets its ``413`` rather than a reset
  connection, anything larger is cut off by closing;
* ``GET /healthz`` answers ``{"status": "ok"}``; a ``GET`` on a route is ``405``, any other path
  ``404``, each with a JSON error naming the paths served;
* a route that raises is a bug: ``500`` with a generic error, the content of the request kept
  out of the answer and the traceback in the log.

The server is the standard library's threaded ``http.server``. With TLS the handshake runs in the
connection's own thread (a slow handshake never blocks accepting), the certificate and key (and
the client CA, for mutual TLS) are re-read when their files change, so a rotated Secret needs
no restart. Slow and idle clients are bounded (``ConnectionLimits``): the TLS handshake and the
whole first request (headers and body) must arrive within ``request_timeout_s`` of the
connection, each later request within ``request_timeout_s`` of its first byte, and a kept-alive
connection may wait at most ``idle_timeout_s`` for its next request; past a deadline the
connection is closed (services.common.connection_deadlines), however slowly it trickles bytes.
At most ``max_connections`` are open at once, one thread each; a connection beyond that is
closed at once, and the refusals are logged.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

from accounting import errors, numbers, quoting
from services.common.config import parse_host_port, tls_pair_problem
from services.common.connection_deadlines import ConnectionDeadlines

_LOG = logging.getLogger(__name__)

HEALTH_PATH = "/healthz"
_DISCARD_FLOOR_BYTES = 8 * 1024 * 1024
"""An oversized body up to the larger of this and twice the endpoint's limit is read and
dropped before the 413, so the client reads the answer rather than a reset connection."""
_REFUSAL_LOG_INTERVAL_S = 10.0

Json = Mapping[str, Any]
Answer = tuple[int, Json]
"""An HTTP status and the JSON document answered with it."""
Route = Callable[[bytes], Answer]
"""Answers one POST path: the request body in, the status and JSON document out."""
ErrorBody = Callable[[HTTPStatus, str], Json]
"""The JSON document of an error the endpoint itself answers (a bad path, method or body)."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How long and how many connections the endpoint serves."""

    max_connections: int = 128
    """Connections open at once (one thread each); more are closed as they arrive."""
    request_timeout_s: float = 10.0
    """TLS handshake plus a whole request (headers and body), and each later request from its
    first byte."""
    idle_timeout_s: float = 30.0
    """How long a kept-alive connection may wait for its next request."""


DEFAULT_LIMITS = ConnectionLimits()


@dataclass(frozen=True, slots=True)
class ServingTls:
    """The endpoint's certificate, its key, and for mutual TLS the CA its clients' certificates
    must chain to."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """What an endpoint serves and how it names itself."""

    name: str
    """Used in log lines, error messages and the thread's name, e.g. ``webhook``."""
    routes: Mapping[str, Route]
    """POST paths and what answers them."""
    max_body_bytes: int
    error_body: ErrorBody
    server_version: str
    """The ``Server`` header, e.g. ``hami-accounting-admission``."""


class EndpointStartError(RuntimeError):
    """The endpoint cannot start: bad address, port in use, or unreadable certificate."""


def default_error_body(status: HTTPStatus, message: str) -> Json:
    """``{"error": <message>, "code": <status>}``."""
    return {"error": message, "code": int(status)}


class _CertificateFiles:
    """A server TLS context re-made when the certificate, key or client CA file changes."""

    def __init__(self, tls: ServingTls, name: str) -> None:
        self._tls = tls
        self._name = name
        self._lock = threading.Lock()
        self._stamp = self._read_stamp()
        self._context = self._load()

    def _files(self) -> tuple[Path, ...]:
        tls = self._tls
        return (tls.cert_file, tls.key_file) + (
            (tls.client_ca_file,) if tls.client_ca_file else ()
        )

    def _read_stamp(self) -> tuple[tuple[int, int], ...]:
        return tuple(
            (os.stat(path).st_mtime_ns, os.stat(path).st_size) for path in self._files()
        )

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self._tls.cert_file, self._tls.key_file)
        if self._tls.client_ca_file is not None:
            context.load_verify_locations(cafile=self._tls.client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def context(self) -> ssl.SSLContext:
        with self._lock:
            try:
                stamp = self._read_stamp()
                if stamp != self._stamp:
                    self._context = self._load()
                    self._stamp = stamp
                    _LOG.info("reloaded the %s serving certificate", self._name,
                              extra={"cert_file": str(self._tls.cert_file)})
            except (OSError, ssl.SSLError) as error:
                # A Secret update writes the files one after the other; keep serving with the
                # old pair and try again on the next connection.
                _LOG.warning("cannot reload the %s certificate yet: %s", self._name, error)
            return self._context


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    sys_version = ""

    def handle(self) -> None:
        # The first request's deadline was set before the handshake; a later one waits for its
        # first byte under the idle deadline, then must arrive whole under the request deadline.
        limits, deadlines = self.server.limits, self.server.deadlines
        self.handle_one_request()
        while not self.close_connection:
            deadlines.set(self.connection, limits.idle_timeout_s)
            try:
                # rfile is the socket's io.BufferedReader (StreamRequestHandler's rbufsize -1).
                if not cast(io.BufferedReader, self.rfile).peek(1):
                    return  # the client closed, or stayed idle past its deadline
            except (OSError, ValueError):
                return
            deadlines.set(self.connection, limits.request_timeout_s)
            self.handle_one_request()

    def version_string(self) -> str:
        return self.server.spec.server_version

    def log_message(self, format: str, *args: Any) -> None:  # the base class's signature
        _LOG.debug(self.server.spec.name + ": " + format, *args)

    def _send_json(self, status: int, body: Json, *, close: bool = False) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: HTTPStatus, message: str, *, close: bool = False) -> None:
        bounded = errors.bounded_text(message, errors.MAX_MESSAGE_CHARS)
        self._send_json(status, self.server.spec.error_body(status, bounded), close=close)

    def _no_such_path(self) -> None:
        paths = ", ".join(sorted(self.server.spec.routes))
        self._error(HTTPStatus.NOT_FOUND, f"no such path; POST to {paths}")

    def _discard(self, length: int) -> None:
        while length > 0:
            chunk = self.rfile.read(min(length, 64 * 1024))
            if not chunk:
                return
            length -= len(chunk)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == HEALTH_PATH:
            self._send_json(HTTPStatus.OK, {"status": "ok"})
        elif path in self.server.spec.routes:
            self._error(HTTPStatus.METHOD_NOT_ALLOWED, f"use POST on {path}")
        else:
            self._no_such_path()

    def do_POST(self) -> None:
        spec = self.server.spec
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            self._error(HTTPStatus.LENGTH_REQUIRED, "Content-Length is required", close=True)
            return
        # HTTP's Content-Length is 1*DIGIT: no sign, no spaces, no other script's digits.
        length = (
            None if length_text.startswith(("+", "-")) else numbers.decimal_integer(length_text)
        )
        if length is None or length < 0:
            self._error(HTTPStatus.BAD_REQUEST,
                        f"invalid Content-Length {quoting.quote(length_text)}", close=True)
            return
        if length > spec.max_body_bytes:
            # Read (and drop) a moderately oversized body so the client gets the answer instead
            # of a reset connection; anything larger is cut off by closing.
            self._discard(min(length, max(_DISCARD_FLOOR_BYTES, 2 * spec.max_body_bytes)))
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                        f"body of {length} bytes exceeds the limit of {spec.max_body_bytes} "
                        "bytes", close=True)
            return
        # Always read the body first: an unread body would reset the connection under the answer.
        body = self.rfile.read(length)
        route = spec.routes.get(self.path.split("?", 1)[0])
        if route is None:
            self._no_such_path()
            return
        try:
            status, answer = route(body)
        except Exception:
            # A bug: keep the request content out of the answer; the log has the traceback.
            _LOG.exception("unhandled error in the %s endpoint", spec.name)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error in the {spec.name}")
            return
        self._send_json(status, answer)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    # Connections the kernel queues while the accept loop hands one over; more get a reset.
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        spec: EndpointSpec,
        certificates: _CertificateFiles | None,
        limits: ConnectionLimits,
    ) -> None:
        self.spec = spec
        self.certificates = certificates
        self.limits = limits
        self.deadlines = ConnectionDeadlines(f"{spec.name}-deadlines")
        self._slots = threading.BoundedSemaphore(limits.max_connections)
        self.refused = 0
        """Connections closed on arrival because max_connections were open (for tests)."""
        self._refusals = 0
        self._refusals_logged_at = float("-inf")
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        try:
            super().__init__(address, _Handler)
        except BaseException:
            self.deadlines.close()
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        # In the accept loop: a connection beyond the cap is closed at once, so a flood of
        # slow clients costs at most max_connections threads.
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            self._refused(client_address)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def _refused(self, client_address: Any) -> None:
        self.refused += 1
        self._refusals += 1
        now = time.monotonic()
        if now - self._refusals_logged_at >= _REFUSAL_LOG_INTERVAL_S:
            _LOG.warning(
                "%s connection limit reached: closed %d new connections (%d open at most)",
                self.spec.name, self._refusals, self.limits.max_connections,
                extra={"refused": self._refusals, "max_connections": self.limits.max_connections,
                       "client": str(client_address[0])},
            )
            self._refusals_logged_at = now
            self._refusals = 0

    def server_close(self) -> None:
        super().server_close()
        self.deadlines.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away mid-request is routine; the default prints to stderr.
        _LOG.debug("%s connection from %s ended with an error", self.spec.name, client_address,
                   exc_info=True)

    def finish_request(self, request: Any, client_address: Any) -> None:
        # Runs in the connection's own thread: the handshake cannot stall the accept loop.
        # Each read also times out on its own (a backstop; the deadlines are what bound it).
        request.settimeout(self.limits.idle_timeout_s)
        # Headers and body leave in two writes; without this, Nagle's algorithm holds the body
        # until the client's delayed ACK, a stall on every answer of a kept-alive connection.
        with contextlib.suppress(OSError):
            request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = request
        try:
            if self.certificates is not None:
                connection = self.certificates.context().wrap_socket(
                    request, server_side=True, do_handshake_on_connect=False
                )
        except (ssl.SSLError, OSError) as error:
            _LOG.debug("%s TLS setup failed from %s: %s", self.spec.name, client_address, error)
            return
        try:
            # One deadline for the handshake and the whole first request.
            self.deadlines.set(connection, self.limits.request_timeout_s)
            if isinstance(connection, ssl.SSLSocket):
                connection.do_handshake()
            _Handler(connection, client_address, self)
        except (ssl.SSLError, OSError) as error:
            _LOG.debug("%s connection from %s ended: %s", self.spec.name, client_address, error)
        finally:
            self.deadlines.clear(connection)
            if connection is not request:
                with contextlib.suppress(OSError):
                    connection.close()


class JsonEndpoint:
    """A started endpoint; ``stop`` ends it (idempotent)."""

    def __init__(
        self,
        addr: str,
        spec: EndpointSpec,
        *,
        tls: ServingTls | None,
        limits: ConnectionLimits = DEFAULT_LIMITS,
    ) -> None:
        """Binds ``addr`` and starts serving in a daemon thread; ``tls`` None serves plain HTTP.

        Raises:
            EndpointStartError: the address is malformed or busy, or the certificate, key or
                client CA cannot be used; the message names which.
        """
        try:
            host, port = parse_host_port(addr)
        except ValueError as error:
            raise EndpointStartError(f"{spec.name} address {error}") from None
        certificates: _CertificateFiles | None = None
        if tls is not None:
            problem = tls_pair_problem(tls.cert_file, tls.key_file, tls.client_ca_file)
            if problem is not None:
                raise EndpointStartError(f"{spec.name} certificate: {problem}")
            try:
                certificates = _CertificateFiles(tls, spec.name)
            except (OSError, ssl.SSLError) as error:
                raise EndpointStartError(
                    f"cannot load the {spec.name} certificate {tls.cert_file} / key "
                    f"{tls.key_file}: {error}"
                ) from None
        try:
            self._server = _Server((host, port), spec, certificates, limits)
        except OSError as error:
            raise EndpointStartError(
                f"cannot listen on {addr} for the {spec.name}: {error.strerror or error}"
            ) from None
        self.addr = addr
        self.scheme = "https" if tls is not None else "http"
        self.port: int = self._server.server_address[1]
        """The bound port (the real one when addr asked for port 0)."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
            name=spec.name, daemon=True,
        )
        self._stopped = threading.Event()
        self._thread.start()

    @property
    def refused_connections(self) -> int:
        """Connections closed on arrival because ``max_connections`` were open."""
        return self._server.refused

    @property
    def expired_connections(self) -> int:
        """Connections closed because they overran a deadline."""
        return self._server.deadlines.expired

    def url(self, path: str) -> str:
        """``<scheme>://127.0.0.1:<port><path>`` for a local client."""
        host, _ = parse_host_port(self.addr)
        if host in ("", "0.0.0.0", "::"):
            host = "127.0.0.1"
        elif ":" in host:
            host = f"[{host}]"
        return f"{self.scheme}://{host}:{self.port}{path}"

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)
