"""An AdmissionReview read and answered: the webhook's decisions, apart from its HTTPS server.

Layer: services/admission (adapter). ``parse_review`` reads the envelope (``admission.k8s.io/v1``
or ``v1beta1``, ``request.uid``); ``review_response`` answers it in the version it came in:
scheduler-owned annotations first (accounting.owned_annotations), then, for a pod CREATE, the
gRPC check's ``QuotaChecker``, so both front ends decide alike. Every refusal is a value with a
status code (400 a malformed pod, 403 a rule, 503 the recorder unreachable), never an
exception; services/admission/webhook.py lists them and serves them.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from accounting import errors, owned_annotations, quoting, received_json
from accounting.errors import InvalidInputError
from accounting.kube import pod_json
from services.admission import convert
from services.admission.servicer import VIA_ADMISSION_REVIEW, QuotaChecker
from services.common.errors import DependencyUnavailableError

_LOG = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
REVIEW_KIND = "AdmissionReview"


class ReviewError(Exception):
    """The request body is not a usable AdmissionReview (HTTP 400)."""


@dataclass(frozen=True, slots=True)
class Review:
    """The parts of an AdmissionReview request the check reads."""

    api_version: str
    uid: str
    request: Mapping[str, Any]


def parse_review(body: bytes) -> Review:
    """Reads the envelope of an AdmissionReview.

    Raises:
        ReviewError: not JSON, not an AdmissionReview of a supported version, or no uid.
    """
    try:
        # Exact numbers: a quantity may be a JSON number, and 1e400 is not a float; an integer
        # of thousands of digits stays a Decimal for its field to refuse (accounting.numbers).
        document = received_json.decode_json(body, "body")
    except InvalidInputError as error:
        raise ReviewError(str(error)) from None
    if not isinstance(document, dict):
        raise ReviewError("body must be a JSON object (an AdmissionReview)")
    api_version = document.get("apiVersion")
    if api_version not in SUPPORTED_VERSIONS:
        raise ReviewError(
            f"apiVersion must be one of {', '.join(SUPPORTED_VERSIONS)}, got "
            f"{quoting.shown(api_version)}"
        )
    if document.get("kind") != REVIEW_KIND:
        raise ReviewError(f"kind must be {REVIEW_KIND}, got {quoting.shown(document.get('kind'))}")
    request = document.get("request")
    if not isinstance(request, dict):
        raise ReviewError("request must be an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("request.uid must be a non-empty string")
    return Review(api_version=api_version, uid=uid, request=request)


def _pod_operation(request: Mapping[str, Any]) -> str | None:
    """``CREATE`` or ``UPDATE`` of a pod itself (not a subresource), else None."""
    kind = request.get("kind")
    is_pod = (
        isinstance(kind, dict)
        and kind.get("group", "") == ""
        and kind.get("kind") == "Pod"
        and not request.get("subResource")
    )
    operation = request.get("operation")
    return operation if is_pod and operation in ("CREATE", "UPDATE") else None


def _annotations(obj: object) -> Mapping[str, Any]:
    """A pod object's ``metadata.annotations`` as sent ({} when absent or not an object): only
    the keys are looked at before the pod is read."""
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return annotations if isinstance(annotations, Mapping) else {}


def _response(review: Review, allowed: bool, **fields: Any) -> dict[str, Any]:
    return {
        "apiVersion": review.api_version,
        "kind": REVIEW_KIND,
        "response": {"uid": review.uid, "allowed": allowed, **fields},
    }


def denied(review: Review, code: int, reason: str, message: str) -> dict[str, Any]:
    """The answer refusing ``review`` with status ``code``, ``reason`` and ``message``."""
    # The API server shows the message to whoever created the pod: kept as short as a gRPC
    # status (it may quote the pod's own values).
    bounded = errors.bounded_text(message, errors.MAX_MESSAGE_CHARS)
    return _response(
        review, False, status={"code": code, "message": bounded, "reason": reason}
    )


def _owned_annotations_refusal(
    review: Review, verdict: owned_annotations.AnnotationVerdict, operation: str
) -> dict[str, Any]:
    _LOG.warning(
        "denying pod %s %s: %s", operation.lower(), _pod_key(review.request.get("object") or {},
                                                             review.request.get("namespace")),
        verdict.message, extra={"reason": verdict.reason, "annotation": verdict.annotation},
    )
    return _response(
        review,
        False,
        status={"code": 403, "message": verdict.message, "reason": verdict.reason},
        auditAnnotations={"reason": verdict.reason},
    )


def review_response(
    review: Review,
    checker: QuotaChecker,
    annotation_writers: Collection[str] = owned_annotations.DEFAULT_ANNOTATION_WRITERS,
) -> dict[str, Any]:
    """The AdmissionReview answer to ``review`` (never raises for a bad pod or a down
    recorder: those are denials with a status code).

    A pod CREATE carrying a scheduler-owned annotation is refused before anything else, and an
    UPDATE that adds, rewrites or drops one is refused unless ``request.userInfo.username`` is
    one of ``annotation_writers`` (accounting.owned_annotations); any other UPDATE is allowed
    unchanged, with no quota check."""
    request = review.request
    operation = _pod_operation(request)
    if operation is None:
        return _response(review, True)
    obj = request.get("object")
    if not isinstance(obj, dict):
        return denied(
            review, 400, "BadRequest", "invalid pod: request.object must be a Pod object"
        )
    if operation == "UPDATE":
        user = request.get("userInfo")
        username = user.get("username") if isinstance(user, Mapping) else None
        verdict = owned_annotations.on_update(
            _annotations(request.get("oldObject")),
            _annotations(obj),
            username if isinstance(username, str) else "",
            annotation_writers,
        )
        if not verdict.allowed:
            return _owned_annotations_refusal(review, verdict, operation)
        return _response(review, True)
    verdict = owned_annotations.on_create(_annotations(obj))
    if not verdict.allowed:
        return _owned_annotations_refusal(review, verdict, operation)
    namespace = request.get("namespace")
    try:
        outcome = checker.check_request(
            lambda vendors: convert.pod_from_kubernetes(
                obj,
                vendors,
                path="request.object",
                namespace=namespace if isinstance(namespace, str) else "",
            ),
            lambda: pod_json.names_extended_resources(obj),
            via=VIA_ADMISSION_REVIEW,
        )
    except InvalidInputError as error:
        return denied(review, 400, "BadRequest", error.bounded(prefix="invalid pod: ")[1])
    except DependencyUnavailableError as error:
        _LOG.warning("denying pod %s: %s", _pod_key(obj, namespace), error)
        return denied(review, 503, "ServiceUnavailable", str(error))
    decision = outcome.decision
    audit = {"reason": decision.reason}
    if outcome.traceparent:
        # A validating webhook cannot patch the pod; the audit log keeps the trace id.
        audit["traceparent"] = outcome.traceparent
    if decision.allowed:
        return _response(review, True, auditAnnotations=audit)
    return _response(
        review,
        False,
        status={
            "code": 403,
            "message": errors.bounded_text(decision.message, errors.MAX_MESSAGE_CHARS),
            "reason": decision.reason,
        },
        auditAnnotations=audit,
    )


def _pod_key(obj: Mapping[str, Any], namespace: object) -> str:
    """namespace/name of a pod object for a log line (either may be missing)."""
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return "/".join(part if isinstance(part, str) else "" for part in (namespace, name))
