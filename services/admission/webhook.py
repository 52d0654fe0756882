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
is the HTTPS endpoint around it. The server (HTTPS only: the API server calls webhooks over
TLS), its bounds on slow and idle clients and on connections, and its certificate reload are
services.common.json_endpoint's; the default request deadline of 10 s is the API server's own
default webhook timeout (at most 30 s).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from http import HTTPStatus
from pathlib import Path

from accounting import owned_annotations
from services.admission.admission_review import ReviewError, denied, parse_review, review_response
from services.admission.servicer import QuotaChecker
from services.common.json_endpoint import (
    DEFAULT_LIMITS,
    Answer,
    ConnectionLimits,
    EndpointSpec,
    EndpointStartError,
    JsonEndpoint,
    Route,
    ServingTls,
    default_error_body,
)

__all__ = ["MAX_BODY_BYTES", "VALIDATE_PATH", "ConnectionLimits", "WebhookServer",
           "WebhookStartError"]

_LOG = logging.getLogger(__name__)

VALIDATE_PATH = "/validate"
MAX_BODY_BYTES = 1024 * 1024
"""The largest AdmissionReview accepted (the API server's own request limit is 3 MiB; a pod
spec anywhere near 1 MiB is not something this check needs to read)."""

WebhookStartError = EndpointStartError
"""The endpoint cannot start: bad address, port in use, or unreadable certificate."""


def _review_route(
    checker: QuotaChecker, annotation_writers: frozenset[str]
) -> Route:
    def answer(body: bytes) -> Answer:
        try:
            review = parse_review(body)
        except ReviewError as error:
            return HTTPStatus.BAD_REQUEST, default_error_body(
                HTTPStatus.BAD_REQUEST, f"malformed AdmissionReview: {error}"
            )
        try:
            return HTTPStatus.OK, review_response(review, checker, annotation_writers)
        except Exception:
            # A bug: deny (never allow silently) and keep the request content out of the answer.
            _LOG.exception("unhandled error in the AdmissionReview endpoint")
            return HTTPStatus.OK, denied(
                review, 500, "InternalError", "internal error in the GPU quota check"
            )

    return answer


class WebhookServer:
    """A started AdmissionReview endpoint; ``stop`` ends it (idempotent)."""

    def __init__(
        self,
        addr: str,
        cert_file: Path,
        key_file: Path,
        checker: QuotaChecker,
        limits: ConnectionLimits = DEFAULT_LIMITS,
        annotation_writers: Collection[str] = owned_annotations.DEFAULT_ANNOTATION_WRITERS,
    ) -> None:
        """Raises:
            WebhookStartError: the address or the certificate cannot be used."""
        spec = EndpointSpec(
            name="webhook",
            routes={VALIDATE_PATH: _review_route(checker, frozenset(annotation_writers))},
            max_body_bytes=MAX_BODY_BYTES,
            error_body=default_error_body,
            server_version="hami-accounting-admission",
        )
        self._endpoint = JsonEndpoint(
            addr, spec, tls=ServingTls(cert_file, key_file), limits=limits
        )
        self.addr = addr
        self.port = self._endpoint.port
        """The bound port (the real one when addr asked for port 0)."""
        _LOG.info("AdmissionReview endpoint listening",
                  extra={"webhook_addr": addr, "port": self.port, "path": VALIDATE_PATH,
                         "max_connections": limits.max_connections,
                         "request_timeout_s": limits.request_timeout_s,
                         "idle_timeout_s": limits.idle_timeout_s})

    @property
    def refused_connections(self) -> int:
        """Connections closed on arrival because ``max_connections`` were open."""
        return self._endpoint.refused_connections

    @property
    def expired_connections(self) -> int:
        """Connections closed because they overran a deadline."""
        return self._endpoint.expired_connections

    @property
    def url(self) -> str:
        """``https://127.0.0.1:<port>/validate`` for a local client."""
        return self._endpoint.url(VALIDATE_PATH)

    def stop(self) -> None:
        self._endpoint.stop()
