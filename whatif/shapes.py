"""Waiting pods grouped by shape: what the fit depends on besides the nodes, so that pods of
one shape fit the same nodes.

Layer: the what-if simulator (accounting and the standard library only). A shape is the
namespace, the containers' classes and requests, and the annotations the fit reads (hami.io and
nvidia.com). Once one pod of a shape has failed in a round, the others wait for the next
release; ``ShapeQueue`` keeps them, oldest first, with what a node must have free to be tried
for the shape at all and the change number after which the shape last failed everywhere.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from accounting.amount import ZERO, Amount
from accounting.fit import fit_plan, node_policy_for
from accounting.model import Pod
from accounting.pod import DeviceDemand
from accounting.vendors import VendorResources

_FIT_ANNOTATION_PREFIXES = ("hami.io/", "nvidia.com/")
"""Annotations the fit may read; a waiting pod's shape includes them."""


@dataclass(slots=True)
class ShapeQueue:
    """Waiting pods of one shape, oldest first, and when the shape last failed everywhere."""

    waiting: deque[int]
    node_policy: str
    """The pod's node policy (its annotation applied), as the fit's plan has it."""
    asks: tuple[DeviceDemand, ...]
    """What each container asks of each of its devices, as the fit's plan sizes it (a vendor
    charged by slot only asks nothing else). Necessary for a node to be tried at all: per
    container, that many of its cards must each take a device of it as the fit's capacity
    rule says (``DeviceDemand.on_card`` fits in what the card has free); a node without them
    would refuse the shape, since the fit checks the same on no more than the node has free."""
    most_devices: int
    """The coarse form of ``asks``, tested first: the most devices one container asks for..."""
    need: Amount
    """...and the least any of its devices takes on any card, enveloped over the containers
    (a share of a card counts as nothing here: its size depends on the card)."""
    fine: bool
    """The coarse test alone does not imply ``asks`` (several devices, or several
    containers)."""
    quota_bound: bool
    """Its namespace has a quota: the quota steers which cards the fit takes (and may refuse
    them), so a change of the namespace's usage makes every node worth trying again."""
    failed_seq: int = -1
    """Every node unchanged since this change number refuses the shape (-1: never tried)."""
    _on_card: dict[int, tuple[Amount, ...]] = field(default_factory=dict, init=False, repr=False)

    def on_card(self, memory_total_mib: int) -> tuple[Amount, ...]:
        """What one device of each ask takes on a card of ``memory_total_mib``
        (``DeviceDemand.on_card``, remembered per card size: a pool has few)."""
        taken = self._on_card.get(memory_total_mib)
        if taken is None:
            taken = tuple(demand.on_card(memory_total_mib) for demand in self.asks)
            self._on_card[memory_total_mib] = taken
        return taken

    @classmethod
    def for_pod(
        cls,
        pod: Pod,
        vendor: VendorResources,
        *,
        node_policy: str,
        gpu_policy: str,
        quota_bound: bool,
    ) -> ShapeQueue:
        """An empty queue for the pod's shape, its asks from the plan the fit makes of it.

        Raises:
            InvalidInputError: a policy is neither binpack nor spread.
        """
        plan = fit_plan(pod, vendor=vendor, node_policy=node_policy, gpu_policy=gpu_policy)
        asks: tuple[DeviceDemand, ...] = ()
        if plan is None:
            # No device of the vendor asked: every node passes, the fit answers.
            node_policy = node_policy_for(pod, node_policy)
        else:
            node_policy = plan.node_policy
            asks = tuple(ask.demand for ask in plan.asks)
        need = ZERO
        for demand in asks:
            # On a card of no memory a share is nothing: the least the device takes anywhere.
            need = need.join(demand.on_card(0))
        return cls(
            waiting=deque(),
            node_policy=node_policy,
            asks=asks,
            most_devices=max((demand.count for demand in asks), default=0),
            need=need,
            fine=len(asks) > 1 or any(demand.count > 1 for demand in asks),
            quota_bound=quota_bound,
        )


def shape_of(pod: Pod) -> object:
    """What the fit depends on besides the nodes: pods of one shape fit the same nodes."""
    return (
        pod.namespace,
        tuple((c.container_class, c.requests) for c in pod.containers),
        tuple(
            sorted(
                (key, value)
                for key, value in pod.annotations.items()
                if key.startswith(_FIT_ANNOTATION_PREFIXES)
            )
        ),
    )
