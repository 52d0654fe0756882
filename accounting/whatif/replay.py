"""The what-if replay: one workload, one accounting rule, every figure the report shows.

Layer: accounting (pure). The replay drives the parts the daemons use, in the order a cluster
runs them, with only the rule changed (accounting.counting_rules):

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
   shape (namespace, container classes and requests, hami.io and nvidia.com annotations) fit
   the same nodes: once one has failed in a round, the others wait for the next release, and a
   shape is tried only on the nodes that changed since it last failed (all of them after its
   namespace's usage changed, when the namespace has a quota: the quota steers which cards
   the fit takes). A node left out would refuse the pod: a pod refused here is refused by
   fit_pod over every node too, and one placed goes where fit_pod puts it, at a fraction of
   the cost.

The scheduler's node choice is fit_pod's: nodes are walked in ``fit.node_order_key`` order and
the first that fits is taken (fit_pod takes the best key among all that fit: the same node).

Figures, per pod (``PodOutcome``) and for the rule (``RuleResult``): placed, refused by reason,
still pending, how long pods waited; GPU memory reserved (what the ledger stores) and requested
by the containers running at that moment (the declared classes: an init container with the
sidecars declared before it, then sidecars and apps), over time; reserved-but-idle and
running-beyond-reservation MiB·s (per pod, then summed); each namespace's peak usage against
its quota.
"""

from __future__ import annotations

import bisect
import enum
import heapq
import itertools
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

from accounting.amount import ZERO, Amount
from accounting.counting_rules import CountingRule, counted_pod
from accounting.fit import (
    BINPACK,
    SPREAD,
    NodeFit,
    NodeState,
    QuotaContext,
    device_score,
    fit_node,
    fit_nodes,
    node_order_key,
    node_policy_for,
)
from accounting.fold import phases
from accounting.ledger import Ledger, LedgerChange
from accounting.lifecycle import StoredPod
from accounting.model import (
    Container,
    ContainerClass,
    ContainerState,
    ContainerStatus,
    Device,
    DeviceGrant,
    DeviceState,
    Pod,
    PodPhase,
)
from accounting.pod import device_demand, effective_request
from accounting.policy import DEFAULT_POLICY, AccountingPolicy
from accounting.quota import check_quota
from accounting.vendors import VendorResources
from accounting.whatif.workload import ReplayPod, Workload

PENDING_AT_END = "Pending"
"""Reason of a pod still waiting when the window ends though it fits an empty node."""
NEVER_FITS = "NoNodeFits"
"""Reason prefix of a pod that fits no node of the pool even empty, e.g.
``NoNodeFits: CardInsufficientMemory``."""

_FIT_ANNOTATION_PREFIXES = ("hami.io/", "nvidia.com/")
"""Annotations the fit may read; a waiting pod's shape includes them."""


class Outcome(enum.Enum):
    """How a pod's replay ended."""

    PLACED = "placed"
    REFUSED = "refused"
    """Refused at admission (quota), or it fits no node of the pool even when empty."""
    PENDING = "pending"
    """Still waiting for capacity when the window ended."""


@dataclass(frozen=True, slots=True)
class ReplaySettings:
    """What the scheduler and the report are configured with (the same for every rule)."""

    wait_threshold_s: int = 60
    """Pods that wait longer than this are counted."""
    node_policy: str = BINPACK
    gpu_policy: str = SPREAD
    policy: AccountingPolicy = DEFAULT_POLICY
    """The recorder's policy; the replay accounts its first vendor's devices."""


@dataclass(frozen=True, slots=True)
class PodOutcome:
    """One pod under one rule."""

    key: str
    """namespace/name."""
    outcome: Outcome
    reason: str
    """"" when placed; the quota reason code; ``NoNodeFits: <card reason>``; ``Pending``."""
    request_mib: int
    """The effective memory request the admission check saw (as the rule counts the pod)."""
    node_name: str
    placed_s: int | None
    waited_s: int
    """From arrival to placement, or to the window's end when never placed."""
    peak_stored_mib: int
    """The most the ledger stored for the pod at any time."""


