"""A deliberately naive scheduler fit, the literal reading of the design, for the benchmark.

Layer: benchmark reference (pure; never imported by the services). It does what
docs/design.md §2.5 and HAMi's scoreNode describe word for word: one deep copy of the node's device
state for the steady pass (sidecars and apps, cumulative), and for every regular init container
a fresh deep copy of that steady copy as it stands at the init container's point, then a
per-device max over all copies. It recomputes and re-sorts every device score for every
container. accounting/fit/ gives the same answers without the copies; a property test pins
the two together, and ``python -m bench.naive_fit`` shows the difference in speed.

Written separately from accounting/fit/ on purpose (only the result types, reason strings and
annotation keys are shared), so that the cross-check can catch a slip in either.
"""

from __future__ import annotations

import copy
import itertools
import json
import sys
import time
import timeit
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from accounting import annotations as keys
from accounting import fit
from accounting import reasons as codes
from accounting.model import (
    Container,
    ContainerClass,
    Device,
    DeviceGrant,
    DeviceRequest,
    DeviceState,
    DeviceUsage,
    Pod,
)
from accounting.pod import collapse_grants
from accounting.quota import check_usage
from accounting.vendors import NVIDIA_RESOURCES, VendorResources


@dataclass
class _Card:
    """A mutable copy of one device, as HAMi's DeviceUsage."""

    position: int
    uuid: str
    model: str
    vendor: str
    mode: str
    index: int
    numa: int
    healthy: bool
    cordoned: bool
    slots_total: int
    memory_total: int
    cores_total: int
    slots_used: int
    memory_used: int
    cores_used: int
    pair_scores: dict[str, int]
    """The card's score with each other card (the node's hami.io/node-nvidia-score)."""

    def score(self, weights: tuple[int, int, int] = (1, 1, 1)) -> float:
        if self.slots_total == 0 or self.cores_total == 0 or self.memory_total == 0:
            return 0.0
        slot, core, memory = weights
        if weights == (1, 1, 1):
            return 10 * (
                self.slots_used / self.slots_total
                + self.cores_used / self.cores_total
                + self.memory_used / self.memory_total
            )
        return 10 * (
            float(slot) * (self.slots_used / self.slots_total)
            + float(core) * (self.cores_used / self.cores_total)
            + float(memory) * (self.memory_used / self.memory_total)
        )


def _weights(annotations: Mapping[str, str]) -> tuple[int, int, int]:
    """hami.io/device-scoring-weights as (slot, core, memory); only well-formed values are
    read here (the fit refuses the others before any node is tried)."""
    value = annotations.get(keys.DEVICE_SCORING_WEIGHTS_ANNOTATION)
    if value is None:
        return (1, 1, 1)
    pairs = dict(
        (key.strip(), int(number)) for key, number in (e.split("=") for e in value.split(","))
    )
    return (pairs["slot"], pairs["core"], pairs["memory"])


def _entries(value: str | None) -> list[str]:
    return [] if value is None else [e.strip() for e in value.split(",") if e.strip()]


def _less(a: _Card, b: _Card, policy: str, numa_bind: bool, weights: tuple[int, int, int]) -> bool:
    """HAMi's DeviceUsageList.Less, read literally (the list is walked from its end)."""
    sa, sb = a.score(weights), b.score(weights)
    if "," in policy or policy == "numa":
        chain: list[str] = []
        for word in policy.split(","):
            word = word.strip()
            if word in ("binpack", "spread", "numa") and word not in chain:
                chain.append(word)
        if not chain:
            chain = ["spread"]
        if numa_bind and chain[0] != "numa":
            chain = ["numa"] + [w for w in chain if w != "numa"]
        for word in chain:
            if word == "binpack" and sa != sb:
                return sa < sb
            if word == "spread" and sa != sb:
                return sa > sb
            if word == "numa" and a.numa != b.numa:
                return a.numa < b.numa
        return a.index < b.index
    if policy == "mutex":
        if a.slots_used != b.slots_used:
            return a.slots_used > b.slots_used
        return a.numa < b.numa
    binpack = policy == "binpack"
    if numa_bind:
        if binpack:
            return sa < sb if a.numa == b.numa else a.numa > b.numa
        return sa > sb if a.numa == b.numa else a.numa < b.numa
    if sa != sb:
        return sa < sb if binpack else sa > sb
    return a.numa < b.numa


