"""The what-if replay: one workload, one accounting rule, every figure the report shows.

Layer: the what-if simulator (accounting and the standard library only). The replay drives the
parts the daemons use, in the order a cluster runs them, with only the rule changed
(accounting.counting_rules):

1. **arrival** (the pod's creation): the admission check, accounting.quota.check_quota on
   accounting.pod.effective_request of the pod as the rule counts it, against the namespace's
   usage in the ledger. A "no" refuses the pod for good, as the webhook does.
2. **scheduling**: accounting.fit on the nodes' current usage; the chosen devices are reserved
   with accounting.ledger.Ledger.reserve (its atomic capacity and quota re-check). A pod that
   fits no node waits.
3. **life**: its regular init containers run one after another for their recorded times, then
   its apps until the pod's end or the window's. Each change of status is recorded with
   Ledger.record (accounting.lifecycle: the shrink or the progressive release); the end is
   Ledger.forget.
4. **waiting pods** are tried again after every release, oldest first. Two pods with the same
   shape (whatif.shapes) fit the same nodes: once one has failed in a round, the others wait
   for the next release, and a shape is tried only on the nodes that changed since it last
   failed (all of them after its namespace's usage changed, when the namespace has a quota: the
   quota steers which cards the fit takes). A node left out would refuse the pod: a pod refused
   here is refused by fit_pod over every node too, and one placed goes where fit_pod puts it,
   at a fraction of the cost.

This module is the event loop and what each event does; the nodes in the scheduler's order are
whatif.node_pool's, one pod's state whatif.pod_life's, the cluster's figures over time
whatif.memory_totals', and what is reported whatif.results'.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import replace

from accounting.counting_rules import CountingRule, counted_pod
from accounting.fit import (
    NodeFit,
    NodeState,
    QuotaContext,
    adds_node_term,
    fit_node,
    fit_nodes,
    node_order_key,
)
from accounting.ledger import Ledger, LedgerChange
from accounting.lifecycle import StoredPod
from accounting.model import Device, DeviceGrant, Pod
from accounting.pod import effective_request
from accounting.quota import check_quota
from whatif.memory_totals import MemoryTotals, peak_and_mean
from whatif.node_pool import NodePool
from whatif.pod_life import ReplayedPod, phases_mib, statuses_after
from whatif.results import (
    NEVER_FITS,
    PENDING_AT_END,
    NamespaceFigures,
    Outcome,
    PodOutcome,
    RuleResult,
)
from whatif.settings import ReplaySettings
from whatif.shapes import ShapeQueue, shape_of
from whatif.workload import Workload


def replay(
    workload: Workload, rule: CountingRule, settings: ReplaySettings | None = None
) -> RuleResult:
    """Replays the workload under one rule.

    Raises:
        InvalidInputError: a policy in the settings is neither binpack nor spread.
    """
    return _Replay(workload, rule, settings or ReplaySettings()).run()


_RELEASE = 0
_ARRIVAL = 1


class _Replay:
    def __init__(self, workload: Workload, rule: CountingRule, settings: ReplaySettings) -> None:
        self.workload = workload
        self.rule = rule
        self.settings = settings
        self.vendor = settings.policy.vendors[0]
        self.enforce_gpu_count = settings.policy.enforce_gpu_count
        self.memory_resource = self.vendor.memory_resource
        self.ledger = Ledger(settings.policy, progressive_release=rule.progressive_release)
        self.inventories: dict[str, tuple[Device, ...]] = {}
        for node in workload.nodes:
            self.ledger.register_node(node.node_name, node.devices)
            self.inventories[node.node_name] = node.devices
        self.quota_namespaces = set()
        for namespace, limits in workload.quotas.items():
            self.ledger.set_quota(namespace, dict(limits))
            if limits:
                self.quota_namespaces.add(namespace)
        self.pool = NodePool(
            self.ledger, self.inventories, self.vendor.vendor, settings.node_policy
        )
        # Shapes are numbered once: a waiting pod's shape is looked up on every retry.
        shape_ids: dict[object, int] = {}
        self.pods = [
            ReplayedPod(i, p, counted, shape_ids.setdefault(shape_of(counted), len(shape_ids)))
            for i, p in enumerate(workload.pods)
            for counted in (counted_pod(p.pod, rule),)
        ]
        self.outcomes: dict[int, tuple[Outcome, str]] = {}
        self.request_mib: dict[int, int] = {}
        self.queues: dict[int, ShapeQueue] = {}
        self.round_changes: dict[int, set[str]] = {}
        self.events: list[tuple[int, int, int, int, int]] = []
        self.event_seq = 0
        self.totals = MemoryTotals()
        self.namespace_refused: dict[str, int] = {}
        self.phases_cache: dict[object, tuple[int, ...]] = {}

    # -- the ledger -----------------------------------------------------------------------

    def apply(self, pod: ReplayedPod, change: LedgerChange, now_s: int) -> None:
        if not change.changed:
            return
        self.totals.stored(pod, now_s, self.memory(change.before), self.memory(change.after))
        pool = self.pool
        for name in change.node_names:
            if name in pool.nodes:
                pool.node_changed(name)
        pool.namespace_changed(pod.counted.namespace)

    def memory(self, stored: StoredPod | None) -> int:
        if stored is None:
            return 0
        vendor = self.vendor.vendor
        return sum(u.memory_mib for u in stored.usage if u.vendor == vendor)

    # -- events ---------------------------------------------------------------------------

    def push(self, at_s: int, kind: int, index: int, step: int) -> None:
        self.event_seq += 1
        heapq.heappush(self.events, (at_s, kind, self.event_seq, index, step))

    def run(self) -> RuleResult:
        for index, replay_pod in enumerate(self.workload.pods):
            self.push(replay_pod.arrival_s, _ARRIVAL, index, 0)
        window = self.workload.window_s
        released = False
        events = self.events
        while events and events[0][0] <= window:
            now, kind, _, index, step = heapq.heappop(events)
            if kind == _RELEASE:
                self.step(index, step, now)
                released = True
            else:
                if released:
                    self.retry(now)
                    released = False
                self.arrive(index, now)
            if not events or events[0][0] != now:
                if released:
                    self.retry(now)
                    released = False
                self.totals.mark(now)
        return self.result()

    # -- arrival and scheduling -----------------------------------------------------------

    def arrive(self, index: int, now_s: int) -> None:
        replayed = self.pods[index]
        pod = replayed.counted
        request = effective_request(pod, self.vendor)
        self.request_mib[index] = request.memory_mib
        decision = check_quota(
            pod.namespace,
            request,
            self.ledger.namespace_items(pod.namespace),
            self.vendor,
            enforce_gpu_count=self.enforce_gpu_count,
        )
        if not decision.allowed:
            self.outcomes[index] = (Outcome.REFUSED, decision.reason)
            self.namespace_refused[pod.namespace] = self.namespace_refused.get(pod.namespace, 0) + 1
            return
        queue = self.queues.get(replayed.shape)
        if queue is None:
            queue = self.queues[replayed.shape] = ShapeQueue.for_pod(
                pod,
                self.vendor,
                node_policy=self.settings.node_policy,
                gpu_policy=self.settings.gpu_policy,
                quota_bound=pod.namespace in self.quota_namespaces,
            )
        queue.waiting.append(index)
        while queue.waiting and self.attempt(queue, now_s):
            pass

    def retry(self, now_s: int) -> None:
        """Tries the waiting pods again, oldest first, one try per shape and round."""
        heads = [(q.waiting[0], shape) for shape, q in self.queues.items() if q.waiting]
        heapq.heapify(heads)
        self.round_changes.clear()
        while heads:
            _, shape = heapq.heappop(heads)
            queue = self.queues[shape]
            if self.attempt(queue, now_s) and queue.waiting:
                heapq.heappush(heads, (queue.waiting[0], shape))

    def attempt(self, queue: ShapeQueue, now_s: int) -> bool:
        """Tries the oldest pod of a shape on the nodes that may have become able to take it."""
        pool = self.pool
        seq_at_try = pool.seq
        index = queue.waiting[0]
        namespace = self.pods[index].counted.namespace
        nodes: Iterator[NodeState]
        if queue.failed_seq < 0 or (
            queue.quota_bound and pool.namespace_seq.get(namespace, 0) > queue.failed_seq
        ):
            candidates = None
            nodes = pool.walk(queue)
        else:
            # Shapes that failed at the same moment share the set within one round.
            candidates = self.round_changes.get(queue.failed_seq)
            if candidates is None:
                candidates = pool.changed_since(queue.failed_seq)
                self.round_changes[queue.failed_seq] = candidates
            passing = pool.passing(queue, candidates)
            if not passing:
                # The usual retry: nothing that changed can take the shape.
                queue.failed_seq = seq_at_try
                return False
            nodes = iter(passing)
        chosen = self.first_fit(self.pods[index].counted, nodes)
        if chosen is None:
            # Every node refuses the shape now; those tried before and unchanged still do.
            queue.failed_seq = seq_at_try
            return False
        queue.waiting.popleft()
        self.place(self.pods[index], chosen, now_s)
        return True

    def first_fit(self, pod: Pod, nodes: Iterator[NodeState]) -> NodeFit | None:
        """The first node, in the order given, the pod fits (None if none); for a vendor with
        a term of its own on the node score, the best of those that fit, as fit_pod chooses."""
        first = next(nodes, None)
        if first is None:
            return None
        quota = None
        if pod.namespace in self.quota_namespaces:
            quota = QuotaContext(self.ledger.namespace_items(pod.namespace), self.enforce_gpu_count)
        fits = fit_nodes(
            pod,
            itertools.chain((first,), nodes),
            vendor=self.vendor,
            gpu_policy=self.settings.gpu_policy,
            quota=quota,
            explain_refusals=False,
        )
        if adds_node_term(self.vendor.vendor):
            # The vendor's term on the node score (accounting.fit.node_score) can reorder the
            # nodes that fit: fit_pod's choice is the best of all of them.
            policy = self.settings.node_policy
            fitted = [fit for fit in fits if fit.fits]
            if not fitted:
                return None
            return min(fitted, key=lambda f: node_order_key(f.score, f.node_name, policy))
        for fit in fits:
            if fit.fits:
                return fit
        return None

    def place(self, replayed: ReplayedPod, fit: NodeFit, now_s: int) -> None:
        pod = replayed.counted
        granted = replace(
            pod,
            containers=tuple(
                replace(c, grants=g) for c, g in zip(pod.containers, fit.grants, strict=True)
            ),
            node_name=fit.node_name,
        )
        outcome = self.ledger.reserve(granted, fit.node_name)
        if not outcome.reserved:
            # Reserve re-checks what the fit just checked on the same state: a refusal is a bug.
            raise RuntimeError(
                f"the fit placed {pod.key} on {fit.node_name} but Reserve refused it: "
                f"{outcome.reason} ({outcome.message})"
            )
        replayed.granted = granted
        replayed.node_name = fit.node_name
        replayed.placed_s = now_s
        declared = self.workload.pods[replayed.index]
        replayed.phases_mib = self.phases_mib(declared.pod, fit.grants)
        assert outcome.change is not None
        self.apply(replayed, outcome.change, now_s)
        self.totals.running(replayed, replayed.phases_mib[0], now_s)
        at = now_s
        for step, run_s in enumerate(declared.init_run_s):
            at += run_s
            self.push(at, _RELEASE, replayed.index, step)
        if declared.app_run_s is not None:
            self.push(at + declared.app_run_s, _RELEASE, replayed.index, len(declared.init_run_s))
        self.outcomes[replayed.index] = (Outcome.PLACED, "")

    def phases_mib(
        self, declared: Pod, grants: tuple[tuple[DeviceGrant, ...], ...]
    ) -> tuple[int, ...]:
        """pod_life.phases_mib, remembered: the memory totals of the phases depend only on
        each container's class and memory (sums are the same whichever cards they are on),
        and most pods of a workload share a handful of those."""
        vendor = self.vendor.vendor
        key = (
            tuple(c.container_class for c in declared.containers),
            tuple(sum(g.memory_mib for g in held if g.vendor == vendor) for held in grants),
        )
        phases = self.phases_cache.get(key)
        if phases is None:
            phases = self.phases_cache[key] = phases_mib(declared, grants, vendor)
        return phases

    # -- the pod's life -------------------------------------------------------------------

    def step(self, index: int, step: int, now_s: int) -> None:
        """Regular init container ``step`` exited 0, or (past the last one) the pod ended."""
        replayed = self.pods[index]
        declared = self.workload.pods[index]
        inits = len(declared.init_run_s)
        if step >= inits:
            self.apply(replayed, self.ledger.forget(declared.pod.uid), now_s)
            self.totals.running(replayed, 0, now_s)
            return
        assert replayed.granted is not None
        pod = statuses_after(replayed.granted, declared.pod, step + 1)
        self.apply(replayed, self.ledger.record(pod).change, now_s)
        self.totals.running(replayed, replayed.phases_mib[step + 1], now_s)

    # -- the result -----------------------------------------------------------------------

    def result(self) -> RuleResult:
        window = self.workload.window_s
        pods: list[PodOutcome] = []
        refused: dict[str, int] = {}
        placed = pending = waited_over = 0
        idle = unreserved = 0
        threshold = self.settings.wait_threshold_s
        never_fits: dict[int, str | None] = {}
        for replayed in self.pods:
            replayed.advance(window)
            idle += replayed.idle
            unreserved += replayed.unreserved
            outcome, reason = self.outcomes.get(replayed.index, (Outcome.PENDING, PENDING_AT_END))
            waited = 0
            if outcome is Outcome.PLACED:
                placed += 1
                assert replayed.placed_s is not None
                waited = replayed.placed_s - replayed.arrival_s
            elif outcome is Outcome.PENDING:
                waited = max(window - replayed.arrival_s, 0)
                if replayed.shape not in never_fits:
                    never_fits[replayed.shape] = self.fits_no_empty_node(replayed.counted)
                card_reason = never_fits[replayed.shape]
                if card_reason is None:
                    pending += 1
                else:
                    outcome, reason = Outcome.REFUSED, f"{NEVER_FITS}: {card_reason}"
            if outcome is Outcome.REFUSED:
                refused[reason] = refused.get(reason, 0) + 1
            if outcome is not Outcome.REFUSED and waited > threshold:
                waited_over += 1
            pods.append(
                PodOutcome(
                    key=replayed.counted.key,
                    outcome=outcome,
                    reason=reason,
                    request_mib=self.request_mib.get(replayed.index, 0),
                    node_name=replayed.node_name,
                    placed_s=replayed.placed_s,
                    waited_s=waited,
                    peak_stored_mib=replayed.peak_stored,
                )
            )
        totals = self.totals
        reserved, requested, idle_curve, unreserved_curve = totals.curves
        reserved_peak, reserved_mean = peak_and_mean(totals.times, reserved, window)
        requested_peak, requested_mean = peak_and_mean(totals.times, requested, window)
        return RuleResult(
            rule=self.rule,
            window_s=window,
            pods=tuple(pods),
            placed=placed,
            refused=dict(sorted(refused.items())),
            pending=pending,
            waited_over_threshold=waited_over,
            wait_threshold_s=threshold,
            peak_reserved_mib=reserved_peak,
            mean_reserved_mib=reserved_mean,
            peak_requested_mib=requested_peak,
            mean_requested_mib=requested_mean,
            idle_mib_s=idle,
            unreserved_mib_s=unreserved,
            namespaces=self.namespace_figures(),
            times_s=tuple(totals.times),
            reserved_mib=tuple(reserved),
            requested_mib=tuple(requested),
            idle_mib=tuple(idle_curve),
            unreserved_mib=tuple(unreserved_curve),
        )

    def fits_no_empty_node(self, pod: Pod) -> str | None:
        """None when the pod fits some node of the pool while it is empty; else the reason
        the first of them refuses it (counts dropped, e.g. CardInsufficientMemory)."""
        reasons: list[str] = []
        for empty in self.pool.empty_nodes():
            fit = fit_node(pod, empty, vendor=self.vendor, gpu_policy=self.settings.gpu_policy)
            if fit.fits:
                return None
            reasons.append(fit.reason)
        if not reasons:
            return "no nodes"
        return ", ".join(part.split(" ", 1)[-1] for part in reasons[0].split(", "))

    def namespace_figures(self) -> tuple[NamespaceFigures, ...]:
        namespaces = sorted({p.counted.namespace for p in self.pods} | set(self.workload.quotas))
        figures = []
        for namespace in namespaces:
            limits = self.workload.quotas.get(namespace, {})
            figures.append(
                NamespaceFigures(
                    namespace=namespace,
                    limit_mib=limits.get(self.memory_resource),
                    peak_used_mib=self.totals.namespace_peak.get(namespace, 0),
                    refused=self.namespace_refused.get(namespace, 0),
                )
            )
        return tuple(figures)
