"""The usage store's metrics: the ledger totals of each node and namespace, and the count of
each decision the recorder makes.

Layer: services/usage (telemetry). Called by the store after each change
(services/usage/store.py); the metric families are in services/usage/metrics.py and
services/common/metrics.py.
"""

from __future__ import annotations

import prometheus_client

from accounting.ledger import Ledger
from services.common import metrics
from services.usage import metrics as usage_metrics

SERVICE = "usage"
"""The ``service`` label of this daemon's metrics."""


class StoreMetrics:
    """The children of the store's labelled metrics, kept once looked up: ``labels()`` takes a
    lock and checks its arguments, five times per recorded change otherwise."""

    def __init__(self) -> None:
        self._totals: dict[
            tuple[str, str], tuple[prometheus_client.Gauge, prometheus_client.Gauge]
        ] = {}
        self._decisions: dict[tuple[str, str], prometheus_client.Counter] = {}

    def set_total(self, scope: str, name: str, memory_mib: int, core_percent: int) -> None:
        """Publishes the ledger total of one node or namespace (as
        ``usage_metrics.set_ledger_total`` does)."""
        children = self._totals.get((scope, name))
        if children is None:
            if scope not in usage_metrics.LEDGER_SCOPES:
                raise ValueError(
                    f"scope must be one of {usage_metrics.LEDGER_SCOPES}, got {scope!r}"
                )
            children = self._totals[(scope, name)] = (
                usage_metrics.LEDGER_MEMORY_USED.labels(scope, name),
                usage_metrics.LEDGER_CORES_USED.labels(scope, name),
            )
        children[0].set(memory_mib)
        children[1].set(core_percent)

    def publish_node(self, ledger: Ledger, node_name: str) -> None:
        """Publishes what the ledger charges on a node (nothing for no name)."""
        if not node_name:
            return
        self.set_total("node", node_name, *ledger.node_totals(node_name))

    def publish_namespace(self, ledger: Ledger, namespace: str) -> None:
        """Publishes what the ledger charges in a namespace, summed over the policy's vendors
        (nothing for no name)."""
        if not namespace:
            return
        vendors = ledger.policy.vendors
        self.set_total(
            "namespace",
            namespace,
            sum(ledger.namespace_used(namespace, v.memory_resource) for v in vendors),
            sum(ledger.namespace_used(namespace, v.core_resource) for v in vendors),
        )

    def count_decision(self, decision: str, reason: str) -> None:
        """Counts one decision of this daemon (``metrics.record_decision``)."""
        child = self._decisions.get((decision, reason))
        if child is None:
            child = self._decisions[(decision, reason)] = metrics.DECISIONS.labels(
                service=SERVICE, decision=decision, reason=reason
            )
        child.inc()
