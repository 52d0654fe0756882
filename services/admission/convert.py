"""Conversion between the Admission messages and the accounting's values.

Layer: services/admission (adapter). Shared messages (pods, quota items) convert in
``services.common.convert``; this module reads CheckQuota's pod and builds its response. No
accounting rules.

A pod being admitted may not have a uid yet: the API server assigns it after the mutating
webhooks ran (HAMi's webhook is one), so a pod without ``metadata.uid`` is accepted here and
carries ``UNASSIGNED_UID``. Every other problem is INVALID_ARGUMENT naming the field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from accounting import received_json, validate
from accounting.errors import InvalidInputError
from accounting.kube import pod_json
from accounting.model import Pod, QuotaItem
from accounting.pod import EffectiveRequest
from accounting.quota import QuotaCheckItem, QuotaDecision
from accounting.vendors import VendorResources
from hami.accounting.v1 import admission_pb2, types_pb2
from services.common import convert as common

UNASSIGNED_UID = "(not assigned yet)"
"""The uid of a pod checked before the API server gave it one (span attributes, logs)."""


def pod_from_request(
    request: admission_pb2.CheckQuotaRequest, vendors: Sequence[VendorResources]
) -> Pod:
    """CheckQuota's pod, typed or Kubernetes JSON, converted and validated.

    Raises:
        InvalidInputError: no pod, or every problem of it (``pod.containers[0].name``,
            ``kubernetes_pod_json.spec.containers[1].resources.limits["nvidia.com/gpumem"]``).
    """
    kind = common.pod_source_kind(request)
    if kind == "pod" and not request.pod.uid:
        typed = types_pb2.Pod()
        typed.CopyFrom(request.pod)
        typed.uid = UNASSIGNED_UID
        return common.pod_from_pb(typed)
    if kind == "kubernetes_pod_json":
        path = "kubernetes_pod_json"
        document = received_json.json_object(request.kubernetes_pod_json, path)
        return pod_from_kubernetes(document, vendors, path=path)
    # The common reader reports a missing source with the same words every daemon uses.
    return common.pod_from_source(request, vendors)


def min_usage_revision(request: admission_pb2.CheckQuotaRequest) -> int:
    """The request's read-your-writes revision (0: none asked).

    Raises:
        InvalidInputError: ``min_usage_revision`` is negative.
    """
    if request.min_usage_revision < 0:
        raise InvalidInputError.single(
            "min_usage_revision",
            f"must be >= 0 (a revision a UsageRecorder write returned), got "
            f"{request.min_usage_revision}",
        )
    return request.min_usage_revision


def pod_from_kubernetes(
    document: Mapping[str, Any],
    vendors: Sequence[VendorResources],
    *,
    path: str,
    namespace: str = "",
) -> Pod:
    """A Kubernetes Pod object (decoded JSON) read for a quota check; ``namespace`` fills an
    empty ``metadata.namespace`` (an AdmissionReview's ``request.namespace``).

    Raises:
        InvalidInputError: every problem, with paths under ``path``.
    """
    metadata = document.get("metadata")
    if isinstance(metadata, dict):
        if metadata.get("uid") in (None, ""):
            metadata = {**metadata, "uid": UNASSIGNED_UID}
        if namespace and metadata.get("namespace") in (None, ""):
            metadata = {**metadata, "namespace": namespace}
        document = {**document, "metadata": metadata}
    elif metadata is None:
        document = {
            **document,
            "metadata": {"uid": UNASSIGNED_UID, **({"namespace": namespace} if namespace else {})},
        }
    pod = pod_json.parse_pod(document, vendors, path=path)
    validate.validate_pod(pod, path)
    return pod


def quota_items_from_pb(items: Iterable[types_pb2.QuotaItem]) -> Mapping[str, QuotaItem]:
    """GetNamespaceUsage's (or a UsageEvent's) items keyed by resource name, read-only."""
    return MappingProxyType(
        {item.resource: common.quota_item_from_pb(item) for item in items}
    )


_VENDOR_REQUEST_FIELDS = tuple(field.name for field in dataclasses.fields(EffectiveRequest))
"""Every field of ``EffectiveRequest``, each the ``VendorRequest`` field of the same name."""


def vendor_request_fields(request: EffectiveRequest) -> dict[str, Any]:
    """The ``VendorRequest`` fields of an effective request."""
    # Field by field rather than dataclasses.asdict, which deep-copies each (immutable) value:
    # this runs for every vendor of every check.
    return {name: getattr(request, name) for name in _VENDOR_REQUEST_FIELDS}


def check_item_fields(item: QuotaCheckItem) -> dict[str, Any]:
    """The ``QuotaCheckItem`` message fields of one dimension of a check."""
    return {
        "resource": item.resource,
        "requested": common.saturated(item.requested),
        "used": common.saturated(item.used),
        "limit": common.saturated(item.limit),
        "limit_set": item.limit_set,
        "exceeded": item.exceeded,
        "enforced": item.enforced,
    }


def check_response(
    namespace: str,
    effective: Sequence[EffectiveRequest],
    decision: QuotaDecision,
    traceparent: str,
    policy_id: str,
) -> admission_pb2.CheckQuotaResponse:
    response = admission_pb2.CheckQuotaResponse(
        allowed=decision.allowed,
        reason=decision.reason,
        message=decision.message,
        traceparent=traceparent,
        namespace=namespace,
        policy_id=policy_id,
    )
    # Built in place: messages built first would each be copied into the response.
    for request in effective:
        response.effective.add(**vendor_request_fields(request))
    for item in decision.items:
        response.items.add(**check_item_fields(item))
    return response
