"""Device grants and stored device usage between hami.accounting.v1 and accounting.model,
MIG instances included; Reserve's grants per container position in, validated.

Layer: services (adapter).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from accounting import limits, validate
from accounting.errors import Violations
from accounting.model import DeviceGrant, DeviceUsage, MigInstance, MigPlacement
from hami.accounting.v1 import types_pb2
from services.common.convert.wire_fields import from_wire, same_names, to_wire

# The wire keeps HAMi's word for the annotation's TYPE field and proto's first names; the
# domain names say what they hold: the vendor on grants and usage, the model on a device, and
# the unit of every number.
_GRANT_FIELDS = (
    ("vendor", "device_type"),
    *same_names("uuid", "memory_mib", "core_percent", "slots"),
)
_USAGE_FIELDS = _GRANT_FIELDS


def grant_from_pb(pb: types_pb2.DeviceGrant) -> DeviceGrant:
    fields = from_wire(pb, _GRANT_FIELDS)
    if pb.HasField("mig"):
        fields["mig"] = mig_instance_from_pb(pb.mig)
    return DeviceGrant(**fields)


def grant_to_pb(grant: DeviceGrant) -> types_pb2.DeviceGrant:
    pb = types_pb2.DeviceGrant(**to_wire(grant, _GRANT_FIELDS))
    if grant.mig is not None:
        pb.mig.CopyFrom(mig_instance_to_pb(grant.mig))
    return pb


def mig_placement_from_pb(pb: types_pb2.MigPlacement) -> MigPlacement:
    return MigPlacement(pb.start, pb.size)


def mig_placement_to_pb(placement: MigPlacement) -> types_pb2.MigPlacement:
    return types_pb2.MigPlacement(start=placement.start, size=placement.size)


def mig_instance_from_pb(pb: types_pb2.MigInstance) -> MigInstance:
    return MigInstance(pb.profile, mig_placement_from_pb(pb.placement))


def mig_instance_to_pb(instance: MigInstance) -> types_pb2.MigInstance:
    return types_pb2.MigInstance(
        profile=instance.profile, placement=mig_placement_to_pb(instance.placement)
    )


def grants_from_pb(
    container_grants: Sequence[types_pb2.ContainerGrants], path: str = "container_grants"
) -> tuple[tuple[DeviceGrant, ...], ...]:
    """Grants per container position (Reserve's ``container_grants``), validated.

    Raises:
        InvalidInputError: too many positions or grants, or any bad grant, e.g.
            ``container_grants[1].grants[0].memory_mib: must be between 0 and 2147483647``.
    """
    found = Violations()
    if len(container_grants) > limits.MAX_CONTAINERS:
        found.add(path, f"at most {limits.MAX_CONTAINERS} positions, got {len(container_grants)}")
        found.raise_if_any()
    per_container: list[tuple[DeviceGrant, ...]] = []
    for position, entry in enumerate(container_grants):
        entry_path = f"{path}[{position}].grants"
        if len(entry.grants) > limits.MAX_GRANTS_PER_CONTAINER:
            found.add(
                entry_path,
                f"at most {limits.MAX_GRANTS_PER_CONTAINER} grants, got {len(entry.grants)}",
            )
            per_container.append(())
            continue
        grants = tuple(grant_from_pb(grant) for grant in entry.grants)
        for index, grant in enumerate(grants):
            validate.check_grant(found, grant, f"{entry_path}[{index}]")
        per_container.append(grants)
    found.raise_if_any()
    return tuple(per_container)


def usage_from_pb(pb: types_pb2.DeviceUsage) -> DeviceUsage:
    return DeviceUsage(
        **from_wire(pb, _USAGE_FIELDS), mig=tuple(mig_instance_from_pb(m) for m in pb.mig)
    )


def usage_to_pb(usage: DeviceUsage) -> types_pb2.DeviceUsage:
    pb = types_pb2.DeviceUsage(**to_wire(usage, _USAGE_FIELDS))
    if usage.mig:
        pb.mig.extend(mig_instance_to_pb(m) for m in usage.mig)
    return pb


def usages_to_pb(usages: Iterable[DeviceUsage]) -> list[types_pb2.DeviceUsage]:
    return [usage_to_pb(usage) for usage in usages]
