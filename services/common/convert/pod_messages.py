"""Pods between hami.accounting.v1 and accounting.model: the ``pod_source`` of a request
(typed, or Kubernetes JSON read by ``accounting.kube.pod_json``) in, validated, with every bad
field at once (``pod.containers[1].container_class``); the typed message out; a container's
requests, and Reserve's grants labelled by the container at each position.

Layer: services (adapter).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Literal, Protocol, TypeVar

from accounting import limits, received_json, validate
from accounting.errors import FieldViolation, InvalidInputError, Violations
from accounting.kube import pod_json
from accounting.model import (
    Container,
    ContainerClass,
    ContainerState,
    ContainerStatus,
    DeviceGrant,
    DeviceRequest,
    Pod,
    PodPhase,
)
from accounting.vendors import VendorResources
from hami.accounting.v1 import types_pb2
from services.common.convert.grant_messages import grant_from_pb, grant_to_pb
from services.common.convert.wire_fields import same_names, to_wire

T = TypeVar("T")


CONTAINER_CLASS_TO_PB: Mapping[ContainerClass, types_pb2.ContainerClass.ValueType] = {
    ContainerClass.INIT: types_pb2.CONTAINER_CLASS_INIT,
    ContainerClass.SIDECAR: types_pb2.CONTAINER_CLASS_SIDECAR,
    ContainerClass.APP: types_pb2.CONTAINER_CLASS_APP,
}

CONTAINER_CLASS_FROM_PB: Mapping[int, ContainerClass] = {
    pb: domain for domain, pb in CONTAINER_CLASS_TO_PB.items()
}

CONTAINER_STATE_TO_PB: Mapping[ContainerState, types_pb2.ContainerState.ValueType] = {
    ContainerState.UNKNOWN: types_pb2.CONTAINER_STATE_UNSPECIFIED,
    ContainerState.WAITING: types_pb2.CONTAINER_STATE_WAITING,
    ContainerState.RUNNING: types_pb2.CONTAINER_STATE_RUNNING,
    ContainerState.TERMINATED: types_pb2.CONTAINER_STATE_TERMINATED,
}

CONTAINER_STATE_FROM_PB: Mapping[int, ContainerState] = {
    pb: domain for domain, pb in CONTAINER_STATE_TO_PB.items()
}

POD_PHASE_TO_PB: Mapping[PodPhase, types_pb2.PodPhase.ValueType] = {
    PodPhase.PENDING: types_pb2.POD_PHASE_PENDING,
    PodPhase.RUNNING: types_pb2.POD_PHASE_RUNNING,
    PodPhase.SUCCEEDED: types_pb2.POD_PHASE_SUCCEEDED,
    PodPhase.FAILED: types_pb2.POD_PHASE_FAILED,
    PodPhase.UNKNOWN: types_pb2.POD_PHASE_UNKNOWN,
}

POD_PHASE_FROM_PB: Mapping[int, PodPhase] = {
    # An unreported phase is read as Pending, as the proto documents.
    types_pb2.POD_PHASE_UNSPECIFIED: PodPhase.PENDING,
    **{pb: domain for domain, pb in POD_PHASE_TO_PB.items()},
}


class PodSourceRequest(Protocol):
    """Any request message with the ``pod_source`` oneof (CheckQuota, Filter, Reserve, Record)."""

    @property
    def pod(self) -> types_pb2.Pod: ...

    @property
    def kubernetes_pod_json(self) -> bytes: ...

    def WhichOneof(self, oneof_group: Literal["pod_source"]) -> str | None: ...


def pod_source_kind(request: PodSourceRequest) -> str | None:
    """Which ``pod_source`` field is set: "pod", "kubernetes_pod_json" or None."""
    # The generated stubs type WhichOneof with a Literal argument per message; all agree here.
    return request.WhichOneof("pod_source")


def pod_source_asks_for_devices(request: PodSourceRequest) -> bool:
    """Whether the request's pod may ask for a device under some policy: a typed pod with a
    device request, or Kubernetes JSON naming an extended resource. False for a pod that asks
    for nothing under any policy, and for input the parser refuses whatever the policy."""
    kind = pod_source_kind(request)
    if kind == "pod":
        return any(r.count > 0 for c in request.pod.containers for r in c.requests)
    if kind == "kubernetes_pod_json":
        try:
            document = received_json.json_object(request.kubernetes_pod_json, "kubernetes_pod_json")
        except InvalidInputError:
            return False
        return pod_json.names_extended_resources(document)
    return False


def pod_from_source(
    request: PodSourceRequest, vendors: Sequence[VendorResources]
) -> Pod:
    """The request's pod, typed or as Kubernetes JSON, converted and validated.

    Raises:
        InvalidInputError: neither source set (path ``pod_source``), or every problem of the
            pod under ``pod.`` or ``kubernetes_pod_json.``.
    """
    kind = pod_source_kind(request)
    if kind == "pod":
        return pod_from_pb(request.pod)
    if kind == "kubernetes_pod_json":
        path = "kubernetes_pod_json"
        pod = pod_json.parse_pod_json(request.kubernetes_pod_json, vendors, path=path)
        # The parser already checks what it reads; this is the same backstop the typed path has.
        validate.validate_pod(pod, path)
        return pod
    raise InvalidInputError.single("pod_source", "one of pod or kubernetes_pod_json is required")


_GRANT_PATH = re.compile(r"(?:pod\.containers|container_grants)\[([0-9]+)\]\.grants\[([0-9]+)\]")
"""How the rules name a pod's grant in an error (the typed pod's, or Reserve's grants)."""


