"""The vendors' terms of the node score (HAMi's ``ScoreNode``): Kunlunxin's whole cards, as data
from HAMi's tests, and Ascend 910's network term (HAMi has no test of it: the cases follow from
``pkg/device/ascend/device.go``), and what they change: the node ``fit_pod`` takes.

Read from Project-HAMi/HAMi at 4707fb02 (v2.10.0): ``pkg/device/kunlun/topo_test.go``
(``TestGetvalue``, ``TestCountbubble``, ``TestCalcscore``) and
``pkg/device/kunlun/device_test.go`` (``Test_ScoreNode``).
"""

from __future__ import annotations

import pytest

from accounting import kunlun, vendor_fit
from accounting.fit import NodeState, fit_node, fit_pod
from accounting.model import Container, ContainerClass, Device, DeviceRequest, DeviceState, Pod
from accounting.vendors import spec_for

TOPO_TEST = "pkg/device/kunlun/topo_test.go"
DEVICE_TEST = "pkg/device/kunlun/device_test.go"
KUNLUN = spec_for("kunlun").resources

# (source, cards of one wing, HAMi's value)
WING_VALUES = [(f"{TOPO_TEST}:131 TestGetvalue", cards, want)
               for cards, want in ((4, 0), (1, 2), (0, 1), (2, 1), (3, 1))]

# (source, card indexes, HAMi's countbubble)
FRAGMENTS = [
    (f"{TOPO_TEST}:149 TestCountbubble: 'empty'", (), 1),
    (f"{TOPO_TEST}:150 TestCountbubble: 'all left, full group of 4'", (0, 1, 2, 3), 1),
    (f"{TOPO_TEST}:151 TestCountbubble: 'single left device'", (0,), 3),
    (f"{TOPO_TEST}:152 TestCountbubble: 'single right device'", (4,), 3),
    (f"{TOPO_TEST}:153 TestCountbubble: 'two left devices'", (0, 1), 2),
]

# (source, indexes in use, indexes the pod takes, HAMi's term)
TERMS = [
    (f"{TOPO_TEST}:177 TestCalcscore: 'cur decreases fragmentation by 1'", (0,), (0, 1), 3000),
    (f"{TOPO_TEST}:178 TestCalcscore: 'cur unchanged'", (0,), (4,), 2000),
    (f"{TOPO_TEST}:179 TestCalcscore: 'cur increases fragmentation by 1'", (0, 1), (0,), 1000),
    (f"{TOPO_TEST}:180 TestCalcscore: 'cur increases fragmentation by 2'", (0, 1, 2, 3), (0,),
     0),
    (f"{DEVICE_TEST}:431 Test_ScoreNode: 'Scenario 1'", (0, 1, 2, 3), tuple(range(8)), 3000),
    (f"{DEVICE_TEST}:483 Test_ScoreNode: 'Scenario 2'", (), (0,), 0),
    ("derived: a difference of -2 is none of HAMi's cases, so 1000", (0,), tuple(range(8)),
     1000),
]


@pytest.mark.parametrize(("source", "cards", "want"), WING_VALUES, ids=[c[0] for c in WING_VALUES])
def test_a_wings_value_is_hamis(source: str, cards: int, want: int) -> None:
    assert kunlun._wing_value(cards) == want


@pytest.mark.parametrize(("source", "indexes", "want"), FRAGMENTS, ids=[c[0] for c in FRAGMENTS])
def test_a_sets_fragments_are_hamis(source: str, indexes: tuple[int, ...], want: int) -> None:
    assert kunlun._fragments(set(indexes)) == want


@pytest.mark.parametrize(("source", "used", "taken", "want"), TERMS, ids=[c[0] for c in TERMS])
def test_the_node_term_is_hamis(
    source: str, used: tuple[int, ...], taken: tuple[int, ...], want: int
) -> None:
    assert kunlun.node_score_term(used, taken) == want
    # Duplicates count once (HAMi's addidx) and the order does not matter.
    assert kunlun.node_score_term([*used, *used][::-1], [*taken, *taken][::-1]) == want


def kunlun_node(name: str, used: str, *, nvidia: bool = False) -> NodeState:
    cards = tuple(
        DeviceState(Device(f"{name}-k{i}", "kunlun", i, 100, 98304, 100, vendor="kunlun"),
                    *((98304, 100, 1) if flag == "1" else ()))
        for i, flag in enumerate(used)
    )
    if nvidia:
        cards += (DeviceState(Device(f"{name}-g0", "NVIDIA-A100", 0, 10, 40960, 100)),)
    return NodeState(name, cards)