@dataclass(frozen=True, slots=True)
class NamespaceFigures:
    """One namespace's GPU memory under one rule."""

    namespace: str
    limit_mib: int | None
    """limits.nvidia.com/gpumem; None without a quota on memory."""
    peak_used_mib: int
    refused: int
    """Pods of the namespace refused at admission."""

    @property
    def min_headroom_mib(self) -> int | None:
        """The least quota left at any time (limit - peak usage)."""
        return None if self.limit_mib is None else self.limit_mib - self.peak_used_mib


@dataclass(frozen=True, slots=True)
class RuleResult:
    """Every figure of one rule's replay."""

    rule: CountingRule
    window_s: int
    pods: tuple[PodOutcome, ...]
    """In workload order."""
    placed: int
    refused: Mapping[str, int]
    """Reason -> pods."""
    pending: int
    waited_over_threshold: int
    """Pods that waited (or were still waiting) longer than the threshold."""
    wait_threshold_s: int
    peak_reserved_mib: int
    mean_reserved_mib: int
    peak_requested_mib: int
    mean_requested_mib: int
    idle_mib_s: int
    """Σ over pods of ∫ max(0, stored - requested by its running containers) dt."""
    unreserved_mib_s: int
    """Σ over pods of ∫ max(0, requested by its running containers - stored) dt: use the rule
    did not reserve (an under-count: the card can be handed out twice)."""
    namespaces: tuple[NamespaceFigures, ...]
    times_s: tuple[int, ...]
    """Moments the totals changed, from 0; the totals hold until the next moment."""
    reserved_mib: tuple[int, ...]
    requested_mib: tuple[int, ...]
    idle_mib: tuple[int, ...]
    """Σ over pods of max(0, stored - requested by its running containers), per moment."""
    unreserved_mib: tuple[int, ...]
    """Σ over pods of max(0, requested by its running containers - stored), per moment."""


def replay(
    workload: Workload, rule: CountingRule, settings: ReplaySettings | None = None
) -> RuleResult:
    """Replays the workload under one rule.

    Raises:
        InvalidInputError: a policy in the settings is neither binpack nor spread.
    """
    return _Replay(workload, rule, settings or ReplaySettings()).run()


# -- the replay -----------------------------------------------------------------------------

_RELEASE = 0
_ARRIVAL = 1


class _Live:
    """A pod's mutable state during one replay (private; results are frozen)."""

    __slots__ = (
        "arrival_s",
        "counted",
        "granted",
        "idle",
        "index",
        "last_s",
        "node_name",
        "peak_stored",
        "phases_mib",
        "placed_s",
        "running",
        "shape",
        "stored",
        "unreserved",
    )

    def __init__(self, index: int, replay_pod: ReplayPod, counted: Pod, shape: int) -> None:
        self.index = index
        self.arrival_s = replay_pod.arrival_s
        self.counted = counted
        self.shape = shape
        self.granted: Pod | None = None
        self.node_name = ""
        self.placed_s: int | None = None
        self.phases_mib: tuple[int, ...] = ()
        """Memory its running containers request: one entry per regular init, then steady."""
        self.stored = 0
        self.running = 0
        self.peak_stored = 0
        self.last_s = 0
        self.idle = 0
        self.unreserved = 0

    def advance(self, now_s: int) -> None:
        elapsed = now_s - self.last_s
        if elapsed > 0:
            gap = self.stored - self.running
            if gap > 0:
                self.idle += gap * elapsed
            else:
                self.unreserved -= gap * elapsed
        self.last_s = now_s


@dataclass(slots=True)
class _ShapeQueue:
    """Waiting pods of one shape, oldest first, and when the shape last failed everywhere."""

    waiting: deque[int]
    node_policy: str
    asks: tuple[tuple[int, int, int], ...]
    """Necessary for a node to be tried at all, per container: (devices, memory MiB, cores)
    that many of its devices with a free slot must each have free; a node without it would
    refuse the shape (the fit checks the same, on no more than the node has free)."""
    need: tuple[int, int, int]
    """The coarse form of ``asks``: tested first, on three numbers per node."""
    fine: bool
    """``need`` alone does not imply ``asks`` (several devices, or several containers)."""
    quota_bound: bool
    """Its namespace has a quota: the quota steers which cards the fit takes (and may refuse
    them), so a change of the namespace's usage makes every node worth trying again."""
    failed_seq: int = -1
    """Every node unchanged since this change number refuses the shape (-1: never tried)."""


