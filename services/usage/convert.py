"""Conversion between the UsageRecorder messages and the usage store's values.

Layer: services/usage (adapter). Shared messages (pods, grants, devices, quota items) convert in
``services.common.convert``; this module builds the recorder's own requests and responses. No
accounting rules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from accounting.errors import InvalidInputError, Violations
from accounting.ledger import (
    LedgerChange,
    RecordOutcome,
    ReleaseOutcome,
    ReserveOutcome,
    ReserveReason,
)
from accounting.lifecycle import StoredPod
from accounting.model import Pod, QuotaItem
from accounting.policy import AccountingPolicy
from accounting.quoting import quote
from accounting.vendors import VendorResources
from hami.accounting.v1 import types_pb2, usage_pb2
from services.common import convert as common
from services.usage.events import (
    EncodedParts,
    EventKind,
    NodeSnapshot,
    UsageEvent,
    WatchContent,
)

EVENT_KIND_TO_PB: Mapping[EventKind, usage_pb2.UsageEventKind.ValueType] = {
    EventKind.SNAPSHOT: usage_pb2.USAGE_EVENT_KIND_SNAPSHOT,
    EventKind.POD_CHANGED: usage_pb2.USAGE_EVENT_KIND_POD_CHANGED,
    EventKind.POD_FORGOTTEN: usage_pb2.USAGE_EVENT_KIND_POD_FORGOTTEN,
    EventKind.NODE_REGISTERED: usage_pb2.USAGE_EVENT_KIND_NODE_REGISTERED,
    EventKind.QUOTA_SET: usage_pb2.USAGE_EVENT_KIND_QUOTA_SET,
    EventKind.POLICY: usage_pb2.USAGE_EVENT_KIND_POLICY,
    EventKind.INITIAL_STATE_COMPLETE: usage_pb2.USAGE_EVENT_KIND_INITIAL_STATE_COMPLETE,
}
_BATCH_TAG = bytes([usage_pb2.UsageEvent.BATCH_FIELD_NUMBER << 3 | 2])
"""The key of ``UsageEvent.batch`` on the wire: its field number, length-delimited."""


# -- requests ----------------------------------------------------------------------------------


def reserve_pod(
    request: usage_pb2.ReserveRequest, vendors: Sequence[VendorResources]
) -> Pod:
    """Reserve's pod with the request's grants put on its containers by position.

    Without ``container_grants`` the pod's own grants are reserved (a pod sent with its
    ``hami.io/vgpu-devices-allocated`` annotation already carries them).

    Raises:
        InvalidInputError: a bad pod, a bad grant, or positions that do not match the pod's
            containers (count, or a ``container_name`` that names another container).
    """
    pod = common.pod_from_source(request, vendors)
    if not request.container_grants:
        return pod
    per_container = common.grants_from_pb(request.container_grants, "container_grants")
    found = Violations()
    if len(per_container) != len(pod.containers):
        found.add(
            "container_grants",
            f"{len(per_container)} positions for the pod's {len(pod.containers)} containers; "
            "give one entry per container, in declaration order",
        )
        found.raise_if_any()
    for position, (entry, container) in enumerate(
        zip(request.container_grants, pod.containers, strict=True)
    ):
        if entry.container_name and entry.container_name != container.name:
            found.add(
                f"container_grants[{position}].container_name",
                f"position {position} is container {quote(container.name)}, "
                f"got {quote(entry.container_name)}",
            )
    found.raise_if_any()
    containers = tuple(
        dataclasses.replace(container, grants=grants)
        for container, grants in zip(pod.containers, per_container, strict=True)
    )
    return dataclasses.replace(pod, containers=containers)


def require_pod_uid(pod_uid: str) -> str:
    """Raises InvalidInputError naming ``pod_uid`` when it is empty."""
    if not pod_uid:
        raise InvalidInputError.single("pod_uid", "must not be empty")
    return pod_uid


def node_names(request: usage_pb2.GetNodeUsageRequest) -> tuple[str, ...]:
    """GetNodeUsage's names; empty means every node."""
    return tuple(request.node_names)


# -- responses ---------------------------------------------------------------------------------


def _stored_usage(stored: StoredPod | None) -> list[types_pb2.DeviceUsage]:
    return common.usages_to_pb(stored.usage) if stored is not None else []


def record_response(outcome: RecordOutcome) -> usage_pb2.RecordPodResponse:
    stored = outcome.stored
    return usage_pb2.RecordPodResponse(
        stored=_stored_usage(stored),
        init_released=stored.init_released if stored is not None else False,
        decision=outcome.decision.value,
        message=outcome.message,
        tracked=stored is not None,
    )


def forget_response(change: LedgerChange) -> usage_pb2.ForgetPodResponse:
    return usage_pb2.ForgetPodResponse(
        released=_stored_usage(change.before), found=change.before is not None
    )


def reserve_response(outcome: ReserveOutcome) -> usage_pb2.ReserveResponse:
    stored = outcome.stored
    shown = outcome.reserved or outcome.reason == ReserveReason.RESERVATION_CHANGED
    return usage_pb2.ReserveResponse(
        reserved=outcome.reserved,
        reason=outcome.reason,
        message=outcome.message,
        stored=_stored_usage(stored) if shown else [],
        stored_revision=stored.revision if stored is not None else 0,
        stored_node_name=stored.node_name if stored is not None else "",
    )


