"""The ledger's quota limits: each namespace's limits by resource, and a namespace's items.

Layer: accounting (pure; a part of ``accounting.ledger.ledger.Ledger``, which alone changes it).
A namespace without a limit on a resource has no entry for it (absent = no limit); the used
amounts are the ledger's totals (``accounting.ledger.totals``) and are kept when limits change.
"""

from __future__ import annotations

from collections.abc import Mapping

from accounting.errors import Violations
from accounting.limits import MAX_QUOTA_LIMIT
from accounting.model import QuotaItem


class QuotaLimits:
    """namespace -> resource -> limit."""

    __slots__ = ("by_namespace",)

    def __init__(self) -> None:
        self.by_namespace: dict[str, dict[str, int]] = {}

    def set(self, namespace: str, limits: Mapping[str, int]) -> None:
        """Replaces a namespace's limits (keyed by resource name); each between 0 and
        ``MAX_QUOTA_LIMIT``, else bad input naming every one out of range, changing nothing."""
        bad = Violations()
        for resource, value in limits.items():
            if not 0 <= value <= MAX_QUOTA_LIMIT:
                bad.add(
                    f"limits[{resource!r}]",
                    f"must be between 0 and {MAX_QUOTA_LIMIT}, got {value}",
                )
        bad.raise_if_any()
        if limits:
            self.by_namespace[namespace] = dict(limits)
        else:
            self.by_namespace.pop(namespace, None)


def namespace_items(used: Mapping[str, int], limits: Mapping[str, int]) -> dict[str, QuotaItem]:
    """resource -> QuotaItem for every resource with usage or a limit, sorted by resource."""
    return {
        resource: QuotaItem(
            resource,
            used=used.get(resource, 0),
            limit=limits.get(resource, 0),
            limit_set=resource in limits,
        )
        for resource in sorted(set(used) | set(limits))
    }
