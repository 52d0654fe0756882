"""One Filter: read, fit, reserve, classify the refusal (``PodPlacer``); no business rules.

Layer: services/scheduler (adapter). ``accounting.fit.fit_pod`` does every comparison (and
``services.scheduler.fit_kernel`` the same over the cached candidates at once); the recorder,
through ``services.scheduler.recorder_client.RecorderClient``, stores what counts. Node usage
comes from a ``services.scheduler.node_cache.NodeCache`` fed by WatchUsage when one is given (the
daemon's default), else straight from GetNodeUsage.

One Filter, step by step (HAMi's Filter; docs/design.md §2.5-2.6):

1. A pod that asks for no GPU passes through: reason NoGpuRequest, an empty ``node_name``,
   nothing read or reserved. The extender then keeps every candidate node (HAMi returns
   ``NodeNames: args.NodeNames``).
2. What the recorder stores for the pod must be known: filtering the same pod again must not
   count its own earlier reservation against it (HAMi's TakeAndDeletePod + RmUsage): the fit
   sees the pod's node, read directly, and its namespace without it. Reading directly, the
   Filter asks (GetPodUsage, beside step 3's reads); reading its cache, it does not (step 6).
3. The candidates and the namespace quota are read: from the node cache (see
   services.scheduler.node_cache for what it reads directly and how stale it can be), as
   columns the vectorized fit reads, or without one from the recorder (one snapshot, in
   parallel); candidates the recorder does not know become failed nodes ("node
   unregistered"), not errors.
4. ``fit_pod`` chooses the node and the GPUs (policies from the config; the pod's
   ``hami.io/node-scheduler-policy`` and ``hami.io/gpu-scheduler-policy`` win); for cached
   candidates ``services.scheduler.fit_kernel`` gives the same answer over all of them at once.
5. The placement counts only once the recorder's ``Reserve`` stored it: Reserve re-checks
   capacity and quota atomically, so two scheduler replicas never hand out the same capacity.
   When it refuses (another replica was faster, the cache had not seen a change yet, or the
   node was unregistered or its inventory replaced since it was read: ``NodeChanged``), the
   snapshot is read again — the refused node directly from the recorder — and the pod fitted
   again, up to ``reserve_attempts`` times; then the answer is ReservationConflict. While its
   Reserve is in flight, and until the node cache shows it, the placement is held for the
   replica's other Filters (services.scheduler.holds): they fit the cached nodes with it
   added, so Filters of one replica do not race each other for the same capacity.
6. Every Reserve states the reservation it replaces (what step 2 knows, or none; from the
   cache, "none" until the recorder's refusal tells which reservation the pod has and whether
   it was already in the cache the Filter read: services.scheduler.reservation_at_start),
   so two Filters of the same pod at the same moment, on two replicas, cannot both store a
   placement: the recorder refuses the second (``ReservationChanged``) and its answer is
   ReservationConflict, reserving nothing, naming where the first one placed the pod. A pod
   deleted meanwhile is refused (``PodForgotten``) and so answered. A re-filter that finds no
   node releases its reservation the same way (``ReleaseReservation``, stating it), so the pod
   holds nothing; a Filter that read nothing stored and finds no node checks that no rival
   placed the pod meanwhile before it says NoNodeFits. Every answer is therefore what the
   recorder stores: a Scheduled answer's placement, or no placement made by this Filter.

Every step is under the recorder's accounting policy (services.common.policy): the pod is read
with its resource names, fitted with its memory factor and quota rules, and reserved naming it.
A read answered under another policy (the recorder restarted with a new configuration), or a
Reserve refused with ``PolicyChanged``, starts the Filter again under the new policy.

The whole flow is the span ``scheduler.filter``, parented on the pod's ``hami.io/traceparent``;
the recorder calls are its children through the traced client channel.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence

from opentelemetry import trace

from accounting.fit import (
    BINPACK,
    SPREAD,
    FitResult,
    NodeState,
    QuotaContext,
    fit_plan,
    fit_pod,
    no_device_asked,
    placement_usage,
    pod_requests_devices,
)
from accounting.model import Device, Pod
from accounting.policy import AccountingPolicy
from accounting.reasons import (
    NO_GPU_REQUEST,
    NO_NODE_FITS,
    NODE_CHANGED,
    POD_FORGOTTEN,
    POLICY_CHANGED,
    RESERVATION_CHANGED,
    RESERVATION_CONFLICT,
    SCHEDULED,
)
from accounting.vendors import VendorResources
from services.common import telemetry
from services.common.metrics import record_decision
from services.common.policy import PolicyChangedError, check_unchanged, under_recorder_policy
from services.scheduler import convert, fit_kernel
from services.scheduler import metrics as scheduler_metrics
from services.scheduler.config import DEFAULT_RESERVE_ATTEMPTS, DEFAULT_USAGE_TIMEOUT_MS
from services.scheduler.convert import (
    FilterInput,
    FilterOutcome,
    Reservation,
    StoredReservation,
)
from services.scheduler.holds import Holds
from services.scheduler.metrics import METRICS_SERVICE
from services.scheduler.node_cache import Candidates, NodeCache
from services.scheduler.recorder_client import RecorderClient
from services.scheduler.reservation_at_start import ReservationAtStart

# The decision lines keep the logger they have always had: operators and log pipelines select
# them by it (docs/observability.md shows one).
_LOG = logging.getLogger("services.scheduler.servicer")

SPAN_NAME = "scheduler.filter"
DEFAULT_USAGE_TIMEOUT_S = DEFAULT_USAGE_TIMEOUT_MS / 1000
"""Deadline of every call to the recorder."""

_DECISIONS = {
    SCHEDULED: "schedule",
    NO_GPU_REQUEST: "pass-through",
    NO_NODE_FITS: "no-fit",
    RESERVATION_CONFLICT: "conflict",
    POD_FORGOTTEN: "forgotten",
}

CallTimeout = Callable[[], float]
"""The deadline, in seconds, to give the next recorder call."""
InputReader = Callable[[tuple[VendorResources, ...]], FilterInput]
"""Reads the Filter's pod (with a policy's vendors' resource names) and candidate nodes."""


