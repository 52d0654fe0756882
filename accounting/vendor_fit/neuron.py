"""AWS Neuron: NeuronCores of one device, and runs of whole devices for several.

Layer: accounting (pure; called by ``accounting.vendor_fit.walk``). A Neuron device's compute is
a mask of its cores, charged by bit rather than by percent.
"""

from __future__ import annotations

from collections.abc import Sequence

from accounting.container_ask import ContainerAsk
from accounting.model import DeviceGrant
from accounting.reasons import (
    CARD_INSUFFICIENT_CORE,
    NUMA_NOT_FIT,
    format_reasons,
)
from accounting.vendor_data import (
    AWS_INSTANCE_TYPE_INFO,
    NEURON_BOTH_CORES,
    NEURON_CORES_PER_DEVICE,
)
from accounting.vendor_fit.cards import Card, Pick, RuleContext
from accounting.vendor_spec import VendorSpec


def neuron_cores(
    spec: VendorSpec, card: Card, cores: int
) -> tuple[str | None, DeviceGrant | None]:
    """AWS Neuron, one device: its NeuronCores are the bits of its compute; a free device
    gives its first core for one core asked and every core for two, a used one its other core
    (HAMi's ``addCoreUsage``)."""
    device = card.state.device
    if device.core_percent_total.bit_count() - card.cores_used.bit_count() < cores:
        return CARD_INSUFFICIENT_CORE, None
    if card.cores_used == 0:
        mask = NEURON_BOTH_CORES if cores == NEURON_CORES_PER_DEVICE else 1
    else:
        mask = NEURON_BOTH_CORES - card.cores_used
    mask &= device.core_percent_total
    return None, DeviceGrant(device.uuid, spec.vendor, 0, mask)


def neuron_picks(
    context: RuleContext, ask: ContainerAsk, cards: Sequence[Card]
) -> tuple[Pick, ...] | str:
    """AWS Neuron, several devices: consecutive free devices (by index) with every core of
    each; on ``inf`` instances from any device, elsewhere 1, 4, 8 or 16 devices from a multiple
    of that count (HAMi's ``graphSelect``). Nothing found is ``NumaNotFit`` once."""
    count = ask.demand.count
    by_index = sorted(cards, key=lambda card: card.state.device.index)
    total = len(cards)
    instance = by_index[0].state.device.info(AWS_INSTANCE_TYPE_INFO) if by_index else None
    if instance is None:
        return format_reasons({NUMA_NOT_FIT: 1}, total)
    ring = "inf" in instance.lower()
    if not ring and count not in (1, 4, 8, 16):
        return format_reasons({NUMA_NOT_FIT: 1}, total)
    step = 1 if ring else count
    for start in range(0, total, step):
        run = by_index[start : start + count]
        if len(run) == count and all(
            card.slots_used == 0 and card.state.device.healthy for card in run
        ):
            return tuple(
                (
                    card.position,
                    DeviceGrant(card.uuid, context.spec.vendor, card.state.device.memory_total_mib,
                                card.state.device.core_percent_total),
                )
                for card in run
            )
    return format_reasons({NUMA_NOT_FIT: 1}, total)