def grants_as_sent(
    error: InvalidInputError,
    request: PodSourceRequest,
    pod: Pod,
    vendors: Sequence[VendorResources],
) -> InvalidInputError:
    """``error`` with each of ``pod``'s grants named where the request wrote it: the typed
    pod's ``pod.containers[1].grants[0]``, or for Kubernetes JSON the entry of its allocation
    annotation, ``kubernetes_pod_json.metadata.annotations["hami.io/vgpu-devices-allocated"]
    [1][0]``. For a pod whose own grants the rules checked (RecordPod, Reserve without
    ``container_grants``); other paths are kept."""
    if pod_source_kind(request) == "kubernetes_pod_json":
        places = pod_json.grant_paths(pod, vendors, path="kubernetes_pod_json")
    else:
        places = tuple(
            tuple(f"pod.containers[{c}].grants[{g}]" for g in range(len(container.grants)))
            for c, container in enumerate(pod.containers)
        )
    violations: list[FieldViolation] = []
    for violation in error.violations:
        match = _GRANT_PATH.match(violation.path)
        path = violation.path
        if match is not None:
            container, grant = int(match[1]), int(match[2])
            if container < len(places) and grant < len(places[container]):
                path = places[container][grant] + violation.path[match.end():]
        violations.append(FieldViolation(path, violation.message))
    return InvalidInputError(violations)


def pod_from_pb(pb: types_pb2.Pod, path: str = "pod") -> Pod:
    """Converts and validates a typed pod.

    Raises:
        InvalidInputError: every problem, e.g. ``pod.containers[0].container_class: must be
            set`` together with ``pod.uid: must not be empty``.
    """
    found = Violations()
    _check_sizes(found, pb, path)
    found.raise_if_any()
    containers = tuple(
        [
            _container_from_pb(found, container, path, index)
            for index, container in enumerate(pb.containers)
        ]
    )
    pod = Pod(
        uid=pb.uid,
        namespace=pb.namespace,
        name=pb.name,
        containers=containers,
        phase=_enum_from_pb(
            found, POD_PHASE_FROM_PB, pb.status.phase, f"{path}.status.phase", PodPhase.UNKNOWN
        ),
        init_container_statuses=_statuses_from_pb(
            found, pb.status.init_container_statuses, f"{path}.status.init_container_statuses"
        ),
        container_statuses=_statuses_from_pb(
            found, pb.status.container_statuses, f"{path}.status.container_statuses"
        ),
        node_name=pb.node_name,
        # Read-only already: Pod would otherwise copy the mapping a second time to freeze it.
        annotations=MappingProxyType(dict(pb.annotations)),
        terminating=pb.terminating,
    )
    validate.check_pod(found, pod, path)
    found.raise_if_any()
    return pod


def _check_sizes(found: Violations, pb: types_pb2.Pod, path: str) -> None:
    # Refuse a huge repeated field before converting any element of it.
    if len(pb.containers) > limits.MAX_CONTAINERS:
        found.add(
            f"{path}.containers",
            f"at most {limits.MAX_CONTAINERS} containers, got {len(pb.containers)}",
        )
        return
    for index, container in enumerate(pb.containers):
        if len(container.grants) > limits.MAX_GRANTS_PER_CONTAINER:
            found.add(
                f"{path}.containers[{index}].grants",
                f"at most {limits.MAX_GRANTS_PER_CONTAINER} grants, got {len(container.grants)}",
            )
        if len(container.requests) > limits.MAX_REQUESTS_PER_CONTAINER:
            found.add(
                f"{path}.containers[{index}].requests",
                f"at most {limits.MAX_REQUESTS_PER_CONTAINER} requests, "
                f"got {len(container.requests)}",
            )
    for name, statuses in (
        ("init_container_statuses", pb.status.init_container_statuses),
        ("container_statuses", pb.status.container_statuses),
    ):
        if len(statuses) > limits.MAX_STATUSES:
            found.add(
                f"{path}.status.{name}",
                f"at most {limits.MAX_STATUSES} statuses, got {len(statuses)}",
            )