def _walk_order(
    cards: list[_Card], policy: str, numa_bind: bool, weights: tuple[int, int, int]
) -> list[_Card]:
    """HAMi's sort of the node's list (index order to start with; a stable sort keeps equal
    cards so), then its walk from the end."""
    listed = sorted(cards, key=lambda c: (c.index, c.position))
    for i in range(1, len(listed)):  # insertion sort: stable, as Go's for short lists
        j = i
        while j > 0 and _less(listed[j], listed[j - 1], policy, numa_bind, weights):
            listed[j - 1], listed[j] = listed[j], listed[j - 1]
            j -= 1
    return listed[::-1]


def _topology(annotations: Mapping[str, str], vendor: VendorResources) -> bool:
    """The pod's GPU policy lists topology-aware (NVIDIA only)."""
    policy = annotations.get(keys.GPU_POLICY_ANNOTATION) or ""
    return vendor.vendor == "NVIDIA" and "topology-aware" in [p.strip() for p in policy.split(",")]


def _topology_choice(passed: list[_Card], count: int) -> list[_Card]:
    """HAMi's choice among every card that passed: all when exactly ``count``; one card: the
    first with the lowest sum of its scores with the others; more: the first combination, in
    walk order, with the highest sum of scores over its pairs."""
    if len(passed) == count:
        return passed
    if count == 1:
        worst: _Card | None = None
        worst_sum = 0
        for card in passed:
            total = sum(card.pair_scores.get(o.uuid, 0) for o in passed if o.uuid != card.uuid)
            if worst is None or total < worst_sum:
                worst, worst_sum = card, total
        assert worst is not None
        return [worst]
    best: tuple[_Card, ...] = ()
    best_sum = 0
    for combination in itertools.combinations(passed, count):
        total = sum(a.pair_scores.get(b.uuid, 0) for a, b in itertools.combinations(combination, 2))
        if not best or total > best_sum:
            best, best_sum = combination, total
    return list(best)


def _request(container: Container, vendor: VendorResources) -> DeviceRequest | None:
    for request in container.requests:
        if request.vendor == vendor.vendor and request.count > 0:
            return request
    return None


def _memory(request: DeviceRequest, card: _Card, vendor: VendorResources) -> int:
    if request.memory_mib > 0:
        return request.memory_mib * max(vendor.memory_factor, 1)
    if request.memory_percent > 0:
        return card.memory_total * min(request.memory_percent, 100) // 100
    if vendor.default_memory_mib > 0:
        return vendor.default_memory_mib
    return card.memory_total


QuotaTest = Callable[[_Card, int, int], bool]
"""Whether taking a card (with this memory and these cores) keeps the namespace in quota."""


