"""Why each card was or was not given to each container of a pod on one node: HAMi's walk, card
by card, for a reader (``hami-accounting explain --node``), beside the fit's own answer.

Layer: accounting (pure). The fit keeps only what it needs (the picks, and on failure the count
of reasons); this walks the same containers over the same cards in the same order with the same
per-card check (``refusal._card_verdicts``, which the fit's refusal count reads too), so what it
shows is what decided. tests/accounting/test_card_walk.py pins its taken cards and its reasons to
``fit_node``'s grants and refusals.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass

from accounting import vendor_fit
from accounting.fit.answer import NodeFit
from accounting.fit.node_fit import _fit_node
from accounting.fit.node_state import NodeState, _NodeColumns
from accounting.fit.place import _blocks, _scores
from accounting.fit.plan import _always_within, _PodPlan, _vendor_list, _VendorPlan
from accounting.fit.policies import SPREAD
from accounting.fit.quota_walk import QuotaContext, _QuotaWalk
from accounting.fit.refusal import _card_verdicts, _walk_reasons
from accounting.model import Pod
from accounting.pair_scores import card_scores
from accounting.reasons import CARD_UUID_MISMATCH, NODE_INSUFFICIENT_DEVICE
from accounting.vendor_data import PAIR_SCORES_INFO
from accounting.vendor_fit import topology
from accounting.vendors import NVIDIA_RESOURCES, VendorResources

TAKEN = "taken"
"""The walk gave the card to the container."""
NOT_TRIED = "not tried"
"""The walk had the container's cards before it came to this one."""
LEFT_BY_TOPOLOGY = "left by topology-aware"
"""The card passed every check, but the topology-aware policy chose others among those that
passed (the node's pair scores: ``accounting.vendor_fit.topology``)."""


@dataclass(frozen=True, slots=True)
class CardVerdict:
    """One card as one container's walk met it."""

    uuid: str
    index: int
    numa: int
    verdict: str
    """``TAKEN``, ``NOT_TRIED`` or the reason code that refused the card (CardCordoned,
    NumaNotFit, ExclusiveDeviceAllocateConflict, ...)."""


@dataclass(frozen=True, slots=True)
class ContainerWalk:
    """One container's walk over one vendor's cards of the node."""

    container: str
    vendor: str
    cards: tuple[CardVerdict, ...]
    """In the order the walk tried them, then the cards it never tries (refused by their
    health, cordon, type or UUID before any order), then those it did not reach."""
    refusal: str = ""
    """Why the node is refused at this container (the walk goes no further), or empty."""
    by_vendor_rules: bool = False
    """The vendor's own walk (accounting.vendor_fit) places this container: no card list."""


def card_walks(
    pod: Pod,
    node: NodeState,
    *,
    vendor: VendorResources = NVIDIA_RESOURCES,
    vendors: Sequence[VendorResources] = (),
    gpu_policy: str = SPREAD,
    quota: QuotaContext | None = None,
) -> tuple[NodeFit, tuple[ContainerWalk, ...]]:
    """``fit_node``'s answer for the pod on the node, and each container's walk over the
    cards of each vendor it asks for, in fitting order, up to the container the node is
    refused at.

    Raises:
        InvalidInputError: as ``fit_node``.
    """
    plan = _PodPlan.build(pod, _vendor_list(vendor, vendors), gpu_policy, quota)
    fitted = _fit_node(plan, node)
    columns = node._columns
    walks: list[ContainerWalk] = []
    for vendor_plan in plan.vendor_plans:
        if vendor_fit.needs_rules(vendor_plan.spec, columns.devices):
            walks.extend(
                ContainerWalk(
                    pod.containers[ask.position].name, vendor_plan.vendor_name, (),
                    by_vendor_rules=True,
                )
                for ask in vendor_plan.asks
            )
        else:
            walks.extend(_vendor_walks(plan, vendor_plan, columns, pod, fitted))
    return fitted, tuple(walks)