class _NodeSummary:
    """A node's place in the scheduler's order and what the cheap pre-check reads; the
    NodeState the fit needs is built only when the node is tried."""

    __slots__ = (
        "_state",
        "devices",
        "devices_with_slot",
        "free",
        "max_cores_free",
        "max_memory_free_mib",
        "name",
        "score",
        "used",
    )

    def __init__(
        self,
        name: str,
        devices: tuple[Device, ...],
        used: Mapping[str, tuple[int, int, int]],
        vendor: str,
    ) -> None:
        self.name = name
        self.devices = devices
        self.used = used
        self._state: NodeState | None = None
        with_slot = 0
        memory_free = cores_free = -1
        free: list[tuple[int, int]] = []
        slots_used = slots_total = cores_used = cores_total = memory_used = memory_total = 0
        for device in devices:
            memory, cores, slots = used.get(device.uuid, (0, 0, 0))
            slots_used += slots
            slots_total += device.slots_total
            cores_used += cores
            cores_total += device.core_percent_total
            memory_used += memory
            memory_total += device.memory_total_mib
            if not device.healthy or device.vendor != vendor or slots >= device.slots_total:
                continue
            with_slot += 1
            memory_free = max(memory_free, device.memory_total_mib - memory)
            cores_free = max(cores_free, device.core_percent_total - cores)
            free.append((device.memory_total_mib - memory, device.core_percent_total - cores))
        self.free = tuple(free)
        self.devices_with_slot = with_slot
        self.max_memory_free_mib = memory_free
        self.max_cores_free = cores_free
        # NodeState.score, from the same sums.
        self.score = device_score(
            slots_used, slots_total, cores_used, cores_total, memory_used, memory_total
        )

    @property
    def state(self) -> NodeState:
        if self._state is None:
            used = self.used
            self._state = NodeState(
                self.name,
                tuple(
                    DeviceState(d, *used[d.uuid]) if d.uuid in used else DeviceState(d)
                    for d in self.devices
                ),
            )
        return self._state

    def takes(self, asks: tuple[tuple[int, int, int], ...]) -> bool:
        """Each container's devices could each find a device with a free slot and enough
        memory and cores free (counted per container: a necessary condition only)."""
        free = self.free
        for count, memory_mib, core_percent in asks:
            enough = 0
            for memory_free, cores_free in free:
                if memory_free >= memory_mib and cores_free >= core_percent:
                    enough += 1
            if enough < count:
                return False
        return True

    def key(self, node_policy: str) -> tuple[float, str]:
        return node_order_key(self.score, self.name, node_policy)


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
        # Default node-policy order of every node: (key, name), kept sorted as usage changes.
        self.default_policy = node_policy_for_default(settings.node_policy)
        self.nodes: dict[str, _NodeSummary] = {}
        self.order: list[tuple[float, str]] = []
        for name in self.inventories:
            summary = self.summarise(name)
            self.nodes[name] = summary
            bisect.insort(self.order, summary.key(self.default_policy))
        self.seq = 0
        self.node_seq: dict[str, int] = dict.fromkeys(self.inventories, 0)
        self.namespace_seq: dict[str, int] = {}
        self.change_log: list[tuple[int, str]] = []
        # Shapes are numbered once: a waiting pod's shape is looked up on every retry.
        shape_ids: dict[object, int] = {}
        self.live = [
            _Live(i, p, counted, shape_ids.setdefault(_shape(counted), len(shape_ids)))
            for i, p in enumerate(workload.pods)
            for counted in (counted_pod(p.pod, rule),)
        ]
        self.outcomes: dict[int, tuple[Outcome, str]] = {}
        self.request_mib: dict[int, int] = {}
        self.queues: dict[int, _ShapeQueue] = {}
        self.round_changes: dict[int, set[str]] = {}
        self.events: list[tuple[int, int, int, int, int]] = []
        self.event_seq = 0
        self.reserved = 0
        self.requested = 0
        self.namespace_used: dict[str, int] = {}
        self.namespace_peak: dict[str, int] = {}
        self.namespace_refused: dict[str, int] = {}
        self.idle = 0
        self.unreserved = 0
        self.phases_cache: dict[object, tuple[int, ...]] = {}
        self.times: list[int] = [0]
        # Reserved, requested, reserved but idle, running beyond reservation; one value per time.
        self.curves: tuple[list[int], ...] = ([0], [0], [0], [0])
        self._empty_nodes: list[NodeState] | None = None

    # -- nodes ----------------------------------------------------------------------------

    def summarise(self, name: str) -> _NodeSummary:
        return _NodeSummary(
            name, self.inventories[name], self.ledger.node_usage(name), self.vendor.vendor
        )

    def node_changed(self, name: str) -> None:
        old = self.nodes[name]
        new = self.summarise(name)
        self.nodes[name] = new
        old_key = old.key(self.default_policy)
        new_key = new.key(self.default_policy)
        if old_key != new_key:
            del self.order[bisect.bisect_left(self.order, old_key)]
            bisect.insort(self.order, new_key)
        self.seq += 1
        self.node_seq[name] = self.seq
        self.change_log.append((self.seq, name))

    def changed_since(self, seq: int) -> set[str]:
        start = bisect.bisect_right(self.change_log, (seq, "\uffff"))
        return {name for _, name in self.change_log[start:]}

    # -- the ledger -----------------------------------------------------------------------

    def apply(self, live: _Live, change: LedgerChange, now_s: int) -> None:
        if not change.changed:
            return
        before = self.memory(change.before)
        after = self.memory(change.after)
        self.settle(live, now_s, after, live.running)
        live.peak_stored = max(live.peak_stored, after)
        self.reserved += after - before
        namespace = live.counted.namespace
        used = self.namespace_used.get(namespace, 0) + after - before
        self.namespace_used[namespace] = used
        self.namespace_peak[namespace] = max(self.namespace_peak.get(namespace, 0), used)
        for name in change.node_names:
            if name in self.nodes:
                self.node_changed(name)
        self.seq += 1
        self.namespace_seq[namespace] = self.seq

    def memory(self, stored: StoredPod | None) -> int:
        if stored is None:
            return 0
        vendor = self.vendor.vendor
        return sum(u.memory_mib for u in stored.usage if u.vendor == vendor)

    def set_running(self, live: _Live, running_mib: int, now_s: int) -> None:
        self.requested += running_mib - live.running
        self.settle(live, now_s, live.stored, running_mib)

    def settle(self, live: _Live, now_s: int, stored_mib: int, running_mib: int) -> None:
        """Closes the pod's stretch at its old figures, then takes the new ones (also into
        the cluster's idle and beyond-reservation totals)."""
        live.advance(now_s)
        gap = live.stored - live.running
        if gap > 0:
            self.idle -= gap
        else:
            self.unreserved += gap
        live.stored = stored_mib
        live.running = running_mib
        gap = stored_mib - running_mib
        if gap > 0:
            self.idle += gap
        else:
            self.unreserved -= gap

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
                self.mark(now)
        return self.result()

    def mark(self, now_s: int) -> None:
        """Adds a point to the curves when a total changed at ``now_s``."""
        point = (self.reserved, self.requested, self.idle, self.unreserved)
        curves = self.curves
        if point == tuple(curve[-1] for curve in curves):
            return
        if self.times[-1] == now_s:
            for curve, value in zip(curves, point, strict=True):
                curve[-1] = value
            return
        self.times.append(now_s)
        for curve, value in zip(curves, point, strict=True):
            curve.append(value)

    # -- arrival and scheduling -----------------------------------------------------------

    def arrive(self, index: int, now_s: int) -> None:
        live = self.live[index]
        pod = live.counted
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
        queue = self.queues.get(live.shape)
        if queue is None:
            asks = _asks(pod, self.vendor)
            queue = self.queues[live.shape] = _ShapeQueue(
                deque(),
                node_policy_for(pod, self.settings.node_policy),
                asks,
                _need(asks),
                len(asks) > 1 or any(count > 1 for count, _, _ in asks),
                pod.namespace in self.quota_namespaces,
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

    def attempt(self, queue: _ShapeQueue, now_s: int) -> bool:
        """Tries the oldest pod of a shape on the nodes that may have become able to take it."""
        seq_at_try = self.seq
        index = queue.waiting[0]
        namespace = self.live[index].counted.namespace
        nodes: Iterator[NodeState]
        if queue.failed_seq < 0 or (
            queue.quota_bound and self.namespace_seq.get(namespace, 0) > queue.failed_seq
        ):
            candidates = None
            nodes = self.walk(queue)
        else:
            # Shapes that failed at the same moment share the set within one round.
            candidates = self.round_changes.get(queue.failed_seq)
            if candidates is None:
                candidates = self.changed_since(queue.failed_seq)
                self.round_changes[queue.failed_seq] = candidates
            passing = self.passing(queue, candidates)
            if not passing:
                # The usual retry: nothing that changed can take the shape.
                queue.failed_seq = seq_at_try
                return False
            nodes = iter(passing)
        chosen = self.first_fit(self.live[index].counted, nodes)
        if chosen is None:
            # Every node refuses the shape now; those tried before and unchanged still do.
            queue.failed_seq = seq_at_try
            return False
        queue.waiting.popleft()
        self.place(self.live[index], chosen, now_s)
        return True

    def first_fit(self, pod: Pod, nodes: Iterator[NodeState]) -> NodeFit | None:
        """The first node, in the order given, the pod fits (None if none)."""
        first = next(nodes, None)
        if first is None:
            return None
        quota = None
        if pod.namespace in self.quota_namespaces:
            quota = QuotaContext(self.ledger.namespace_items(pod.namespace), self.enforce_gpu_count)
        for fit in fit_nodes(
            pod,
            itertools.chain((first,), nodes),
            vendor=self.vendor,
            gpu_policy=self.settings.gpu_policy,
            quota=quota,
            explain_refusals=False,
        ):
            if fit.fits:
                return fit
        return None

    def walk(self, queue: _ShapeQueue) -> Iterator[NodeState]:
        """Every node in the order fit_pod prefers them, without those that surely refuse the
        shape."""
        if queue.node_policy != self.default_policy:
            yield from self.passing(queue, self.nodes)
            return
        nodes = self.nodes
        devices, memory_mib, core_percent = queue.need
        fine = queue.fine
        # Not changed while this walks it: a placement ends the walk. The coarse test is
        # inlined: this loop visits every busy node before the first that may take the pod.
        for _, name in self.order:
            summary = nodes[name]
            if (
                summary.devices_with_slot >= devices
                and summary.max_memory_free_mib >= memory_mib
                and summary.max_cores_free >= core_percent
                and (not fine or summary.takes(queue.asks))
            ):
                yield summary.state

    def passing(self, queue: _ShapeQueue, names: Iterable[str]) -> list[NodeState]:
        """Those of the named nodes that may take the shape, in the order fit_pod prefers."""
        nodes = self.nodes
        devices, memory_mib, core_percent = queue.need
        fine = queue.fine
        passing = [
            summary
            for summary in map(nodes.__getitem__, names)
            if summary.devices_with_slot >= devices
            and summary.max_memory_free_mib >= memory_mib
            and summary.max_cores_free >= core_percent
            and (not fine or summary.takes(queue.asks))
        ]
        if len(passing) > 1:
            policy = queue.node_policy
            passing.sort(key=lambda summary: summary.key(policy))
        return [summary.state for summary in passing]

    def place(self, live: _Live, fit: NodeFit, now_s: int) -> None:
        pod = live.counted
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
        live.granted = granted
        live.node_name = fit.node_name
        live.placed_s = now_s
        declared = self.workload.pods[live.index]
        live.phases_mib = self.phases_mib(declared.pod, fit.grants)
        assert outcome.change is not None
        self.apply(live, outcome.change, now_s)
        self.set_running(live, live.phases_mib[0], now_s)
        at = now_s
        for step, run_s in enumerate(declared.init_run_s):
            at += run_s
            self.push(at, _RELEASE, live.index, step)
        if declared.app_run_s is not None:
            self.push(at + declared.app_run_s, _RELEASE, live.index, len(declared.init_run_s))
        self.outcomes[live.index] = (Outcome.PLACED, "")

    def phases_mib(
        self, declared: Pod, grants: tuple[tuple[DeviceGrant, ...], ...]
    ) -> tuple[int, ...]:
        """_phases_mib, remembered: the memory totals of the phases depend only on each
        container's class and memory (sums are the same whichever cards they are on), and
        most pods of a workload share a handful of those."""
        vendor = self.vendor.vendor
        key = (
            tuple(c.container_class for c in declared.containers),
            tuple(sum(g.memory_mib for g in held if g.vendor == vendor) for held in grants),
        )
        phases = self.phases_cache.get(key)
        if phases is None:
            phases = self.phases_cache[key] = _phases_mib(declared, grants, vendor)
        return phases

    # -- the pod's life -------------------------------------------------------------------

    def step(self, index: int, step: int, now_s: int) -> None:
        """Regular init container ``step`` exited 0, or (past the last one) the pod ended."""
        live = self.live[index]
        declared = self.workload.pods[index]
        inits = len(declared.init_run_s)
        if step >= inits:
            self.apply(live, self.ledger.forget(declared.pod.uid), now_s)
            self.set_running(live, 0, now_s)
            return
        assert live.granted is not None
        pod = _with_statuses(live.granted, declared.pod, step + 1)
        self.apply(live, self.ledger.record(pod).change, now_s)
        self.set_running(live, live.phases_mib[step + 1], now_s)

    # -- the result -----------------------------------------------------------------------

    def result(self) -> RuleResult:
        window = self.workload.window_s
        pods: list[PodOutcome] = []
        refused: dict[str, int] = {}
        placed = pending = waited_over = 0
        idle = unreserved = 0
        threshold = self.settings.wait_threshold_s
        never_fits: dict[int, str | None] = {}
        for live in self.live:
            live.advance(window)
            idle += live.idle
            unreserved += live.unreserved
            outcome, reason = self.outcomes.get(live.index, (Outcome.PENDING, PENDING_AT_END))
            waited = 0
            if outcome is Outcome.PLACED:
                placed += 1
                assert live.placed_s is not None
                waited = live.placed_s - live.arrival_s
            elif outcome is Outcome.PENDING:
                waited = max(window - live.arrival_s, 0)
                if live.shape not in never_fits:
                    never_fits[live.shape] = self.fits_no_empty_node(live.counted)
                card_reason = never_fits[live.shape]
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
                    key=live.counted.key,
                    outcome=outcome,
                    reason=reason,
                    request_mib=self.request_mib.get(live.index, 0),
                    node_name=live.node_name,
                    placed_s=live.placed_s,
                    waited_s=waited,
                    peak_stored_mib=live.peak_stored,
                )
            )
        reserved, requested, idle_curve, unreserved_curve = self.curves
        reserved_peak, reserved_mean = _peak_and_mean(self.times, reserved, window)
        requested_peak, requested_mean = _peak_and_mean(self.times, requested, window)
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
            times_s=tuple(self.times),
            reserved_mib=tuple(reserved),
            requested_mib=tuple(requested),
            idle_mib=tuple(idle_curve),
            unreserved_mib=tuple(unreserved_curve),
        )

    def fits_no_empty_node(self, pod: Pod) -> str | None:
        """None when the pod fits some node of the pool while it is empty; else the reason
        the first of them refuses it (counts dropped, e.g. CardInsufficientMemory)."""
        reasons: list[str] = []
        for empty in self.empty_nodes():
            fit = fit_node(pod, empty, vendor=self.vendor, gpu_policy=self.settings.gpu_policy)
            if fit.fits:
                return None
            reasons.append(fit.reason)
        if not reasons:
            return "no nodes"
        return ", ".join(part.split(" ", 1)[-1] for part in reasons[0].split(", "))

    def empty_nodes(self) -> list[NodeState]:
        """One empty node per kind of inventory in the pool (devices alike but for UUIDs)."""
        if self._empty_nodes is None:
            kinds: dict[tuple[object, ...], tuple[Device, ...]] = {}
            for name in sorted(self.inventories):
                devices = self.inventories[name]
                kind = tuple(replace(d, uuid=str(i)) for i, d in enumerate(devices))
                kinds.setdefault(kind, devices)
            self._empty_nodes = [
                NodeState(f"empty-{i}", tuple(DeviceState(d) for d in devices))
                for i, devices in enumerate(kinds.values())
            ]
        return self._empty_nodes

    def namespace_figures(self) -> tuple[NamespaceFigures, ...]:
        namespaces = sorted({p.counted.namespace for p in self.live} | set(self.workload.quotas))
        figures = []
        for namespace in namespaces:
            limits = self.workload.quotas.get(namespace, {})
            figures.append(
                NamespaceFigures(
                    namespace=namespace,
                    limit_mib=limits.get(self.memory_resource),
                    peak_used_mib=self.namespace_peak.get(namespace, 0),
                    refused=self.namespace_refused.get(namespace, 0),
                )
            )
        return tuple(figures)


