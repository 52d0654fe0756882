"""The quota check as a Kubernetes validating admission webhook (AdmissionReview over HTTPS).

Layer: services/admission (adapter). ``POST /validate`` takes an ``AdmissionReview``
(``admission.k8s.io/v1`` or ``v1beta1``) and answers in the version it received, with both
``apiVersion`` and ``kind`` set and ``response.uid`` echoing ``request.uid``. The check is the
gRPC one (``QuotaChecker``), so both front ends decide alike:

* a pod CREATE carrying an annotation only the scheduler writes (``hami.io/vgpu-node``, any
  vendor's ``-devices-allocated``, ...): ``allowed: false``, code 403, reason
  ``SchedulerOwnedAnnotation``, naming the annotation, before anything else;
* a pod CREATE within quota: ``allowed: true``;
* over quota: ``allowed: false`` with ``status {code: 403, message: <the sentence with the
  numbers>, reason: <MemoryQuotaExceeded|CoreQuotaExceeded|GpuCountQuotaExceeded>}``;
* a pod UPDATE that adds, rewrites or drops a scheduler-owned annotation, from a caller
  (``request.userInfo.username``) that is not one of the configured writers: code 403,
  ``SchedulerOwnedAnnotation``; any other pod UPDATE: ``allowed: true``, no quota check;
* anything else (not a pod, a subresource, another operation): ``allowed: true`` unchanged;
* a malformed pod inside a well-formed review: ``allowed: false``, code 400, naming the field;
* the recorder unreachable: ``allowed: false``, code 503 — the webhook never allows silently;
  the API server's failurePolicy decides only when the endpoint itself cannot be reached;
* a malformed review (not JSON, wrong apiVersion/kind, no ``request.uid``): HTTP 400 with a
  JSON ``{"error": ...}`` body; a body over 1 MiB: HTTP 413.

Pods naming another scheduler: HAMi's webhook skips them (no quota check at all). We check every
pod that asks for a GPU whatever its ``schedulerName``: GPU quota is the namespace's, and a pod
sent to another scheduler still holds devices once it runs. Pods that ask for none pass without
a recorder call.

What each review is answered is decided in services/admission/admission_review.py; this module
is the HTTPS endpoint around it. The server is the standard library's threaded ``http.server``
with TLS done per connection in the connection's thread (a slow handshake never blocks
accepting). The certificate and key are re-read when their files change, so a rotated Secret
needs no restart.

Slow and idle clients are bounded (``ConnectionLimits``): the TLS handshake and the whole first
request (headers and body) must arrive within ``request_timeout_s`` of the connection, each
later request within ``request_timeout_s`` of its first byte, and a kept-alive connection may
wait at most ``idle_timeout_s`` for its next request; past a deadline the connection is closed
(services/admission/deadlines.py), however slowly it trickles bytes. At most
``max_connections`` are open at once, one thread each; a connection beyond that is closed at
once, and the refusals are logged.
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
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

from accounting import errors, numbers, owned_annotations, quoting
from services.admission.admission_review import ReviewError, denied, parse_review, review_response
from services.admission.deadlines import ConnectionDeadlines
from services.admission.servicer import QuotaChecker
from services.common.config import parse_host_port, tls_pair_problem

_LOG = logging.getLogger(__name__)

VALIDATE_PATH = "/validate"
HEALTH_PATH = "/healthz"
MAX_BODY_BYTES = 1024 * 1024
"""The largest AdmissionReview accepted (the API server's own request limit is 3 MiB; a pod
spec anywhere near 1 MiB is not something this check needs to read)."""
_DISCARD_LIMIT_BYTES = 8 * 1024 * 1024
_REFUSAL_LOG_INTERVAL_S = 10.0


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How long and how many connections the endpoint serves."""

    max_connections: int = 128
    """Connections open at once (one thread each); more are closed as they arrive."""
    request_timeout_s: float = 10.0
    """TLS handshake plus a whole request (headers and body), and each later request from its
    first byte: the API server's own webhook timeout is at most 30 s, 10 s by default."""
    idle_timeout_s: float = 30.0
    """How long a kept-alive connection may wait for its next request."""

