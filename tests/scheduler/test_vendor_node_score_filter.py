"""Kunlunxin's term of the node score through the scheduler's path: the kernel leaves the
vendor's rules to the reference fit beside it, and the answer is fit_pod's, term included
(tests.accounting.test_vendor_node_score.py has HAMi's cases of the term itself)."""

from __future__ import annotations

import pytest

from accounting.fit import fit_plan, fit_pod
from accounting.vendors import spec_for
from services.scheduler import candidate_fit
from tests.accounting.test_vendor_node_score import kunlun_node, kunlun_pod
from tests.scheduler.test_fit_kernel import table_of

KUNLUN = spec_for("kunlun").resources


@pytest.mark.parametrize("node_policy", ["binpack", "spread"])
def test_the_scheduler_answers_as_fit_pod_with_the_term(node_policy: str) -> None:
    """Node a handed in as a NodeState, b and c through the node table: the same node, grants
    and scores as fit_pod; c, whose free wing is whole, takes a card that splits it (term 0)."""
    nodes = [kunlun_node(name, used)
             for name, used in (("a", "10000000"), ("b", "11000000"), ("c", "11110000"))]
    table = table_of(nodes[1:], [])
    columns, missing = table.gather(["b", "c"])
    assert missing == []
    pod = kunlun_pod(1)
    plan = fit_plan(pod, vendor=KUNLUN, node_policy=node_policy)
    assert plan is not None

    answer = candidate_fit.fit_columns(plan, columns, nodes[:1])

    expected = fit_pod(pod, nodes, vendor=KUNLUN, node_policy=node_policy)
    assert answer == expected
    assert dict(answer.scores) == {
        n.node_name: n.score + term for n, term in zip(nodes, (2000, 1000, 0), strict=True)
    }