def _refusal(
    card: _Card,
    request: DeviceRequest,
    annotations: Mapping[str, str],
    vendor: VendorResources,
    quota_allows: QuotaTest | None,
) -> str | None:
    """HAMi's NVIDIA Fit checks for one device, in HAMi's order."""
    if not card.healthy:
        return codes.CARD_NOT_HEALTH
    if card.cordoned and card.vendor == "NVIDIA":
        return codes.CARD_CORDONED
    model = card.model.lower()
    use_types = [t.lower() for t in _entries(annotations.get(keys.USE_GPU_TYPE_ANNOTATION))]
    nouse_types = [t.lower() for t in _entries(annotations.get(keys.NOUSE_GPU_TYPE_ANNOTATION))]
    mode = (annotations.get(keys.VGPU_MODE_ANNOTATION) or "").strip()
    if (
        card.vendor != vendor.vendor
        or (use_types and not any(t in model for t in use_types))
        or any(t in model for t in nouse_types)
        or (mode and card.mode not in annotations[keys.VGPU_MODE_ANNOTATION])
    ):
        return codes.CARD_TYPE_MISMATCH
    use_uuids = _entries(annotations.get(keys.USE_GPU_UUID_ANNOTATION))
    if (use_uuids and card.uuid not in use_uuids) or card.uuid in _entries(
        annotations.get(keys.NOUSE_GPU_UUID_ANNOTATION)
    ):
        return codes.CARD_UUID_MISMATCH
    if card.slots_total <= card.slots_used:
        return codes.CARD_TIME_SLICING_EXHAUSTED
    policy = annotations.get(keys.GPU_POLICY_ANNOTATION) or ""
    if "mutex" in [part.strip() for part in policy.split(",")] and card.slots_used > 0:
        return codes.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    cores = min(request.core_percent, 100)
    if quota_allows is not None and not quota_allows(card, _memory(request, card, vendor), cores):
        return codes.RESOURCE_QUOTA_NOT_FIT
    if card.memory_total - card.memory_used < _memory(request, card, vendor):
        return codes.CARD_INSUFFICIENT_MEMORY
    if card.cores_total - card.cores_used < cores:
        return codes.CARD_INSUFFICIENT_CORE
    if card.cores_total == 100 and cores == 100 and card.slots_used > 0:
        return codes.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
    if card.cores_total != 0 and card.cores_used == card.cores_total and cores == 0:
        return codes.CARD_COMPUTE_UNITS_EXHAUSTED
    return None