class WebhookStartError(RuntimeError):
    """The endpoint cannot start: bad address, port in use, or unreadable certificate."""


class _CertificateFiles:
    """A server TLS context re-made when the certificate or key file changes."""

    def __init__(self, cert_file: Path, key_file: Path) -> None:
        self._cert_file = cert_file
        self._key_file = key_file
        self._lock = threading.Lock()
        self._stamp = self._read_stamp()
        self._context = self._load()

    def _read_stamp(self) -> tuple[tuple[int, int], ...]:
        return tuple(
            (os.stat(path).st_mtime_ns, os.stat(path).st_size)
            for path in (self._cert_file, self._key_file)
        )

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self._cert_file, self._key_file)
        return context

    def context(self) -> ssl.SSLContext:
        with self._lock:
            try:
                stamp = self._read_stamp()
                if stamp != self._stamp:
                    self._context = self._load()
                    self._stamp = stamp
                    _LOG.info("reloaded the webhook serving certificate",
                              extra={"cert_file": str(self._cert_file)})
            except (OSError, ssl.SSLError) as error:
                # A Secret update writes the files one after the other; keep serving with the
                # old pair and try again on the next connection.
                _LOG.warning("cannot reload the webhook certificate yet: %s", error)
            return self._context


class _Handler(BaseHTTPRequestHandler):
    server: _WebhookServer
    protocol_version = "HTTP/1.1"
    server_version = "hami-accounting-admission"
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

    def log_message(self, format: str, *args: Any) -> None:  # the base class's signature
        _LOG.debug("webhook: " + format, *args)

    def _send_json(self, status: int, body: Mapping[str, Any], *, close: bool = False) -> None:
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
        self._send_json(status, {"error": bounded, "code": int(status)}, close=close)

    def _discard(self, length: int) -> None:
        while length > 0:
            chunk = self.rfile.read(min(length, 64 * 1024))
            if not chunk:
                return
            length -= len(chunk)

    def do_GET(self) -> None:
        if self.path == HEALTH_PATH:
            self._send_json(HTTPStatus.OK, {"status": "ok"})
        elif self.path == VALIDATE_PATH:
            self._error(HTTPStatus.METHOD_NOT_ALLOWED, f"use POST on {VALIDATE_PATH}")
        else:
            self._error(HTTPStatus.NOT_FOUND, f"no such path; POST AdmissionReviews to "
                                              f"{VALIDATE_PATH}")

    def do_POST(self) -> None:
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
        if length > MAX_BODY_BYTES:
            # Read (and drop) a moderately oversized body so the client gets the answer instead
            # of a reset connection; anything larger is cut off by closing.
            self._discard(min(length, _DISCARD_LIMIT_BYTES))
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                        f"body of {length} bytes exceeds the limit of {MAX_BODY_BYTES} bytes",
                        close=True)
            return
        # Always read the body first: an unread body would reset the connection under the answer.
        body = self.rfile.read(length)
        if self.path.split("?", 1)[0] != VALIDATE_PATH:
            self._error(HTTPStatus.NOT_FOUND, f"no such path; POST AdmissionReviews to "
                                              f"{VALIDATE_PATH}")
            return
        try:
            review = parse_review(body)
        except ReviewError as error:
            self._error(HTTPStatus.BAD_REQUEST, f"malformed AdmissionReview: {error}")
            return
        try:
            answer = review_response(
                review, self.server.checker, self.server.annotation_writers
            )
        except Exception:
            # A bug: deny (never allow silently) and keep the request content out of the answer.
            _LOG.exception("unhandled error in the AdmissionReview endpoint")
            answer = denied(review, 500, "InternalError", "internal error in the GPU quota check")
        self._send_json(HTTPStatus.OK, answer)


