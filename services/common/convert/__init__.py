"""Conversion between hami.accounting.v1 messages and accounting values, one module per message
family: ``pod_messages`` (a request's pod source, typed pods, requests, grants per container),
``grant_messages`` (grants and stored usage, MIG instances), ``node_messages`` (devices,
RegisterNode's node, device states), ``quota_messages``, ``policy_messages``, and
``wire_fields`` (the field tables they share and the saturation of totals).

Layer: services (adapter). The one place shared by the three daemons where protobuf meets the
domain: input is converted and validated here (every bad field reported at once, with paths
like ``pod.containers[1].container_class``), output is built here. No accounting rules. The
daemons' adapters take what they convert from this package as ``services.common.convert``.
"""

from services.common.convert.grant_messages import grants_from_pb, usage_from_pb, usages_to_pb
from services.common.convert.node_messages import (
    device_state_from_pb,
    device_to_pb,
    node_from_source,
    node_usage_to_pb,
)
from services.common.convert.pod_messages import (
    container_grants_to_pb,
    grants_as_sent,
    pod_from_pb,
    pod_from_source,
    pod_source_asks_for_devices,
    pod_source_kind,
    pod_to_pb,
)
from services.common.convert.policy_messages import policy_from_pb, policy_to_pb
from services.common.convert.quota_messages import quota_item_from_pb, quota_item_to_pb
from services.common.convert.wire_fields import saturated

__all__ = [
    "container_grants_to_pb",
    "device_state_from_pb",
    "device_to_pb",
    "grants_as_sent",
    "grants_from_pb",
    "node_from_source",
    "node_usage_to_pb",
    "pod_from_pb",
    "pod_from_source",
    "pod_source_asks_for_devices",
    "pod_source_kind",
    "pod_to_pb",
    "policy_from_pb",
    "policy_to_pb",
    "quota_item_from_pb",
    "quota_item_to_pb",
    "saturated",
    "usage_from_pb",
    "usages_to_pb",
]
