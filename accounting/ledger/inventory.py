"""The ledger's inventory: each registered node's devices, and what a pod's grants mean on them.

Layer: accounting (pure; a part of ``accounting.ledger.ledger.Ledger``, which alone changes it).
The informer may see a pod before its node: against a node that is not registered, nothing is
checked and nothing is changed.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence

from accounting.errors import Violations
from accounting.mig import MIG_MODE, UNKNOWN_INSTANCE, whole_card
from accounting.model import Device, MigInstance, Pod


class NodeInventory:
    """node -> its registered devices, in registration order."""

    __slots__ = ("devices",)

    def __init__(self) -> None:
        self.devices: dict[str, tuple[Device, ...]] = {}

    def register(self, node_name: str, devices: Sequence[Device]) -> None:
        """Registers or replaces a node's inventory."""
        # Interned UUIDs: the pods' usage (interned too) then shares them instead of copies.
        self.devices[sys.intern(node_name)] = tuple(
            device if sys.intern(device.uuid) is device.uuid
            else dataclasses.replace(device, uuid=sys.intern(device.uuid))
            for device in devices
        )

    def forget(self, node_name: str) -> bool:
        """Drops a node's inventory; True when it was registered."""
        return self.devices.pop(node_name, None) is not None

    def check_grants(
        self, pod: Pod, node_name: str | None = None, path: str = "pod.containers"
    ) -> None:
        """A grant for a UUID the (registered) node does not have is bad input."""
        node = node_name or pod.node_name
        devices = self.devices.get(node)
        if devices is None:
            return  # The informer may see a pod before its node; accept what we cannot check.
        known = {d.uuid for d in devices}
        bad = Violations()
        for index, container in enumerate(pod.containers):
            for grant_index, grant in enumerate(container.grants):
                if grant.uuid not in known:
                    bad.add(
                        f"{path}[{index}].grants[{grant_index}].uuid",
                        f"node {node} has no device {grant.uuid}",
                    )
        bad.raise_if_any()

    def close_unknown_instances(self, pod: Pod, node_name: str) -> Pod:
        """A grant on a registered MIG-mode card that names no instance (its
        hami.io/vgpu-mig-allocations entry is missing) holds the whole card: where its instance
        is cannot be known, so nothing else is placed there until the pod goes (HAMi marks such
        a card unhealthy)."""
        devices = self.devices.get(node_name)
        if not devices:
            return pod
        mig_cards = {d.uuid: d for d in devices if d.mode == MIG_MODE}
        if not mig_cards or not any(
            g.mig is None and g.uuid in mig_cards for c in pod.containers for g in c.grants
        ):
            return pod
        containers = tuple(
            dataclasses.replace(
                container,
                grants=tuple(
                    dataclasses.replace(
                        grant,
                        mig=MigInstance(
                            UNKNOWN_INSTANCE, whole_card(mig_cards[grant.uuid].mig_profiles)
                        ),
                    )
                    if grant.mig is None and grant.uuid in mig_cards
                    else grant
                    for grant in container.grants
                ),
            )
            for container in pod.containers
        )
        return dataclasses.replace(pod, containers=containers)
