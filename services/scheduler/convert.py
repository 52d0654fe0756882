"""Conversion between the Scheduler's messages, the recorder's messages and the domain.

Layer: services/scheduler (adapter). Validates Filter's input (every bad field at once), turns
the recorder's node usage and namespace quota into the fit's ``NodeState`` and ``QuotaContext``,
builds the Reserve request, and writes the Filter response with HAMi's annotations
(``accounting.hami_codec`` does the wire format). No accounting rules and no arithmetic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from accounting.allocation import allocation_annotations
from accounting.annotations import VGPU_NODE_ANNOTATION, VGPU_TIME_ANNOTATION
from accounting.errors import InvalidInputError, Violations
from accounting.fit import FitResult, JoinedScores, NodeState, QuotaContext
from accounting.limits import MAX_NODE_NAME_CHARS
from accounting.model import Device, DeviceGrant, DeviceUsage, Pod
from accounting.quoting import quote
from accounting.reasons import NODE_UNREGISTERED
from accounting.vendor_spec import VendorSpec
from accounting.vendors import VendorResources
from hami.accounting.v1 import scheduler_pb2, types_pb2, usage_pb2
from services.common import convert as common
from services.scheduler.fit_kernel import ColumnScores

MAX_CANDIDATE_NODES = 10_000
"""Most candidate nodes one Filter takes (a large cluster's whole node list)."""

MESSAGE_NODES = 20
"""Most failed nodes a Filter message names."""


PodDevices = tuple[tuple[DeviceGrant, ...], ...]
"""Grants per container position."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FilterInput:
    """Filter's request, validated: the pod and its candidate nodes (duplicates dropped)."""

    pod: Pod
    node_names: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Reservation:
    """The recorder's answer to Reserve."""

    reserved: bool
    reason: str
    message: str
    stored: tuple[DeviceUsage, ...] = ()
    stored_node_name: str = ""
    """Where the pod is stored after the call ("" for nowhere)."""
    stored_revision: int = 0
    """The revision of what is stored for the pod after the call (0: nothing)."""
    revision: int = 0
    """The recorder's revision once the call's change is visible to WatchUsage."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredReservation:
    """What the recorder stores for a pod, as a Filter reads it before placing the pod."""

    node_name: str
    usage: tuple[DeviceUsage, ...]
    revision: int
    """What a Reserve or a release states it replaces."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Released:
    """The recorder's answer to ReleaseReservation."""

    released: bool
    reason: str
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FilterOutcome:
    """What one Filter decided, ready to be written as a FilterResponse."""

    fit: FitResult
    """The last fit computed (the one reserved when the pod was scheduled)."""
    reason: str
    """Scheduled, NoGpuRequest, NoNodeFits or ReservationConflict."""
    message: str
    unregistered: tuple[str, ...] = ()
    """Candidates the recorder does not know; reported as failed nodes."""
    reservation: Reservation | None = None
    """The successful reservation when the pod was scheduled."""
    attempts: int = 0
    """How many placements were computed (0 for a pod without a GPU request)."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    policy_id: str = ""
    """The accounting policy the outcome was computed under ("" when none was needed)."""
    score_entries: Sequence[bytes] = ()
    """The FilterResponse.scores entries of the nodes the vectorized fit fitted, encoded when
    their rows were written (``score_entry``), in the order of ``fit.scores``' columns part
    (``ColumnScores``); () when there are none."""


# -- requests ----------------------------------------------------------------------------------


class NodeNameReader:
    """Reads Filter's ``node_names``, checking and de-duplicating each distinct list once: the
    extender sends every Filter the same candidates, and at thousands of them comparing the
    list with the last one read costs a fraction of checking it again."""

    def __init__(self) -> None:
        self._last: tuple[list[str], tuple[str, ...]] = ([], ())
        """The last list read that was valid, and its names without duplicates (replaced
        whole, so a Filter on another thread reads a consistent pair)."""

    def read(
        self, found: Violations, names: Sequence[str], *, path: str = "node_names"
    ) -> tuple[str, ...]:
        """The candidates, duplicates dropped; every problem is added to ``found``, under
        ``path`` (the gRPC field, or the extender's ``NodeNames``)."""
        # Read once: every element read of a protobuf repeated field builds a new str, and at
        # thousands of candidates each pass over the field costs as much as the checks.
        given = list(names)
        last_given, last_unique = self._last
        if given and given == last_given:
            return last_unique
        before = len(found)
        unique = _node_names(found, given, path)
        if len(found) == before:
            self._last = (given, unique)
        return unique


def filter_input(
    request: scheduler_pb2.FilterRequest,
    *,
    vendors: Sequence[VendorResources],
    names: NodeNameReader | None = None,
) -> FilterInput:
    """Validates and converts Filter's request, the pod read with ``vendors``' resource names;
    ``names`` reads the node names (a fresh one by default; the servicer keeps one across
    Filters).

    Raises:
        InvalidInputError: every problem with the pod and the node names at once, e.g.
            ``node_names: at least one candidate node is required`` together with
            ``pod.uid: must not be empty``.
    """
    found = Violations()
    pod: Pod | None = None
    try:
        pod = common.pod_from_source(request, vendors)
    except InvalidInputError as error:
        found.extend(error)
    node_names = (names or NodeNameReader()).read(found, request.node_names)
    found.raise_if_any()
    assert pod is not None
    return FilterInput(pod=pod, node_names=node_names)


def _node_names(found: Violations, given: list[str], path: str) -> tuple[str, ...]:
    if not given:
        found.add(path, "at least one candidate node is required")
        return ()
    if len(given) > MAX_CANDIDATE_NODES:
        found.add(path, f"at most {MAX_CANDIDATE_NODES} candidate nodes, got {len(given)}")
        return ()
    # Duplicates add nothing; the first occurrence keeps its place.
    unique = dict.fromkeys(given)
    if "" not in unique and max(map(len, unique)) <= MAX_NODE_NAME_CHARS:
        # Every name is fine (the usual case, thousands of them): no loop in Python.
        return tuple(unique)
    for index, name in enumerate(given):
        if not name:
            found.add(f"{path}[{index}]", "must not be empty")
        elif len(name) > MAX_NODE_NAME_CHARS:
            found.add(
                f"{path}[{index}]",
                f"at most {MAX_NODE_NAME_CHARS} characters, got {len(name)}: {quote(name)}",
            )
    return tuple(unique)


def node_usage_request(node_names: Sequence[str]) -> usage_pb2.GetNodeUsageRequest:
    return usage_pb2.GetNodeUsageRequest(node_names=list(node_names))


def namespace_usage_request(namespace: str) -> usage_pb2.GetNamespaceUsageRequest:
    return usage_pb2.GetNamespaceUsageRequest(namespace=namespace)


def pod_usage_request(pod_uid: str) -> usage_pb2.GetPodUsageRequest:
    return usage_pb2.GetPodUsageRequest(pod_uid=pod_uid)


def release_request(pod_uid: str, replaces_revision: int) -> usage_pb2.ReleaseReservationRequest:
    return usage_pb2.ReleaseReservationRequest(
        pod_uid=pod_uid, replaces_revision=replaces_revision
    )


def reserve_request(
    pod: Pod,
    node_name: str,
    grants: PodDevices,
    policy_id: str,
    replaces_revision: int | None = None,
) -> usage_pb2.ReserveRequest:
    """Reserve for the chosen node, with the fit's grants in container positions, the
    accounting policy they were fitted under, and the reservation they replace (when given).

    The pod travels typed, annotations included, so the recorder's span joins the pod's trace
    through ``hami.io/traceparent``.
    """
    request = usage_pb2.ReserveRequest(
        pod=common.pod_to_pb(pod),
        node_name=node_name,
        container_grants=common.container_grants_to_pb(pod, grants),
        policy_id=policy_id,
    )
    if replaces_revision is not None:
        request.replaces_revision = replaces_revision
    return request


# -- recorder responses ------------------------------------------------------------------------


def node_state_from_pb(node: types_pb2.NodeUsage) -> NodeState:
    """One node as the fit reads it (from GetNodeUsage or a WatchUsage event)."""
    return NodeState(
        node.node_name, tuple(common.device_state_from_pb(device) for device in node.devices)
    )


def node_states_from_pb(
    responses: Sequence[usage_pb2.GetNodeUsageResponse],
) -> tuple[tuple[NodeState, ...], tuple[str, ...]]:
    """(registered nodes as the fit reads them, names the recorder does not know), in the order
    the recorder answered (the order asked)."""
    nodes = tuple(
        node_state_from_pb(node) for response in responses for node in response.nodes
    )
    unknown = tuple(name for response in responses for name in response.unknown_node_names)
    return nodes, unknown


def quota_context_from_pb(response: usage_pb2.GetNamespaceUsageResponse) -> QuotaContext:
    """The namespace's quota items keyed by resource name (nvidia.com/gpumem, ...)."""
    return quota_context_from_items(response.items)


def quota_context_from_items(items: Iterable[types_pb2.QuotaItem]) -> QuotaContext:
    """Quota items (of GetNamespaceUsage or a WatchUsage event) keyed by resource name."""
    return QuotaContext({item.resource: common.quota_item_from_pb(item) for item in items})


def reservation_from_pb(response: usage_pb2.ReserveResponse) -> Reservation:
    return Reservation(
        reserved=response.reserved,
        reason=response.reason,
        message=response.message,
        stored=tuple(common.usage_from_pb(usage) for usage in response.stored),
        stored_node_name=response.stored_node_name,
        stored_revision=response.stored_revision,
        revision=response.revision,
    )


def stored_reservation(response: usage_pb2.GetPodUsageResponse) -> StoredReservation | None:
    """What is stored for a pod, or None when nothing is."""
    if not response.found:
        return None
    return StoredReservation(
        node_name=response.node_name,
        usage=tuple(common.usage_from_pb(usage) for usage in response.stored),
        revision=response.stored_revision,
    )


def released_from_pb(response: usage_pb2.ReleaseReservationResponse) -> Released:
    return Released(
        released=response.released, reason=response.reason, message=response.message
    )


# -- the Filter response -----------------------------------------------------------------------


def hami_annotations(
    grants: PodDevices,
    node_name: str,
    unix_s: int,
    *,
    specs: Sequence[VendorSpec],
    devices: Mapping[str, Device] | None = None,
    pod: Pod | None = None,
) -> dict[str, str]:
    """The annotations HAMi's Filter patches onto a placed pod, byte for byte.

    Each vendor with a grant writes its allocation annotation(s) (for NVIDIA
    ``hami.io/vgpu-devices-allocated`` and ``hami.io/vgpu-devices-to-allocate``, the same
    string: the device plugin later empties entries of the second as it hands devices out) and
    what its device plugin reads besides (``accounting.allocation``); a container without a
    device still writes its ``;`` so every later position stays on its own device.
    """
    written = allocation_annotations(
        grants,
        specs,
        devices or {},
        node_name=node_name,
        unix_s=unix_s,
        annotations=pod.annotations if pod is not None else {},
        container_names=[c.name for c in pod.containers] if pod is not None else (),
    )
    written[VGPU_NODE_ANNOTATION] = node_name
    written[VGPU_TIME_ANNOTATION] = str(unix_s)
    return written


def failed_nodes(fit: FitResult, unregistered: Sequence[str]) -> dict[str, str]:
    """The fit's failed nodes plus the unregistered candidates, sorted by node name."""
    merged = dict(fit.failed_nodes)
    for name in unregistered:
        merged[name] = NODE_UNREGISTERED
    return dict(sorted(merged.items()))


def no_fit_message(candidates: int, failed: Mapping[str, str]) -> str:
    """``0/<n> nodes fit: node1: 1/1 CardInsufficientMemory; node2: node unregistered``.

    At most ``MESSAGE_NODES`` nodes are named (failed_nodes has them all), so a refusal over
    thousands of candidates stays one readable sentence.
    """
    shown = [f"{name}: {reason}" for name, reason in list(failed.items())[:MESSAGE_NODES]]
    if len(failed) > MESSAGE_NODES:
        shown.append(f"and {len(failed) - MESSAGE_NODES} more")
    details = "; ".join(shown)
    return f"0/{candidates} nodes fit" + (f": {details}" if details else "")


def filter_response(pod: Pod, outcome: FilterOutcome) -> scheduler_pb2.FilterResponse:
    """The FilterResponse message of an outcome."""
    return scheduler_pb2.FilterResponse.FromString(filter_response_bytes(pod, outcome))


def score_entry(node_name: str, score: float) -> bytes:
    """The node's entry of ``FilterResponse.scores`` as protobuf writes it: encoded once per
    change of the node (the node table keeps it beside the row), then joined into every Filter
    answer that names the node (a message is its fields' encodings one after the other, so
    joining them is what protobuf does)."""
    return scheduler_pb2.FilterResponse(
        scores=[scheduler_pb2.NodeScore(node_name=node_name, score=score)]
    ).SerializeToString()


def filter_response_bytes(pod: Pod, outcome: FilterOutcome) -> bytes:
    """The FilterResponse of an outcome, encoded.

    The scores of nodes the vectorized fit fitted come already encoded (``score_entries``, for
    the columns part of a ``ColumnScores``): they are joined after the rest of the message
    instead of being built as thousands of NodeScore messages (protobuf reads a message's
    fields in any order, and repeated entries in the order they come).
    """
    fit = outcome.fit
    scheduled = outcome.reservation is not None and outcome.reservation.reserved
    node_name = fit.node_name if scheduled and fit.node_name else ""
    grants = fit.grants if scheduled else ((),) * len(pod.containers)
    scores = fit.scores
    encoded: Sequence[bytes] = ()
    columns_part, rest = scores, None
    if isinstance(scores, JoinedScores):
        columns_part, rest = scores.first, scores.second
    if isinstance(columns_part, ColumnScores) and len(outcome.score_entries) == len(columns_part):
        encoded = outcome.score_entries
        scores = rest if rest is not None else {}
    head = scheduler_pb2.FilterResponse(
        node_name=node_name,
        annotations=dict(outcome.annotations),
        failed_nodes=failed_nodes(fit, outcome.unregistered),
        container_grants=common.container_grants_to_pb(pod, grants),
        scores=[
            scheduler_pb2.NodeScore(node_name=name, score=score)
            for name, score in scores.items()
        ],
        reason=outcome.reason,
        message=outcome.message,
        reserved=(
            common.usages_to_pb(outcome.reservation.stored)
            if scheduled and outcome.reservation is not None
            else []
        ),
        policy_id=outcome.policy_id,
    )
    return head.SerializeToString() + b"".join(encoded)