def _vendor_walks(
    plan: _PodPlan, vendor_plan: _VendorPlan, columns: _NodeColumns, pod: Pod, fitted: NodeFit
) -> list[ContainerWalk]:
    """The generic walk of ``accounting.fit.place._place_vendor``, container by container,
    recording each card's verdict. Under topology-aware (NVIDIA's walk in the fit, which
    collects every card that passes and then chooses) every card is visited, the chosen ones
    are taken and the others passed are ``LEFT_BY_TOPOLOGY``; a container refused there
    carries the fit's reason (HAMi counts no NumaNotFit under the policy)."""
    topology = vendor_plan.by_topology
    vendor_name = vendor_plan.vendor_name
    devices = columns.devices
    blocks = _blocks(devices, vendor_name, vendor_plan.device_filter)
    ours = [p for p in range(len(devices)) if devices[p].device.vendor == vendor_name]
    slots_free = list(columns.slots_free)
    memory_free = list(columns.memory_free)
    cores_free = list(columns.cores_free)
    room = vendor_plan.quota_room
    quota = None
    if room is not None and (
        topology or not _always_within(vendor_plan, room, columns.memory_total)
    ):
        quota = _QuotaWalk(room, len(devices))
    numa_groups = vendor_plan.numa_groups
    walks: list[ContainerWalk] = []
    for ask in vendor_plan.asks:
        name = pod.containers[ask.position].name
        if ask.count > len(ours):
            walks.append(ContainerWalk(name, vendor_name, (), NODE_INSUFFICIENT_DEVICE))
            break
        tasks = list(map(operator.sub, columns.slots_total, slots_free))
        scores = _scores(
            plan.score, columns, tasks,
            list(map(operator.sub, columns.cores_total, cores_free)),
            list(map(operator.sub, columns.memory_total, memory_free)),
        )
        key = plan.order.key_of(scores, columns.numas, tasks, columns.rank, columns.index_rank)
        walkable = [
            p for p in ours
            if blocks[p] is None or (numa_groups and blocks[p] == CARD_UUID_MISMATCH)
        ]
        order = sorted(walkable, key=key)
        verdicts = _card_verdicts(
            ask, blocks, order, columns, (slots_free, memory_free, cores_free), quota,
            plan.mutex, numa_groups, count=None if topology else ask.count,
        )
        walked = {p for p, _ in verdicts}
        picks = [p for p, reason in verdicts if reason is None]
        if topology:
            verdicts, picks = _topology_choice(verdicts, picks, ask.count, columns)
        # A card in the order is listed once: where the walk met it, else as not tried (under
        # numa-bind a card refused by UUID is in the order, since the walk checks the UUID
        # after the NUMA node; one it did not reach was never checked).
        in_order = set(order)
        cards: list[tuple[int, str]] = [
            *((p, reason or TAKEN) for p, reason in verdicts),
            *((p, block) for p in ours
              if (block := blocks[p]) is not None and p not in walked and p not in in_order),
            *((p, NOT_TRIED) for p in order if p not in walked),
        ]
        refusal = ""
        if topology and len(picks) < ask.count:
            refusal = fitted.reason
        elif len(picks) < ask.count:
            refusal = _walk_reasons(
                ask, blocks, order, columns, (slots_free, memory_free, cores_free), quota,
                vendor_name, len(ours), plan.mutex, numa_groups,
            )
        walks.append(ContainerWalk(
            name,
            vendor_name,
            tuple(
                CardVerdict(
                    devices[p].device.uuid, devices[p].device.index, devices[p].device.numa,
                    verdict,
                )
                for p, verdict in cards
            ),
            refusal,
        ))
        if refusal:
            break
        for p in picks:
            memory = ask.memory_on_card(columns.memory_total[p])
            if quota is not None:
                quota.commit(ask.is_init, p, memory, ask.core_percent)
            if not ask.is_init:
                slots_free[p] -= 1
                memory_free[p] -= memory
                cores_free[p] -= ask.core_percent
    return walks


def _topology_choice(
    verdicts: list[tuple[int, str | None]], passed: list[int], count: int, columns: _NodeColumns
) -> tuple[list[tuple[int, str | None]], list[int]]:
    """The verdicts and picks once the topology-aware policy has chosen among the cards that
    passed, as the fit's walk chooses. Too few passed: they stay taken, as the walk had them
    when it ran out (AllocatedCardsInsufficientRequest); past the choice's bound none is
    taken."""
    if len(passed) < count:
        return verdicts, passed
    devices = columns.devices
    uuids = [devices[p].device.uuid for p in passed]
    scores = {
        devices[p].device.uuid: card_scores(devices[p].device.info(PAIR_SCORES_INFO))
        for p in passed
    }
    places = topology.choose(uuids, count, scores)
    chosen = [passed[i] for i in places or ()]
    kept = set(chosen)
    return [
        (p, LEFT_BY_TOPOLOGY if reason is None and p not in kept else reason)
        for p, reason in verdicts
    ], chosen
