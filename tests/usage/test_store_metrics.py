"""The usage store's Prometheus series: ledger totals per node and namespace, and decisions.

The store keeps the series' children once looked up; these tests read the default registry, as
a scrape would, so a cached child that stopped being the registered one would show here.
"""

from __future__ import annotations

from prometheus_client import REGISTRY

from accounting.ledger import Ledger
from services.usage.store import UsageStore
from tests.builders import PodBuilder, device, gpu

NODE = "metrics-store-node"
NS = "metrics-store-ns"


def _total(metric: str, scope: str, name: str) -> float | None:
    return REGISTRY.get_sample_value(metric, {"scope": scope, "name": name})


def _decisions(decision: str, reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "hami_accounting_decisions_total",
        {"service": "usage", "decision": decision, "reason": reason},
    )
    return value or 0.0


def test_ledger_totals_follow_every_change_and_forgotten_updates_are_counted() -> None:
    store = UsageStore(Ledger(), None)
    store.register_node(NODE, (device("GPU-M0"), device("GPU-M1", index=1)))
    pod = (PodBuilder("p", namespace=NS, node=NODE)
           .app("a", gpu("GPU-M0", mib=4096, cores=20), gpu("GPU-M1", mib=1024, cores=5))
           .build())
    forgotten_before = _decisions("record", "Forgotten")

    store.record_pod(pod)
    for scope, name in (("node", NODE), ("namespace", NS)):
        assert _total("hami_accounting_ledger_memory_used_mib", scope, name) == 5120
        assert _total("hami_accounting_ledger_cores_used", scope, name) == 25

    store.forget_pod(pod.uid)
    store.record_pod(pod)  # a late update: charges nothing
    for scope, name in (("node", NODE), ("namespace", NS)):
        assert _total("hami_accounting_ledger_memory_used_mib", scope, name) == 0
        assert _total("hami_accounting_ledger_cores_used", scope, name) == 0
    assert _decisions("record", "Forgotten") == forgotten_before + 1
