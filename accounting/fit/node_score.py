"""The score ``fit_pod`` compares the nodes that fit by: HAMi's default node score on the node
before the pod (``_NodeColumns.node_score``), plus the terms the vendors' own ``ScoreNode`` add
for the cards the pod is given there (HAMi's ``OverrideScore``).

Layer: accounting (pure). Two vendors of the table add a term in HAMi that the accounting
models:

* Kunlunxin's whole cards, on a node whose every device is one
  (``accounting.kunlun.node_score_term``, 0 to 3000: how the pod's cards fragment the wings);
* Ascend 910 chips, per chip (``accounting.vendor_fit.network_term``, up to 10 per container:
  how many of a container's NPUs share a network group).

The others add nothing in HAMi, or a term docs/design.md §7 lists as not modelled. A term needs
the grants, so they are read only on a node that has such devices; every other node's score is
the default one, as the fast paths read it.
"""

from __future__ import annotations

from accounting import kunlun, vendor_fit
from accounting.fit.grants import _grants, _NodePlacement
from accounting.fit.node_state import _NodeColumns
from accounting.fit.plan import _PodPlan
from accounting.vendor_data import ASCEND_TOPOLOGY_PREFIX, NETWORK_ID_INFO

KUNLUN_VENDOR = "kunlun"
"""The vendor of Kunlunxin's whole cards (HAMi's device type ``kunlun``; its vXPUs are ``XPU``
and add no term)."""


def adds_node_term(vendor: str) -> bool:
    """Whether a pod of ``vendor`` may get a term on the node score: then the node fit_pod
    takes is not always the first that fits in ``node_order_key`` order (the default score's)."""
    return vendor == KUNLUN_VENDOR or vendor.startswith(ASCEND_TOPOLOGY_PREFIX)


_KUNLUN_TERM = "kunlun"
_ASCEND_TERM = "ascend"


def _score_terms(columns: _NodeColumns) -> str:
    """The term the node's score gets: Kunlunxin's when every device is a Kunlunxin card,
    else Ascend's when an Ascend 910 chip is on it, else none (empty)."""
    devices = columns.devices
    kunlun_only = bool(devices)
    ascend = False
    for state in devices:
        vendor = state.device.vendor
        if vendor != KUNLUN_VENDOR:
            kunlun_only = False
            ascend = ascend or vendor.startswith(ASCEND_TOPOLOGY_PREFIX)
    if kunlun_only:
        return _KUNLUN_TERM
    return _ASCEND_TERM if ascend else ""


def placed_node_score(plan: _PodPlan, columns: _NodeColumns, placement: _NodePlacement) -> float:
    """The node's score with the pod placed on it as ``placement`` says."""
    score = columns.node_score
    terms = columns.score_terms
    if terms is None:
        terms = columns.score_terms = _score_terms(columns)
    if not terms:
        return score
    devices = columns.devices
    grants = _grants(plan, columns, placement)
    by_uuid = {state.device.uuid: state.device for state in devices}
    if terms == _KUNLUN_TERM:
        taken = [by_uuid[g.uuid].index for container in grants for g in container]
        used = [state.device.index for state in devices if state.slots_used > 0]
        return score + kunlun.node_score_term(used, taken)
    # One term per Ascend 910 chip the pod is given (HAMi scores each device type on its own),
    # over the containers given NPUs of it.
    per_chip: dict[str, list[list[str | None]]] = {}
    for container in grants:
        ids: dict[str, list[str | None]] = {}
        for grant in container:
            if grant.vendor.startswith(ASCEND_TOPOLOGY_PREFIX):
                ids.setdefault(grant.vendor, []).append(by_uuid[grant.uuid].info(NETWORK_ID_INFO))
        for chip, chip_ids in ids.items():
            per_chip.setdefault(chip, []).append(chip_ids)
    return score + sum(vendor_fit.network_term(per_chip[chip]) for chip in sorted(per_chip))