# -- helpers --------------------------------------------------------------------------------


def node_policy_for_default(node_policy: str) -> str:
    """The configured node policy, checked (a pod without annotation gets it)."""
    return node_policy_for(Pod("", "", "", ()), node_policy)


def _shape(pod: Pod) -> object:
    """What the fit depends on besides the nodes: pods of one shape fit the same nodes."""
    return (
        pod.namespace,
        tuple((c.container_class, c.requests) for c in pod.containers),
        tuple(
            sorted(
                (key, value)
                for key, value in pod.annotations.items()
                if key.startswith(_FIT_ANNOTATION_PREFIXES)
            )
        ),
    )


def _asks(pod: Pod, vendor: VendorResources) -> tuple[tuple[int, int, int], ...]:
    """(devices, memory MiB, cores) each container asks per device, sized by the one sizing
    rule (accounting.pod.device_demand); a share of a card counts as 0 MiB here."""
    asks = []
    for container in pod.containers:
        demand = device_demand(container, vendor)
        if demand is not None:
            asks.append((demand.count, demand.memory_mib or 0, demand.core_percent))
    return tuple(asks)


def _need(asks: tuple[tuple[int, int, int], ...]) -> tuple[int, int, int]:
    """The coarse test: as many devices with a free slot as the largest count asked, and one
    of them with the most memory, one with the most cores, any container asks per device."""
    return (
        max((count for count, _, _ in asks), default=0),
        max((memory for _, memory, _ in asks), default=0),
        max((cores for _, _, cores in asks), default=0),
    )