class PodPlacer:
    """Places pods: snapshot from the recorder, fit, reserve (see the module docstring)."""

    def __init__(
        self,
        recorder: RecorderClient,
        *,
        node_policy: str = BINPACK,
        gpu_policy: str = SPREAD,
        reserve_attempts: int = DEFAULT_RESERVE_ATTEMPTS,
        usage_timeout_s: float = DEFAULT_USAGE_TIMEOUT_S,
        tracer: trace.Tracer | None = None,
        clock: Callable[[], float] = time.time,
        node_cache: NodeCache | None = None,
    ) -> None:
        """Args (beyond the config's): ``node_cache`` answers node usage when given (its own
        direct reads go through its recorder client); without it every attempt reads the
        candidates with ``recorder.snapshot``. The accounting policy is the recorder's, as
        ``recorder.policy`` holds it."""
        if reserve_attempts < 1:
            raise ValueError(f"reserve_attempts must be >= 1, got {reserve_attempts}")
        self._recorder = recorder
        self._policy = recorder.policy
        self._node_policy = node_policy
        self._gpu_policy = gpu_policy
        self._attempts = reserve_attempts
        self.usage_timeout_s = usage_timeout_s
        self._tracer = tracer or trace.NoOpTracer()
        self._clock = clock
        self._node_cache = node_cache
        self._holds = Holds()
        """This replica's placements its node cache may not show yet (Filters that read the
        cache hold theirs; one that read directly, the stream down, holds nothing)."""

    @property
    def held_placements(self) -> int:
        """How many of this replica's placements are held now (services.scheduler.holds)."""
        return len(self._holds)

    def place_request(
        self,
        read_input: InputReader,
        asks_for_devices: Callable[[], bool],
        call_timeout: CallTimeout | None = None,
    ) -> tuple[Pod, FilterOutcome]:
        """Reads the Filter's pod and candidates under the recorder's accounting policy, then
        places the pod among them; again under the new policy when it changed meanwhile.
        ``call_timeout`` gives the deadline of the next recorder call (the configured one when
        None).

        Raises:
            InvalidInputError: the request cannot be read.
            DependencyUnavailableError: the recorder cannot be reached.
        """

        view = ReservationAtStart()

        def attempt(policy: AccountingPolicy | None) -> tuple[Pod, FilterOutcome]:
            given = read_input(policy.vendors if policy else ())
            return given.pod, self._place_under(
                given.pod, given.node_names, call_timeout, policy, view
            )

        return under_recorder_policy(self._policy, asks_for_devices, attempt)

    def _place_under(
        self,
        pod: Pod,
        node_names: Sequence[str],
        call_timeout: CallTimeout | None,
        policy: AccountingPolicy | None,
        view: ReservationAtStart,
    ) -> FilterOutcome:
        started_s = time.perf_counter()
        timeout = call_timeout or (lambda: self.usage_timeout_s)
        attributes = {"node_count": len(node_names)}
        with telemetry.pod_span(self._tracer, SPAN_NAME, pod, attributes=attributes) as span:
            outcome = self._place(pod, node_names, timeout, span, policy, view)
            telemetry.set_attributes(
                span,
                {
                    "node": outcome.fit.node_name if outcome.reason == SCHEDULED else "",
                    "reason": outcome.reason,
                    "attempts": outcome.attempts,
                    "policy_id": outcome.policy_id,
                },
            )
            # Logged inside the span, so the line carries the pod's trace id.
            _LOG.log(
                logging.DEBUG if outcome.reason == NO_GPU_REQUEST else logging.INFO,
                "filter %s for pod %s: %s",
                outcome.reason,
                pod.key,
                outcome.message,
                extra={"pod_uid": pod.uid, "reason": outcome.reason,
                       "attempts": outcome.attempts},
            )
        decision = _DECISIONS[outcome.reason]
        record_decision(METRICS_SERVICE, decision, outcome.reason)
        scheduler_metrics.count_node_refusals(
            outcome.fit.failed_nodes.values(), unregistered=len(outcome.unregistered)
        )
        scheduler_metrics.observe_filter(decision, time.perf_counter() - started_s)
        return outcome

    def _snapshot(
        self,
        node_names: Sequence[str],
        namespace: str,
        timeout_s: float,
        refresh: Collection[str],
        fresh_quota: bool,
        pod_uid: str,
    ) -> Candidates:
        if self._node_cache is None:
            return Candidates.of(self._recorder.snapshot(node_names, namespace, timeout_s))
        return self._node_cache.candidates(
            node_names, namespace, timeout_s, refresh=refresh, fresh_quota=fresh_quota,
            holds=self._holds, pod_uid=pod_uid,
        )

    def _fit(
        self,
        pod: Pod,
        candidates: Candidates,
        policy: AccountingPolicy,
        stored: StoredReservation | None,
    ) -> FitResult:
        quota = candidates.quota
        others: Sequence[NodeState] = candidates.others
        if stored is not None:
            # A re-filter: the pod's own reservation does not count against it, on its node
            # (read directly, so never one of the columns) nor in its namespace (Reserve
            # replaces it the same way).
            others = [
                node.without(stored.usage) if node.node_name == stored.node_name else node
                for node in others
            ]
            quota = quota.without(stored.usage, policy.vendors)
        quota = QuotaContext(quota.items, enforce_gpu_count=policy.enforce_gpu_count)
        columns = candidates.columns
        if columns is not None:
            plan = fit_plan(
                pod,
                vendors=policy.vendors,
                node_policy=self._node_policy,
                gpu_policy=self._gpu_policy,
                quota=quota,
            )
            if plan is not None:
                try:
                    return fit_kernel.fit_candidates(plan, columns, others)
                except fit_kernel.KernelDisagreementError:
                    _LOG.exception(
                        "the vectorized fit disagrees with the reference fit for pod %s; "
                        "answering with the reference fit", pod.key,
                        extra={"pod_uid": pod.uid},
                    )
            # A pod asking several vendors' devices: the reference fit, over every node.
            others = (*columns.states.tolist(), *others)
        return fit_pod(
            pod,
            others,
            vendors=policy.vendors,
            node_policy=self._node_policy,
            gpu_policy=self._gpu_policy,
            quota=quota,
        )

    def _read(
        self,
        node_names: Sequence[str],
        namespace: str,
        timeout_s: float,
        refresh: Collection[str],
        policy: AccountingPolicy,
        fresh_quota: bool = False,
        pod_uid: str = "",
    ) -> Candidates:
        """The candidates; raises ``PolicyChangedError`` when the recorder answered the read
        under another policy than the one the Filter runs under."""
        candidates = self._snapshot(
            node_names, namespace, timeout_s, refresh, fresh_quota, pod_uid
        )
        check_unchanged(self._policy, policy)
        return candidates

    def _place(
        self,
        pod: Pod,
        node_names: Sequence[str],
        timeout: CallTimeout,
        span: trace.Span,
        policy: AccountingPolicy | None,
        view: ReservationAtStart,
    ) -> FilterOutcome:
        if policy is None or not pod_requests_devices(pod, vendors=policy.vendors):
            pass_through = no_device_asked(pod)
            return FilterOutcome(
                pass_through,
                NO_GPU_REQUEST,
                f"{pass_through.message}; the extender keeps every candidate node",
                policy_id=policy.policy_id if policy else "",
            )
        cached = self._node_cache is not None and self._node_cache.live
        if not cached:
            # Read directly: what is stored for the pod is read beside the nodes.
            view.begin(lambda: self._recorder.stored_later(pod.uid, timeout()))
        # Nodes to read from the recorder even when the cache has them: its copy may not show
        # a change this Filter just made or just lost a race to.
        refresh: set[str] = set()
        fresh_quota = False
        refused: Reservation | None = None
        fit: FitResult | None = None
        candidates: Candidates | None = None
        # A Reserve refused as NodeChanged (the recorder called grants fitted on its own state
        # invalid) is a node read again: changed since (re-registered), it is fitted anew;
        # unchanged, the same fit would be refused again, so the node is left out of the
        # remaining attempts and named among the failed nodes.
        suspects: dict[str, NodeState | None] = {}
        dropped: dict[str, str] = {}
        attempt = 0
        while attempt < self._attempts:
            remaining = [name for name in node_names if name not in dropped]
            if not remaining:
                break
            candidates = self._read(
                remaining, pod.namespace, timeout(), refresh, policy, fresh_quota, pod.uid
            )
            unchanged = [n for n, was in suspects.items() if candidates.state_of(n) == was]
            suspects.clear()
            if unchanged:
                dropped.update(dict.fromkeys(unchanged, NODE_CHANGED))
                continue  # read again without them
            if candidates.revision is None:
                view.begin(lambda: self._recorder.stored_later(pod.uid, timeout()))
            else:
                view.saw(candidates.revision)
            stored = view.stored()
            if stored is not None and stored.node_name and stored.node_name not in refresh:
                # A re-filter: the pod's own reservation must not count against it. Its node
                # is read directly, and fitted without it.
                refresh.add(stored.node_name)
                span.add_event("re-filter: the pod's own reservation does not count against it")
                continue
            attempt += 1
            fit = self._fit(pod, candidates, policy, stored)
            if (
                fit.node_name is None
                and candidates.revision is not None
                and not (refresh.issuperset(remaining) and fresh_quota)
            ):
                # The cache may lag a release acknowledged a moment ago (no read-your-writes):
                # confirm "no node fits" with direct reads before answering it.
                refresh.update(remaining)
                fresh_quota = True
                candidates = self._read(
                    remaining, pod.namespace, timeout(), refresh, policy, fresh_quota, pod.uid
                )
                fit = self._fit(pod, candidates, policy, stored)
            if fit.node_name is None:
                if not view.known():
                    # Not read yet (the optimistic path): is the pod's own reservation what
                    # stands in its way?
                    view.learn(self._recorder.stored(pod.uid, timeout()))
                    own = view.stored()
                    if own is not None and view.own(own):
                        attempt -= 1
                        continue
                return self._no_fit(
                    pod, node_names, fit, candidates.unknown, attempt, policy, view, timeout,
                    dropped,
                )
            reservation = self._reserve(
                pod, fit, policy, view.replaces(), timeout, held=candidates.revision is not None
            )
            if reservation.reason == POLICY_CHANGED:
                # The recorder restarted under another policy since the Filter read it.
                raise PolicyChangedError("")
            if reservation.reserved:
                message = fit.message
                if candidates.unknown:
                    message += f"; {len(candidates.unknown)} candidate(s) unregistered"
                return FilterOutcome(
                    fit,
                    SCHEDULED,
                    message,
                    candidates.unknown,
                    reservation,
                    attempt,
                    convert.hami_annotations(
                        fit.grants,
                        fit.node_name,
                        int(self._clock()),
                        specs=policy.specs,
                        devices=_devices_of(candidates, fit.node_name),
                        pod=pod,
                    ),
                    policy.policy_id,
                )
            if reservation.reason == RESERVATION_CHANGED and not view.known():
                # The optimistic path stated "nothing stored". What is stored was in the
                # cache this Filter read (the pod's own earlier reservation: a re-filter,
                # placed again without it), or came later (a rival Filter: it stands).
                found = StoredReservation(
                    reservation.stored_node_name, reservation.stored, reservation.stored_revision
                )
                view.learn(found if reservation.stored_revision else None)
                if view.own(found):
                    attempt -= 1
                    continue
            if reservation.reason in (RESERVATION_CHANGED, POD_FORGOTTEN):
                return self._lost(pod, fit, candidates.unknown, attempt, policy, reservation)
            refused = reservation
            refresh.add(fit.node_name)
            fresh_quota = True
            if reservation.reason == NODE_CHANGED:
                suspects[fit.node_name] = candidates.state_of(fit.node_name)
            span.add_event(
                "reservation refused",
                {
                    "hami.accounting.node": fit.node_name,
                    "hami.accounting.reason": reservation.reason,
                    "hami.accounting.attempt": attempt,
                },
            )
            _LOG.info(
                "reservation of pod %s on %s refused (%s), attempt %d of %d: %s",
                pod.key, fit.node_name, reservation.reason, attempt, self._attempts,
                reservation.message,
                extra={"pod_uid": pod.uid, "node": fit.node_name},
            )
        assert fit is not None and refused is not None
        if candidates is None or len(dropped) == len(set(node_names)):
            # Every candidate changed under this Filter: no node fits now (the extender asks
            # again later, on what the nodes are then), and no rival is to blame.
            failed = dict(sorted(dropped.items()))
            message = (
                convert.no_fit_message(len(node_names), failed)
                + f"; last refusal on {fit.node_name}: {refused.message}"
            )
            return FilterOutcome(
                FitResult(None, (), failed, {}, NO_NODE_FITS, message),
                NO_NODE_FITS,
                message,
                attempts=attempt,
                policy_id=policy.policy_id,
            )
        return FilterOutcome(
            fit,
            RESERVATION_CONFLICT,
            f"another scheduler took the capacity first {self._attempts} time(s) in a row; "
            f"last refusal on {fit.node_name}: {refused.reason}: {refused.message}",
            candidates.unknown,
            refused,
            self._attempts,
            policy_id=policy.policy_id,
        )

    def _reserve(
        self,
        pod: Pod,
        fit: FitResult,
        policy: AccountingPolicy,
        replaces: int,
        timeout: CallTimeout,
        *,
        held: bool,
    ) -> Reservation:
        """Reserve; with ``held`` (the Filter read the cache, which then lets holds go as it
        catches up), the placement is held meanwhile, and after until the cache shows it, for
        the replica's other Filters (services.scheduler.holds)."""
        assert fit.node_name is not None
        if not held:
            return self._recorder.reserve(
                pod, fit.node_name, fit.grants, policy.policy_id, timeout(),
                replaces_revision=replaces,
            )
        key = self._holds.hold(pod.uid, fit.node_name, placement_usage(pod, fit.grants))
        reservation: Reservation | None = None
        try:
            reservation = self._recorder.reserve(
                pod, fit.node_name, fit.grants, policy.policy_id, timeout(),
                replaces_revision=replaces,
            )
            return reservation
        finally:
            if reservation is not None and reservation.reserved:
                self._holds.reserved(key, reservation.revision)
            else:
                self._holds.drop(key)

    def _no_fit(
        self,
        pod: Pod,
        node_names: Sequence[str],
        fit: FitResult,
        unknown: tuple[str, ...],
        attempt: int,
        policy: AccountingPolicy,
        view: ReservationAtStart,
        timeout: CallTimeout,
        dropped: Mapping[str, str] | None = None,
    ) -> FilterOutcome:
        """No node fits (``dropped``: candidates left out after a refusal, with its reason).
        A re-filter releases the pod's reservation, so the pod holds nothing
        (HAMi's re-filter released it before fitting); a Filter that read nothing stored
        checks that no other Filter for the pod placed it meanwhile. Either way, when another
        Filter's placement is stored, that answer stands and this one says so."""
        stored = view.stored()
        if stored is not None and view.own(stored):
            released = self._recorder.release(pod.uid, stored.revision, timeout())
            if released.reason == RESERVATION_CHANGED:
                return self._lost(
                    pod, fit, unknown, attempt, policy,
                    Reservation(False, released.reason, released.message),
                )
        else:
            now = stored if stored is not None else self._recorder.stored(pod.uid, timeout())
            if now is not None:
                return self._lost(
                    pod, fit, unknown, attempt, policy,
                    Reservation(
                        False,
                        RESERVATION_CHANGED,
                        f"pod {pod.uid} was read with nothing stored and is now stored on "
                        f"{now.node_name}: another Filter for the same pod placed it "
                        "meanwhile, and that stands",
                        now.usage,
                        now.node_name,
                    ),
                )
        failed = convert.failed_nodes(fit, unknown)
        if dropped:
            failed = dict(sorted({**failed, **dropped}.items()))
            fit = dataclasses.replace(fit, failed_nodes=failed)
        return FilterOutcome(
            fit,
            NO_NODE_FITS,
            convert.no_fit_message(len(node_names), failed),
            unknown,
            attempts=attempt,
            policy_id=policy.policy_id,
        )

    def _lost(
        self,
        pod: Pod,
        fit: FitResult,
        unknown: tuple[str, ...],
        attempt: int,
        policy: AccountingPolicy,
        refusal: Reservation,
    ) -> FilterOutcome:
        """This Filter reserves nothing: the pod was deleted meanwhile (PodForgotten), or
        another Filter for the same pod (on another scheduler replica) stored its placement
        first (ReservationConflict), and that placement is the one that stands."""
        if refusal.reason == POD_FORGOTTEN:
            return FilterOutcome(
                fit,
                POD_FORGOTTEN,
                f"pod {pod.key} was deleted while it was being placed: nothing reserved "
                f"({refusal.reason}: {refusal.message})",
                unknown,
                refusal,
                attempt,
                policy_id=policy.policy_id,
            )
        where = f" on {refusal.stored_node_name}" if refusal.stored_node_name else ""
        return FilterOutcome(
            fit,
            RESERVATION_CONFLICT,
            f"another Filter for pod {pod.key} placed it{where} at the same moment; its "
            f"placement stands and this answer reserves nothing ({refusal.message})",
            unknown,
            refusal,
            attempt,
            policy_id=policy.policy_id,
        )


def _devices_of(candidates: Candidates, node_name: str) -> dict[str, Device]:
    """The chosen node's devices by UUID (the annotations name their indexes and models)."""
    node = candidates.state_of(node_name)
    if node is None:
        return {}
    return {state.device.uuid: state.device for state in node.devices}