def kunlun_pod(count: int) -> Pod:
    request = DeviceRequest("kunlun", count, 98304, 0, 100)
    return Pod("uid-k", "team-a", "k", (Container("main", ContainerClass.APP, (request,)),))


def test_the_term_changes_the_node_binpack_takes() -> None:
    """Derived from HAMi's scoreNode: node a holds one card, b two, so b is the busier (default
    score 5.03 against 2.51) and binpack alone takes it; one card on b leaves a wing of one
    more fragment (term 1000), on a as many (2000), so HAMi takes a."""
    a, b = kunlun_node("a", "10000000"), kunlun_node("b", "11000000")
    assert b.score > a.score

    result = fit_pod(kunlun_pod(1), [a, b], vendors=(KUNLUN,), node_policy="binpack")

    assert result.node_name == "a"
    assert [g.uuid for g in result.grants[0]] == ["a-k1"]
    assert dict(result.scores) == {"a": a.score + 2000, "b": b.score + 1000}
    assert fit_node(kunlun_pod(1), b, vendors=(KUNLUN,)).score == b.score + 1000


def test_a_node_with_any_other_device_adds_no_term() -> None:
    """HAMi's ScoreNode returns 0 when a device of the node is not a Kunlunxin card."""
    mixed = kunlun_node("m", "10000000", nvidia=True)
    fitted = fit_node(kunlun_pod(1), mixed, vendors=(KUNLUN,))
    assert fitted.fits
    assert fitted.score == mixed.score


def test_a_refused_node_keeps_its_default_score() -> None:
    full = kunlun_node("f", "11111111")
    fitted = fit_node(kunlun_pod(1), full, vendors=(KUNLUN,))
    assert not fitted.fits
    assert fitted.score == full.score


# -- Ascend 910: the network term -----------------------------------------------------------

ASCEND = "pkg/device/ascend/device.go ScoreNode"
NETWORK_TERMS = [
    (f"{ASCEND}: one container, both NPUs in one group", [["1", "1"]], 10.0),
    (f"{ASCEND}: one container, NPUs in two groups", [["0", "1"]], 5.0),
    (f"{ASCEND}: two containers, summed", [["0", "1"], ["2"]], 15.0),
    (f"{ASCEND}: an NPU without a NetworkID makes the term 0", [["1", "1"], ["1", None]], 0.0),
    (f"{ASCEND}: a NetworkID that is no number is not counted", [["x", "1", "1"]], 10.0),
    (f"{ASCEND}: a float NetworkID is its whole part", [["1.9", "1"]], 10.0),
    (f"{ASCEND}: nothing counted in a container adds nothing", [["x"], ["2", "2", "3"]],
     10 * 2 / 3),
]


@pytest.mark.parametrize(("source", "network_ids", "want"), NETWORK_TERMS,
                         ids=[c[0] for c in NETWORK_TERMS])
def test_the_ascend_network_term(
    source: str, network_ids: list[list[str | None]], want: float
) -> None:
    assert vendor_fit.network_term(network_ids) == pytest.approx(want)


def _ascend_node(name: str, networks: tuple[int, ...]) -> NodeState:
    return NodeState(name, tuple(
        DeviceState(Device(f"{name}-{i}", "Ascend910B3", i, 100, 65536, 100,
                           vendor="Ascend910B3", custom_info=(("NetworkID", str(net)),)))
        for i, net in enumerate(networks)
    ))


def test_the_network_term_changes_the_node_binpack_takes() -> None:
    """Two idle nodes of two NPUs, equal default scores: binpack alone takes the smaller name,
    a; HAMi adds 5 on a (its NPUs in two groups) and 10 on b (one group), so takes b."""
    a, b = _ascend_node("a", (0, 1)), _ascend_node("b", (1, 1))
    pod = Pod("uid-a", "team-a", "npu", (Container("main", ContainerClass.APP, (
        DeviceRequest("Ascend910B3", 2, 65536, 0, 0),)),))
    vendor = (spec_for("Ascend910B3").resources,)

    result = fit_pod(pod, [a, b], vendors=vendor, node_policy="binpack")

    assert result.node_name == "b"
    assert dict(result.scores) == {"a": a.score + 5, "b": b.score + 10}
    assert fit_pod(pod, [a, b], vendors=vendor, node_policy="spread").node_name == "a"
