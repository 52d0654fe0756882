"""HAMi's fit test tables (tests/support/hami_fit_cases.py) through accounting.fit.fit_pod.

Each case is read the way the scheduler daemon reads it: the pod from its Kubernetes JSON
(``accounting.kube.pod_json``), the quota from ``limits.nvidia.com/*`` keys, every node of the
case a candidate; the node, the cards per container and each failed node's reason must be
HAMi's.
The same cases run through the Filter RPC in tests/scheduler/test_hami_filter_cases.py.
"""

from __future__ import annotations

import pytest

from accounting.fit import FitResult, NodeState, QuotaContext, fit_node, fit_pod
from accounting.kube import pod_json
from accounting.model import QuotaItem
from accounting.quota import quota_items_from_limits
from accounting.vendors import NVIDIA_RESOURCES
from bench.naive_fit import naive_fit_node
from tests.support import hami_fit_cases
from tests.support.hami_fit_cases import HamiCase


def quota_context(case: HamiCase) -> QuotaContext | None:
    if not case.quota:
        return None
    items = quota_items_from_limits(case.quota, (NVIDIA_RESOURCES,))
    return QuotaContext(
        {
            resource: QuotaItem(resource, used=0, limit=limit, limit_set=True)
            for resource, limit in items.items()
        }
    )


def nodes(case: HamiCase) -> list[NodeState]:
    return [
        NodeState(name, tuple(card.state() for card in cards))
        for name, cards in case.nodes.items()
    ]


@pytest.mark.parametrize("case", hami_fit_cases.ALL, ids=lambda c: c.id)
def test_hami_fit_case(case: HamiCase) -> None:
    pod = pod_json.parse_pod(case.pod(uid=f"uid-{case.id.split()[0]}"), (NVIDIA_RESOURCES,))
    quota = quota_context(case)

    result = fit_pod(
        pod, nodes(case), node_policy=case.node_policy, gpu_policy=case.gpu_policy, quota=quota
    )

    assert_hami_fit(result, case)


def assert_hami_fit(result: FitResult, case: HamiCase) -> None:
    """The fit chose HAMi's node and cards, or refused with HAMi's reasons."""
    assert result.node_name == case.want_node, result.message
    if case.want_node is None:
        assert dict(result.failed_nodes) == dict(case.want_failed)
    if case.want_uuids is not None:
        granted = [tuple(g.uuid for g in grants) for grants in result.grants]
        assert granted == [tuple(uuids) for uuids in case.want_uuids]


@pytest.mark.parametrize("case", hami_fit_cases.ALL, ids=lambda c: c.id)
def test_hami_fit_case_equals_the_naive_fit_on_every_node(case: HamiCase) -> None:
    pod = pod_json.parse_pod(case.pod(uid="uid-naive"), (NVIDIA_RESOURCES,))
    quota = quota_context(case)
    for node in nodes(case):
        assert fit_node(pod, node, gpu_policy=case.gpu_policy, quota=quota) == naive_fit_node(
            pod, node, gpu_policy=case.gpu_policy, quota=quota
        )


def test_the_quota_takes_part_in_the_choice_of_card() -> None:
    # Q3: checked once on the card spread would take (device4, 6000 MiB), the node would be
    # refused; checked per card, the walk goes on to the 2000 MiB card that fits the quota.
    case = hami_fit_cases.RESOURCE_QUOTA[2]
    pod = pod_json.parse_pod(case.pod(uid="uid-q3"), (NVIDIA_RESOURCES,))
    node = nodes(case)[0]
    unlimited = fit_node(pod, node)
    limited = fit_node(pod, node, quota=quota_context(case))

    assert [g.uuid for g in unlimited.grants[0]] == ["device4"]
    assert [(g.uuid, g.memory_mib) for g in limited.grants[0]] == [("device1", 2000)]
