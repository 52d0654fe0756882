"""One card's capacity for one container's ask (``accounting.fit.card_capacity_refusal``), as a
table: the first rule that refuses the card, in the fit's order, or None when it takes the ask."""

from __future__ import annotations

import pytest

from accounting.amount import Amount
from accounting.container_ask import ContainerAsk, container_ask
from accounting.fit import card_capacity_refusal
from accounting.model import Container, ContainerClass, DeviceRequest
from accounting.reasons import (
    CARD_COMPUTE_UNITS_EXHAUSTED,
    CARD_INSUFFICIENT_CORE,
    CARD_INSUFFICIENT_MEMORY,
    CARD_TIME_SLICING_EXHAUSTED,
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT,
)
from accounting.vendors import NVIDIA_SPEC

CARD = Amount(memory_mib=40960, core_percent=100, slots=4)
EXCLUSIVE = EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT


def ask(memory_mib: int = 0, memory_percent: int = 0, core_percent: int = 0) -> ContainerAsk:
    request = DeviceRequest("NVIDIA", 1, memory_mib, memory_percent, core_percent)
    made = container_ask(
        order=0,
        position=0,
        container=Container("c", ContainerClass.APP, (request,)),
        spec=NVIDIA_SPEC,
    )
    assert made is not None
    return made


@pytest.mark.parametrize(
    ("the_ask", "used", "refusal"),
    [
        (ask(memory_mib=10000, core_percent=30), Amount(), None),
        (ask(memory_mib=10000, core_percent=30), Amount(31000, 0, 1), CARD_INSUFFICIENT_MEMORY),
        # A share of the card is sized on this card: half of 40960 MiB.
        (ask(memory_percent=50, core_percent=10), Amount(20480, 0, 1), None),
        (ask(memory_percent=50, core_percent=10), Amount(20481, 0, 1), CARD_INSUFFICIENT_MEMORY),
        (ask(memory_mib=1000, core_percent=30), Amount(0, 80, 1), CARD_INSUFFICIENT_CORE),
        (ask(memory_mib=1000, core_percent=30), Amount(0, 0, 4), CARD_TIME_SLICING_EXHAUSTED),
        # Every core asked of a 100-core card with a task on it, even one using no cores.
        (ask(memory_mib=1000, core_percent=100), Amount(0, 0, 1), EXCLUSIVE),
        (ask(memory_mib=1000, core_percent=100), Amount(), None),
        # No cores asked of a card whose compute is all given away.
        (ask(memory_mib=1000), Amount(0, 100, 1), CARD_COMPUTE_UNITS_EXHAUSTED),
        (ask(memory_mib=1000), Amount(0, 90, 1), None),
    ],
)
def test_the_first_rule_that_refuses_the_card(
    the_ask: ContainerAsk, used: Amount, refusal: str | None
) -> None:
    assert card_capacity_refusal(the_ask, used, CARD) == refusal