class _WebhookServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    # Connections the kernel queues while the accept loop hands one over; more get a reset.
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        checker: QuotaChecker,
        certificates: _CertificateFiles,
        limits: ConnectionLimits,
        annotation_writers: Collection[str],
    ) -> None:
        self.checker = checker
        self.annotation_writers = frozenset(annotation_writers)
        self.certificates = certificates
        self.limits = limits
        self.deadlines = ConnectionDeadlines()
        self._slots = threading.BoundedSemaphore(limits.max_connections)
        self.refused = 0
        """Connections closed on arrival because max_connections were open (for tests)."""
        self._refusals = 0
        self._refusals_logged_at = float("-inf")
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

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
                "webhook connection limit reached: closed %d new connections (%d open at most)",
                self._refusals, self.limits.max_connections,
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
        _LOG.debug("webhook connection from %s ended with an error", client_address,
                   exc_info=True)

    def finish_request(self, request: Any, client_address: Any) -> None:
        # Runs in the connection's own thread: the handshake cannot stall the accept loop.
        # Each read also times out on its own (a backstop; the deadlines are what bound it).
        request.settimeout(self.limits.idle_timeout_s)
        # Headers and body leave in two writes; without this, Nagle's algorithm holds the body
        # until the client's delayed ACK, a stall on every answer of a kept-alive connection.
        with contextlib.suppress(OSError):
            request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            tls = self.certificates.context().wrap_socket(
                request, server_side=True, do_handshake_on_connect=False
            )
        except (ssl.SSLError, OSError) as error:
            _LOG.debug("webhook TLS setup failed from %s: %s", client_address, error)
            return
        try:
            # One deadline for the handshake and the whole first request.
            self.deadlines.set(tls, self.limits.request_timeout_s)
            tls.do_handshake()
            _Handler(tls, client_address, self)
        except (ssl.SSLError, OSError) as error:
            _LOG.debug("webhook connection from %s ended: %s", client_address, error)
        finally:
            self.deadlines.clear(tls)
            with contextlib.suppress(OSError):
                tls.close()


class WebhookServer:
    """A started AdmissionReview endpoint; ``stop`` ends it (idempotent)."""

    def __init__(
        self,
        addr: str,
        cert_file: Path,
        key_file: Path,
        checker: QuotaChecker,
        limits: ConnectionLimits = ConnectionLimits(),
        annotation_writers: Collection[str] = owned_annotations.DEFAULT_ANNOTATION_WRITERS,
    ) -> None:
        try:
            host, port = parse_host_port(addr)
        except ValueError as error:
            raise WebhookStartError(f"webhook address {error}") from None
        problem = tls_pair_problem(cert_file, key_file)
        if problem is not None:
            raise WebhookStartError(f"webhook certificate: {problem}")
        try:
            certificates = _CertificateFiles(cert_file, key_file)
        except (OSError, ssl.SSLError) as error:
            raise WebhookStartError(
                f"cannot load the webhook certificate {cert_file} / key {key_file}: {error}"
            ) from None
        try:
            self._server = _WebhookServer(
                (host, port), checker, certificates, limits, annotation_writers
            )
        except OSError as error:
            raise WebhookStartError(
                f"cannot listen on {addr} for the webhook: {error.strerror or error}"
            ) from None
        self.addr = addr
        self.port: int = self._server.server_address[1]
        """The bound port (the real one when addr asked for port 0)."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
            name="admission-webhook", daemon=True,
        )
        self._stopped = threading.Event()
        self._thread.start()
        _LOG.info("AdmissionReview endpoint listening",
                  extra={"webhook_addr": addr, "port": self.port, "path": VALIDATE_PATH,
                         "max_connections": limits.max_connections,
                         "request_timeout_s": limits.request_timeout_s,
                         "idle_timeout_s": limits.idle_timeout_s})

    @property
    def refused_connections(self) -> int:
        """Connections closed on arrival because ``max_connections`` were open."""
        return self._server.refused

    @property
    def expired_connections(self) -> int:
        """Connections closed because they overran a deadline."""
        return self._server.deadlines.expired

    @property
    def url(self) -> str:
        """``https://127.0.0.1:<port>/validate`` for a local client."""
        host, _ = parse_host_port(self.addr)
        if host in ("", "0.0.0.0", "::"):
            host = "127.0.0.1"
        elif ":" in host:
            host = f"[{host}]"
        return f"https://{host}:{self.port}{VALIDATE_PATH}"

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)