def _phases_mib(
    declared: Pod, grants: tuple[tuple[DeviceGrant, ...], ...], vendor_name: str
) -> tuple[int, ...]:
    """Memory requested by the running containers: during each regular init container (with
    the sidecars declared before it), then once they are done (sidecars and apps). The fold
    over the declared classes, keyed by vendor: what runs at once adds up across cards."""

    def own(container: Container) -> dict[str, Amount]:
        held = [g.amount for g in container.grants if g.vendor == vendor_name]
        return {vendor_name: sum(held, ZERO)} if held else {}

    walked = phases(
        tuple(replace(c, grants=g) for c, g in zip(declared.containers, grants, strict=True)),
        own,
    )
    return (
        *(p.running.get(vendor_name, ZERO).memory_mib for p in walked.init_points),
        walked.steady.get(vendor_name, ZERO).memory_mib,
    )


def _with_statuses(granted: Pod, declared: Pod, finished: int) -> Pod:
    """The granted pod once ``finished`` regular init containers have exited 0: those are
    Terminated, the next one Running, every sidecar Running (as the kubelet reports them)."""
    statuses: list[ContainerStatus] = []
    seen = 0
    for container in declared.containers:
        if container.container_class is ContainerClass.APP:
            continue
        if container.container_class is ContainerClass.SIDECAR:
            statuses.append(ContainerStatus(container.name, ContainerState.RUNNING))
            continue
        if seen < finished:
            statuses.append(ContainerStatus(container.name, ContainerState.TERMINATED))
        elif seen == finished:
            statuses.append(ContainerStatus(container.name, ContainerState.RUNNING))
        else:
            statuses.append(ContainerStatus(container.name, ContainerState.WAITING))
        seen += 1
    phase = PodPhase.RUNNING if finished >= seen else PodPhase.PENDING
    return replace(granted, phase=phase, init_container_statuses=tuple(statuses))


def _peak_and_mean(times: list[int], values: list[int], window_s: int) -> tuple[int, int]:
    """Peak and time-weighted mean (MiB, rounded down) of a step curve over [0, window_s]."""
    peak = max(values) if values else 0
    if window_s <= 0:
        return peak, values[-1] if values else 0
    area = 0
    for i, (start, value) in enumerate(zip(times, values, strict=True)):
        end = times[i + 1] if i + 1 < len(times) else window_s
        area += value * (min(end, window_s) - start)
    return peak, area // window_s