def release_response(outcome: ReleaseOutcome) -> usage_pb2.ReleaseReservationResponse:
    released = outcome.change.before if outcome.change is not None else None
    return usage_pb2.ReleaseReservationResponse(
        released=outcome.released,
        reason=outcome.reason,
        message=outcome.message,
        released_usage=_stored_usage(released),
    )


def pod_usage_response(stored: StoredPod | None) -> usage_pb2.GetPodUsageResponse:
    if stored is None:
        return usage_pb2.GetPodUsageResponse(found=False)
    return usage_pb2.GetPodUsageResponse(
        stored=common.usages_to_pb(stored.usage),
        init_released=stored.init_released,
        found=True,
        namespace=stored.namespace,
        name=stored.name,
        node_name=stored.node_name,
        stored_revision=stored.revision,
    )


def node_usage_to_pb(node: NodeSnapshot) -> types_pb2.NodeUsage:
    return common.node_usage_to_pb(node.node_name, node.devices, node.pod_uids)


def node_usage_response(
    nodes: Sequence[NodeSnapshot], unknown: Sequence[str]
) -> usage_pb2.GetNodeUsageResponse:
    return usage_pb2.GetNodeUsageResponse(
        nodes=[node_usage_to_pb(node) for node in nodes], unknown_node_names=list(unknown)
    )


def quota_items_to_pb(items: Sequence[QuotaItem]) -> list[types_pb2.QuotaItem]:
    return [common.quota_item_to_pb(item) for item in items]


def namespace_usage_response(
    items: Sequence[QuotaItem], policy_id: str
) -> usage_pb2.GetNamespaceUsageResponse:
    return usage_pb2.GetNamespaceUsageResponse(items=quota_items_to_pb(items), policy_id=policy_id)


def policy_response(policy: AccountingPolicy) -> usage_pb2.GetPolicyResponse:
    return usage_pb2.GetPolicyResponse(policy=common.policy_to_pb(policy))


def set_quota_response(items: Sequence[QuotaItem]) -> usage_pb2.SetQuotaResponse:
    return usage_pb2.SetQuotaResponse(items=quota_items_to_pb(items))


def register_node_response(node: NodeSnapshot) -> usage_pb2.RegisterNodeResponse:
    return usage_pb2.RegisterNodeResponse(node=node_usage_to_pb(node))


def event_to_pb(
    event: UsageEvent, content: WatchContent = WatchContent.ALL
) -> usage_pb2.UsageEvent:
    """The event as a watcher that asked for ``content`` receives it."""
    message = usage_pb2.UsageEvent(
        revision=event.revision,
        kind=EVENT_KIND_TO_PB[event.kind],
        pod_uid=event.pod_uid,
        namespace=event.namespace,
        stored=common.usages_to_pb(event.stored),
    )
    if WatchContent.NAMESPACES in content:
        message.namespace_items.extend(quota_items_to_pb(event.namespace_items))
    if event.node is not None and WatchContent.NODES in content:
        message.node.CopyFrom(node_usage_to_pb(event.node))
    if event.policy is not None:
        message.policy.CopyFrom(common.policy_to_pb(event.policy))
    return message


def encode_event_parts(event: UsageEvent) -> EncodedParts:
    """The event serialized in three parts that concatenate into ``event_to_pb(event, c)`` for
    any content ``c`` (``EncodedParts.for_content``)."""
    change_pb = usage_pb2.UsageEvent(
        revision=event.revision,
        kind=EVENT_KIND_TO_PB[event.kind],
        pod_uid=event.pod_uid,
        namespace=event.namespace,
        stored=common.usages_to_pb(event.stored),
    )
    if event.policy is not None:
        change_pb.policy.CopyFrom(common.policy_to_pb(event.policy))
    change = change_pb.SerializeToString()
    namespace = (
        usage_pb2.UsageEvent(
            namespace_items=quota_items_to_pb(event.namespace_items)
        ).SerializeToString()
        if event.namespace_items
        else b""
    )
    node = (
        usage_pb2.UsageEvent(node=node_usage_to_pb(event.node)).SerializeToString()
        if event.node is not None
        else b""
    )
    return EncodedParts(change, namespace, node)


def frame_batch_element(encoded_event: bytes) -> bytes:
    """One serialized UsageEvent as an element of ``UsageEvent.batch``: joined, such elements
    are a serialized UsageEvent whose ``batch`` holds those events (protobuf encodes a
    repeated message field as one key + length + bytes per element)."""
    return _BATCH_TAG + _varint(len(encoded_event)) + encoded_event


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


WATCH_CONTENT_FROM_PB: Mapping[int, WatchContent] = {
    usage_pb2.WATCH_CONTENT_UNSPECIFIED: WatchContent.ALL,
    usage_pb2.WATCH_CONTENT_NAMESPACES: WatchContent.NAMESPACES,
    usage_pb2.WATCH_CONTENT_NODES: WatchContent.NODES,
}


def watch_content(request: usage_pb2.WatchUsageRequest) -> WatchContent:
    """What the watcher asked its events to carry.

    Raises:
        InvalidInputError: ``content`` is a value this build does not know.
    """
    content = WATCH_CONTENT_FROM_PB.get(request.content)
    if content is None:
        raise InvalidInputError.single(
            "content",
            f"must be UNSPECIFIED (everything), NAMESPACES or NODES, got unknown value "
            f"{request.content}",
        )
    return content
