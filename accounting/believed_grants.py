"""What the recorder believes a pod holds: its own reservation, else its annotations raised to
the pod's own request.

Layer: accounting (pure). A pod's allocation annotations are written by the scheduler and the
device plugin, but anyone who may patch the pod can rewrite them (docs/security.md, "Who may
write what"), so the recorder never takes a grant that matches neither the pod's own request nor
its own reservation (docs/design.md §3, "What the recorder believes"):

* a pod this recorder **reserved** (``StoredPod.reserved_grants``) holds the grants stored with
  the reservation, on the reserved node, whatever its annotations say now: an update cannot
  move, shrink or grow them (the placement was decided with them, and the device plugin
  handed out what the scheduler wrote from them);
* any other pod holds what its annotations grant, but **each grant at least what its container
  asks** of a device of that vendor (the memory, a share of the card sized on the card, the
  cores), for the vendors whose grant is the request itself; a grant above it stays (a whole
  card is given whole). MIG instances and the vendors with rules of their own (templates,
  profiles, masks, whole devices, per-pod shares) keep the grant as annotated: the device
  plugin creates exactly that instance or partition, so it is what the pod holds. A MIG
  grant holds its instance, so it is charged at least the memory and cores of the profile its
  card registers under that name, whatever memory the annotation writes beside it;
* the node is the one the pod is bound to (``spec.nodeName`` over ``hami.io/vgpu-node``, the
  Kubernetes reader's rule), and a grant naming a device that node does not have is refused
  by the ledger (``INVALID_ARGUMENT``, nothing stored): the device plugin cannot hand it out.

Nothing here lowers a charge below what the annotations grant, so an honest pod is charged
exactly as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from accounting.lifecycle import StoredPod
from accounting.mig import MIG_MODE
from accounting.model import Container, Device, DeviceGrant, Pod
from accounting.pod import device_demand
from accounting.vendor_spec import Charge, VendorSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Belief:
    """The pod as the recorder takes it, and what of the pod as sent it did not believe."""

    pod: Pod
    distrusted: tuple[str, ...] = ()
    """One sentence per thing not believed (for the log and the span); empty when the pod
    was taken as sent."""


def floors_grants(spec: VendorSpec) -> bool:
    """Whether a grant of ``spec``'s vendor is the container's request per device, so that
    the request is its floor: the generic and NVIDIA rules with percent cores, no per-pod
    share divided over the devices."""
    return (
        spec.charge is Charge.REQUEST
        and spec.rule in ("", "nvidia")
        and spec.core_unit == "percent"
        and not spec.totals_divided_by_count
    )


def believe(
    pod: Pod,
    stored: StoredPod | None,
    devices: Sequence[Device] | None,
    specs: Sequence[VendorSpec],
) -> Belief:
    """The pod with the grants the recorder believes (module docstring).

    Args:
        pod: the pod as sent (its grants read from its annotations, or typed).
        stored: what the recorder stores for it now (None: nothing).
        devices: the inventory of the pod's node, None when the node is not registered.
        specs: the policy's vendors.
    """
    if stored is not None and stored.reserved_grants is not None:
        return _reserved(pod, stored)
    by_uuid = {device.uuid: device for device in devices or ()}
    floored = [spec for spec in specs if floors_grants(spec)]
    distrusted: list[str] = []
    containers = tuple(
        _instances_sized(_raised(container, floored, by_uuid, distrusted), by_uuid, distrusted)
        for container in pod.containers
    )
    if not distrusted:
        return Belief(pod=pod)
    return Belief(pod=replace(pod, containers=containers), distrusted=tuple(distrusted))


def _reserved(pod: Pod, stored: StoredPod) -> Belief:
    reserved = stored.reserved_grants or ()
    grants = [reserved[i] if i < len(reserved) else () for i in range(len(pod.containers))]
    distrusted: list[str] = []
    sent = [container.grants for container in pod.containers]
    if pod.has_grants and sent != grants:
        distrusted.append(
            "the pod's allocation annotations differ from the reservation: the reserved "
            "grants are kept"
        )
    if pod.node_name and pod.node_name != stored.node_name:
        distrusted.append(
            f"the pod names node {pod.node_name}, the reservation {stored.node_name}: the "
            "reserved node is kept"
        )
    believed = replace(
        pod,
        node_name=stored.node_name,
        containers=tuple(
            container if container.grants == grants[i] else replace(container, grants=grants[i])
            for i, container in enumerate(pod.containers)
        ),
    )
    return Belief(pod=believed, distrusted=tuple(distrusted))


def _raised(
    container: Container,
    specs: Sequence[VendorSpec],
    devices: Mapping[str, Device],
    distrusted: list[str],
) -> Container:
    """The container with each grant of a flooring vendor raised to its request."""
    if not container.grants or not container.requests:
        return container
    grants = list(container.grants)
    for spec in specs:
        demand = device_demand(container, spec.resources)
        if demand is None:
            continue
        for index, grant in enumerate(grants):
            if grant.vendor != spec.vendor or grant.mig is not None:
                continue
            device = devices.get(grant.uuid)
            if device is not None and device.mode == MIG_MODE:
                continue
            if demand.memory_mib is not None:
                memory_mib = demand.memory_mib
            elif device is not None:
                memory_mib = demand.on_card(device.memory_total_mib).memory_mib
            else:
                memory_mib = 0  # a share of a card the recorder does not know: not sized
            raised = _at_least(grant, memory_mib, demand.core_percent)
            if raised is not grant:
                distrusted.append(
                    f"container {container.name} asks {memory_mib} MiB and {demand.core_percent}% "
                    f"of each {spec.vendor} device; its grant on {grant.uuid} says "
                    f"{grant.memory_mib} MiB and {grant.core_percent}%: charged the request"
                )
                grants[index] = raised
    return replace(container, grants=tuple(grants))


def _instances_sized(
    container: Container, devices: Mapping[str, Device], distrusted: list[str]
) -> Container:
    """The container with each MIG grant raised to its instance's profile on its card."""
    grants = list(container.grants)
    for index, grant in enumerate(grants):
        device = devices.get(grant.uuid)
        if grant.mig is None or device is None:
            continue
        profile = next((p for p in device.mig_profiles if p.name == grant.mig.profile), None)
        if profile is None:
            continue
        raised = _at_least(grant, profile.memory_mib, profile.core_percent)
        if raised is not grant:
            distrusted.append(
                f"container {container.name} holds a {profile.name} instance on {grant.uuid} "
                f"({profile.memory_mib} MiB, {profile.core_percent}%); its grant says "
                f"{grant.memory_mib} MiB and {grant.core_percent}%: charged the instance"
            )
            grants[index] = raised
    if grants == list(container.grants):
        return container
    return replace(container, grants=tuple(grants))


def _at_least(grant: DeviceGrant, memory_mib: int, core_percent: int) -> DeviceGrant:
    if grant.memory_mib >= memory_mib and grant.core_percent >= core_percent:
        return grant
    return replace(
        grant,
        memory_mib=max(grant.memory_mib, memory_mib),
        core_percent=max(grant.core_percent, core_percent),
    )