def _fit_container(
    cards: list[_Card],
    request: DeviceRequest,
    annotations: Mapping[str, str],
    vendor: VendorResources,
    policy: str,
    quota_allows: Callable[[list[_Card], _Card, int, int], bool] | None,
) -> list[_Card] | str:
    """Chosen cards (not yet charged), or the aggregated reason. HAMi walks every card in
    order and counts each under the first check it fails; the quota test of a card sees the
    cards already chosen for this container. With nvidia.com/numa-bind on an NVIDIA request
    the choice starts again at every NUMA node the walk enters after the type check."""
    if request.count > sum(1 for c in cards if c.vendor == vendor.vendor):
        return codes.NODE_INSUFFICIENT_DEVICE
    weights = _weights(annotations)
    numa_bind = annotations.get("nvidia.com/numa-bind") in ("1", "t", "T", "TRUE", "true", "True")
    ordered = _walk_order(cards, policy, numa_bind, weights)
    numa = numa_bind and vendor.vendor == "NVIDIA"
    previous_numa = -1
    chosen: list[_Card] = []
    reasons: dict[str, int] = {}
    topology = _topology(annotations, vendor)
    for card in ordered:
        test: QuotaTest | None = None
        if quota_allows is not None:
            test = lambda c, mib, cores, q=quota_allows, ch=chosen: q(ch, c, mib, cores)  # noqa: E731
        refusal = _refusal(card, request, annotations, vendor, test)
        before_numa = refusal in (
            codes.CARD_NOT_HEALTH, codes.CARD_CORDONED, codes.CARD_TYPE_MISMATCH
        )
        if numa and not before_numa and previous_numa != card.numa:
            if chosen and not topology:  # HAMi counts them only when it took some
                reasons[codes.NUMA_NOT_FIT] = reasons.get(codes.NUMA_NOT_FIT, 0) + len(chosen)
            chosen.clear()
            previous_numa = card.numa
            # The quota sees this NUMA node's cards only: checked again with none chosen.
            refusal = _refusal(card, request, annotations, vendor, test)
        if refusal is not None:
            reasons[refusal] = reasons.get(refusal, 0) + 1
            continue
        chosen.append(card)
        if len(chosen) == request.count and not topology:
            return chosen
    if topology and len(chosen) >= request.count:
        return _topology_choice(chosen, request.count)
    if chosen:
        reasons[codes.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(chosen)
    return ", ".join(sorted(f"{n}/{len(cards)} {r}" for r, n in reasons.items()))


def naive_fit_node(
    pod: Pod,
    node: fit.NodeState,
    *,
    vendor: VendorResources = NVIDIA_RESOURCES,
    gpu_policy: str = "spread",
    quota: fit.QuotaContext | None = None,
) -> fit.NodeFit:
    """Same contract as accounting.fit.fit_node, computed with a deep copy per pass."""
    policy = pod.annotations.get(keys.GPU_POLICY_ANNOTATION)
    if policy is None:
        policy = gpu_policy.strip().lower()
    original = [
        _Card(
            position,
            state.device.uuid,
            state.device.model,
            state.device.vendor,
            state.device.mode,
            state.device.index,
            state.device.numa,
            state.device.healthy,
            state.device.info("hami.io/device-cordon") == "true",
            state.device.slots_total,
            state.device.memory_total_mib,
            state.device.core_percent_total,
            state.slots_used,
            state.memory_used_mib,
            state.core_percent_used,
            json.loads(state.device.info("hami.io/node-nvidia-score") or "{}"),
        )
        for position, state in enumerate(node.devices)
    ]
    totals = [sum(c.slots_total for c in original), sum(c.cores_total for c in original)]
    totals.append(sum(c.memory_total for c in original))
    node_score = 0.0
    if all(totals):
        node_score = 10 * (
            sum(c.slots_used for c in original) / totals[0]
            + sum(c.cores_used for c in original) / totals[1]
            + sum(c.memory_used for c in original) / totals[2]
        )
    no_grants: tuple[tuple[DeviceGrant, ...], ...] = ((),) * len(pod.containers)

    def refused(reason: str) -> fit.NodeFit:
        return fit.NodeFit(node.node_name, False, reason, node_score, no_grants, ())

    steady = copy.deepcopy(original)
    init_copies: list[list[_Card]] = []
    grants: list[tuple[DeviceGrant, ...]] = [()] * len(pod.containers)
    # Apps start after every init container and sidecar, whatever the list order says.
    walk = sorted(
        enumerate(pod.containers), key=lambda pc: pc[1].container_class is ContainerClass.APP
    )
    for position, container in walk:
        request = _request(container, vendor)
        if request is None:
            continue
        is_init = container.container_class is ContainerClass.INIT
        cards = copy.deepcopy(steady) if is_init else steady
        quota_allows = None
        if quota is not None:
            quota_allows = _quota_test(pod, grants, position, vendor, quota)
        chosen = _fit_container(cards, request, pod.annotations, vendor, policy, quota_allows)
        if isinstance(chosen, str):
            return refused(chosen)
        cores = min(request.core_percent, 100)
        container_grants = []
        for card in chosen:
            memory = _memory(request, card, vendor)
            container_grants.append(DeviceGrant(card.uuid, vendor.vendor, memory, cores))
            card.slots_used += 1
            card.memory_used += memory
            card.cores_used += cores
        grants[position] = tuple(container_grants)
        if is_init:
            init_copies.append(cards)

    usage = []
    for position, base in enumerate(original):
        copies = [steady[position]] + [c[position] for c in init_copies]
        slots = max(c.slots_used for c in copies) - base.slots_used
        if slots == 0:
            continue
        memory = max(c.memory_used for c in copies) - base.memory_used
        cores = max(c.cores_used for c in copies) - base.cores_used
        usage.append(DeviceUsage(base.uuid, vendor.vendor, memory, cores, slots))
    usage.sort(key=lambda u: u.uuid)
    return fit.NodeFit(node.node_name, True, "", node_score, tuple(grants), tuple(usage))


def _quota_test(
    pod: Pod,
    grants: list[tuple[DeviceGrant, ...]],
    position: int,
    vendor: VendorResources,
    quota: fit.QuotaContext,
) -> Callable[[list[_Card], _Card, int, int], bool]:
    """HAMi's fitQuota for the container at ``position``: the grants handed out so far, the
    cards already chosen for this container and the candidate, folded as the pod would be
    stored (collapse_grants), checked against the namespace's quota (check_usage)."""

    def allows(chosen: list[_Card], card: _Card, memory_mib: int, cores: int) -> bool:
        hypothetical = list(grants)
        hypothetical[position] = tuple(
            DeviceGrant(c.uuid, vendor.vendor, m, cores)
            for c, m in [(c, memory_mib_of(c)) for c in chosen] + [(card, memory_mib)]
        )
        containers = [
            Container(c.name, c.container_class, (), g)
            for c, g in zip(pod.containers, hypothetical, strict=True)
        ]
        return check_usage(
            pod.namespace,
            collapse_grants(containers),
            quota.items,
            vendor,
            enforce_gpu_count=quota.enforce_gpu_count,
        ).allowed

    request = _request(pod.containers[position], vendor)
    assert request is not None

    def memory_mib_of(card: _Card) -> int:
        assert request is not None
        return _memory(request, card, vendor)

    return allows


def _benchmark_pod() -> Pod:
    def gpu(count: int, memory_mib: int, core_percent: int) -> tuple[DeviceRequest, ...]:
        return (DeviceRequest("NVIDIA", count, memory_mib, 0, core_percent),)

    return Pod(
        "uid-bench",
        "team-a",
        "bench",
        (
            Container("fetch-weights", ContainerClass.INIT, gpu(1, 8000, 30)),
            Container("log-shipper", ContainerClass.SIDECAR, gpu(1, 2000, 10)),
            Container("convert", ContainerClass.INIT, gpu(2, 4000, 20)),
            Container("server", ContainerClass.APP, gpu(1, 6000, 30)),
            Container("metrics", ContainerClass.APP, gpu(1, 1000, 5)),
        ),
    )


def _benchmark_nodes(count: int) -> list[fit.NodeState]:
    return [
        fit.NodeState(
            f"node-{n}",
            tuple(
                DeviceState(
                    Device(f"GPU-{n}-{i}", "NVIDIA A100-SXM4-40GB", i, 10, 40960, 100),
                    memory_used_mib=(n * 3 + i * 5) % 8 * 3000,
                    core_percent_used=(n + i * 7) % 6 * 10,
                    slots_used=(n + i) % 4,
                )
                for i in range(8)
            ),
        )
        for n in range(count)
    ]


def main() -> None:
    """Prints µs of compute per node: fit_pod, fit_node and the naive deep-copy fit."""
    pod, nodes = _benchmark_pod(), _benchmark_nodes(200)
    for node in nodes:
        assert fit.fit_node(pod, node) == naive_fit_node(pod, node)

    def best_per_node_us(run: Callable[[], object], repeat: int = 5, number: int = 10) -> float:
        # CPU time of this process: the machines are shared, wall time would count neighbours.
        times = timeit.repeat(run, repeat=repeat, number=number, timer=time.process_time)
        return min(times) / number / len(nodes) * 1e6

    rows = {
        "fit_pod (2 init, 1 sidecar, 2 apps; 8 GPUs)": best_per_node_us(
            lambda: fit.fit_pod(pod, nodes)
        ),
        "fit_node per node": best_per_node_us(lambda: [fit.fit_node(pod, n) for n in nodes]),
        "naive_fit_node per node": best_per_node_us(
            lambda: [naive_fit_node(pod, n) for n in nodes], repeat=3, number=1
        ),
    }
    for label, micros in rows.items():
        sys.stdout.write(f"{label:48s} {micros:8.1f} µs\n")


if __name__ == "__main__":
    main()