def _container_from_pb(
    found: Violations, pb: types_pb2.Container, pod_path: str, index: int
) -> Container:
    container_class = CONTAINER_CLASS_FROM_PB.get(pb.container_class)
    if container_class is None:
        # The path is only spelled out for an error: this runs for every container of every
        # request.
        found.add(
            f"{pod_path}.containers[{index}].container_class", _enum_message(pb.container_class)
        )
        # A placeholder so the remaining fields are still checked; the error is raised anyway.
        container_class = ContainerClass.APP
    grants = pb.grants
    return Container(
        pb.name,
        container_class,
        tuple([request_from_pb(request) for request in pb.requests]),
        tuple([grant_from_pb(grant) for grant in grants]) if grants else (),
    )


def _statuses_from_pb(
    found: Violations, statuses: Sequence[types_pb2.ContainerStatus], path: str
) -> tuple[ContainerStatus, ...]:
    if not statuses:
        # A pod being admitted has no status yet: skip building the generator for nothing.
        return ()
    return tuple(
        ContainerStatus(
            name=status.name,
            state=_enum_from_pb(
                found,
                CONTAINER_STATE_FROM_PB,
                status.state,
                f"{path}[{index}].state",
                ContainerState.UNKNOWN,
            ),
            exit_code=status.exit_code,
            restart_count=status.restart_count,
        )
        for index, status in enumerate(statuses)
    )


def _enum_from_pb(
    found: Violations, table: Mapping[int, T], value: int, path: str, fallback: T
) -> T:
    # proto3 enums are open: a newer client can send a number this build does not know.
    converted = table.get(value)
    if converted is None:
        found.add(path, f"unknown value {value}")
        return fallback
    return converted


def _enum_message(value: int) -> str:
    return (
        "must be set" if value == 0 else f"must be INIT, SIDECAR or APP, got unknown value {value}"
    )


def pod_to_pb(pod: Pod) -> types_pb2.Pod:
    """The typed message of a pod (the inverse of ``pod_from_pb`` for valid pods)."""
    return types_pb2.Pod(
        uid=pod.uid,
        namespace=pod.namespace,
        name=pod.name,
        node_name=pod.node_name,
        containers=[
            types_pb2.Container(
                name=container.name,
                container_class=CONTAINER_CLASS_TO_PB[container.container_class],
                requests=[request_to_pb(request) for request in container.requests],
                grants=[grant_to_pb(grant) for grant in container.grants],
            )
            for container in pod.containers
        ],
        status=types_pb2.PodStatus(
            phase=POD_PHASE_TO_PB[pod.phase],
            init_container_statuses=[status_to_pb(s) for s in pod.init_container_statuses],
            container_statuses=[status_to_pb(s) for s in pod.container_statuses],
        ),
        annotations=dict(pod.annotations),
        terminating=pod.terminating,
    )


def status_to_pb(status: ContainerStatus) -> types_pb2.ContainerStatus:
    return types_pb2.ContainerStatus(
        name=status.name,
        state=CONTAINER_STATE_TO_PB[status.state],
        exit_code=status.exit_code,
        restart_count=status.restart_count,
    )


_REQUEST_FIELDS = same_names(
    "vendor", "count", "memory_mib", "memory_percent", "core_percent", "slices"
)


def request_from_pb(pb: types_pb2.DeviceRequest) -> DeviceRequest:
    # Spelled out rather than through _REQUEST_FIELDS: this runs for every request of every
    # pod read, and a test holds it to the table.
    return DeviceRequest(
        pb.vendor, pb.count, pb.memory_mib, pb.memory_percent, pb.core_percent, pb.slices
    )


def request_to_pb(request: DeviceRequest) -> types_pb2.DeviceRequest:
    fields = to_wire(request, _REQUEST_FIELDS)
    if request.memory_unscaled:
        # On the wire, no memory and no percentage is the policy's default: the reader sizes it.
        fields["memory_mib"] = 0
    return types_pb2.DeviceRequest(**fields)


def container_grants_to_pb(
    pod: Pod, per_container: Sequence[Sequence[DeviceGrant]]
) -> list[types_pb2.ContainerGrants]:
    """Grants per position, labelled with the container each position belongs to."""
    if len(per_container) != len(pod.containers):
        raise ValueError(
            f"{len(per_container)} grant positions for {len(pod.containers)} containers "
            f"of pod {pod.key}"
        )
    return [
        types_pb2.ContainerGrants(
            container_name=container.name,
            container_class=CONTAINER_CLASS_TO_PB[container.container_class],
            grants=[grant_to_pb(grant) for grant in grants],
        )
        for container, grants in zip(pod.containers, per_container, strict=True)
    ]
