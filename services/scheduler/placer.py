"""One Filter: read, fit, reserve, classify the refusal (``PodPlacer``); no business rules.

Layer: services/scheduler (adapter). ``accounting.fit.fit_pod`` does every comparison (and
``services.scheduler.fit_kernel`` the same over the cached candidates at once; which one where
is services.scheduler.candidate_fit); the recorder, through
``services.scheduler.recorder_client.RecorderClient``, stores what counts. Node usage
comes from a ``services.scheduler.node_cache.NodeCache`` fed by WatchUsage when one is given (the
daemon's default), else straight from GetNodeUsage. What each ending answers is written by
services.scheduler.answers.

The Filter is a loop of attempts (``PodPlacer._attempt``), each the same steps — read, fit,
reserve, classify the refusal — over one small state (``_RetryState``: what to read directly
next, the candidates left out, the attempts counted); a step ends the Filter with an answer or
hands the loop on.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from opentelemetry import trace

from accounting.fit import (
    BINPACK,
    SPREAD,
    FitResult,
    NodeState,
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
from services.scheduler import answers, convert
from services.scheduler import metrics as scheduler_metrics
from services.scheduler.candidate_fit import CandidateFit, fit_over_candidates
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


@dataclass(frozen=True, kw_only=True, slots=True)
class _FilterCall:
    """One Filter's inputs, the same for each of its attempts."""

    pod: Pod
    node_names: Sequence[str]
    policy: AccountingPolicy
    timeout: CallTimeout
    span: trace.Span
    known: ReservationAtStart
    """What the Filter knows of the pod's stored reservation (kept across a change of policy)."""


@dataclass(kw_only=True, slots=True)
class _RetryState:
    """What one Filter carries from an attempt to the next."""

    attempts: int = 0
    """Attempts counted so far: each one a Reserve refused for capacity or a changed node."""
    refresh: set[str] = field(default_factory=set)
    """Nodes to read from the recorder even when the cache has them: its copy may not show a
    change this Filter just made or just lost a race to."""
    fresh_quota: bool = False
    """Whether to read the namespace quota from the recorder rather than the cache."""
    suspects: dict[str, NodeState | None] = field(default_factory=dict)
    """A node a Reserve refused as NodeChanged (the recorder called grants fitted on its own
    state invalid), as it was read then: read again, a node changed since (re-registered) is
    fitted anew; one unchanged would be refused again, so it is left out (``dropped``)."""
    dropped: dict[str, str] = field(default_factory=dict)
    """Candidates left out of the remaining attempts, with the reason named among the failed
    nodes."""
    candidates: Candidates | None = None
    """The last candidates read."""
    fit: FitResult | None = None
    """The last fit computed."""
    score_entries: Sequence[bytes] = ()
    """The encoded score entries of the last fit (``CandidateFit.score_entries``)."""
    refused: Reservation | None = None
    """The last Reserve refused."""

    def remaining(self, node_names: Sequence[str]) -> list[str]:
        """The candidates not left out."""
        return [name for name in node_names if name not in self.dropped]


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

        known = ReservationAtStart()

        def placed_under(policy: AccountingPolicy | None) -> tuple[Pod, FilterOutcome]:
            given = read_input(policy.vendors if policy else ())
            return given.pod, self._place_under(
                given.pod, given.node_names, call_timeout, policy, known
            )

        return under_recorder_policy(self._policy, asks_for_devices, placed_under)

    def _place_under(
        self,
        pod: Pod,
        node_names: Sequence[str],
        call_timeout: CallTimeout | None,
        policy: AccountingPolicy | None,
        known: ReservationAtStart,
    ) -> FilterOutcome:
        started_s = time.perf_counter()
        timeout = call_timeout or (lambda: self.usage_timeout_s)
        attributes = {"node_count": len(node_names)}
        with telemetry.pod_span(self._tracer, SPAN_NAME, pod, attributes=attributes) as span:
            if policy is None or not pod_requests_devices(pod, vendors=policy.vendors):
                outcome = answers.pass_through(pod, policy.policy_id if policy else "")
            else:
                outcome = self._place(
                    _FilterCall(
                        pod=pod,
                        node_names=node_names,
                        policy=policy,
                        timeout=timeout,
                        span=span,
                        known=known,
                    )
                )
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

    # -- the attempts ----------------------------------------------------------------------------

    def _place(self, call: _FilterCall) -> FilterOutcome:
        """Attempts until one ends the Filter or ``reserve_attempts`` Reserves were refused."""
        if self._node_cache is None or not self._node_cache.live:
            # Read directly: what is stored for the pod is read beside the nodes.
            self._start_reading_stored(call)
        state = _RetryState()
        while state.attempts < self._attempts:
            remaining = state.remaining(call.node_names)
            if not remaining:
                break
            outcome = self._attempt(call, remaining, state)
            if outcome is not None:
                return _with_score_entries(outcome, state)
        assert state.fit is not None and state.refused is not None
        assert state.candidates is not None
        outcome = answers.out_of_attempts(
            state.fit,
            state.refused,
            node_names=call.node_names,
            unknown=state.candidates.unknown,
            dropped=state.dropped,
            attempts=state.attempts,
            reserve_attempts=self._attempts,
            policy_id=call.policy.policy_id,
        )
        return _with_score_entries(outcome, state)

    def _attempt(
        self, call: _FilterCall, remaining: Sequence[str], state: _RetryState
    ) -> FilterOutcome | None:
        """One attempt: read, fit, reserve, classify the refusal. None: go on (``state`` says
        what to read; it counts an attempt only once a Reserve was refused)."""
        candidates = self._read_step(call, remaining, state)
        if candidates is None:
            return None
        attempt = state.attempts + 1
        candidates, fit = self._fit_step(call, remaining, candidates, state)
        if fit.node_name is None:
            if self._own_reservation_in_the_way(call):
                return None
            return self._no_fit(call, fit, candidates.unknown, attempt, state.dropped)
        reservation = self._reserve(call, fit, held=candidates.revision is not None)
        if reservation.reason == POLICY_CHANGED:
            # The recorder restarted under another policy since the Filter read it.
            raise PolicyChangedError("")
        if reservation.reserved:
            return answers.scheduled(
                fit,
                reservation,
                unknown=candidates.unknown,
                attempts=attempt,
                annotations=convert.hami_annotations(
                    fit.grants,
                    fit.node_name,
                    int(self._clock()),
                    specs=call.policy.specs,
                    devices=_devices_of(candidates, fit.node_name),
                    pod=call.pod,
                ),
                policy_id=call.policy.policy_id,
            )
        return self._refused(call, fit, candidates, reservation, attempt, state)

    def _read_step(
        self, call: _FilterCall, remaining: Sequence[str], state: _RetryState
    ) -> Candidates | None:
        """The candidates to fit, or None when what was read must be read again first."""
        candidates = self._read(call, remaining, state)
        unchanged = [n for n, was in state.suspects.items() if candidates.state_of(n) == was]
        state.suspects.clear()
        if unchanged:
            state.dropped.update(dict.fromkeys(unchanged, NODE_CHANGED))
            return None  # read again without them
        if candidates.revision is None:
            self._start_reading_stored(call)
        else:
            call.known.saw(candidates.revision)
        stored = call.known.stored()
        if stored is not None and stored.node_name and stored.node_name not in state.refresh:
            # A re-filter: the pod's own reservation must not count against it. Its node is
            # read directly, and fitted without it.
            state.refresh.add(stored.node_name)
            call.span.add_event("re-filter: the pod's own reservation does not count against it")
            return None
        return candidates

    def _fit_step(
        self,
        call: _FilterCall,
        remaining: Sequence[str],
        candidates: Candidates,
        state: _RetryState,
    ) -> tuple[Candidates, FitResult]:
        """The fit over the candidates; a "no node fits" over the cache is confirmed with
        direct reads (the candidates then read are returned)."""
        stored = call.known.stored()
        fitted = self._fit(call, candidates, stored)
        if (
            fitted.fit.node_name is None
            and candidates.revision is not None
            and not (state.refresh.issuperset(remaining) and state.fresh_quota)
        ):
            # The cache may lag a release acknowledged a moment ago (no read-your-writes).
            state.refresh.update(remaining)
            state.fresh_quota = True
            candidates = self._read(call, remaining, state)
            fitted = self._fit(call, candidates, stored)
        state.fit = fitted.fit
        state.score_entries = fitted.score_entries
        return candidates, fitted.fit

    def _own_reservation_in_the_way(self, call: _FilterCall) -> bool:
        """No node fits, and the Filter has not read what is stored for the pod yet (the
        optimistic path): reads it, and tells whether it is the pod's own reservation that
        stands in its way (then the Filter reads again, and fits without it)."""
        known = call.known
        if known.known():
            return False
        known.learn(self._recorder.stored(call.pod.uid, call.timeout()))
        own = known.stored()
        return own is not None and known.own(own)

    def _refused(
        self,
        call: _FilterCall,
        fit: FitResult,
        candidates: Candidates,
        reservation: Reservation,
        attempt: int,
        state: _RetryState,
    ) -> FilterOutcome | None:
        """Classifies a refused Reserve: the pod's own reservation stated wrongly (place again
        without it), a rival Filter of the pod or its deletion (the answer), or capacity
        taken or the node changed (another attempt, counted, with the node read directly)."""
        assert fit.node_name is not None
        known = call.known
        if reservation.reason == RESERVATION_CHANGED and not known.known():
            # The optimistic path stated "nothing stored". What is stored was in the cache this
            # Filter read (the pod's own earlier reservation: a re-filter, placed again without
            # it), or came later (a rival Filter: it stands).
            found = StoredReservation(
                node_name=reservation.stored_node_name,
                usage=reservation.stored,
                revision=reservation.stored_revision,
            )
            known.learn(found if reservation.stored_revision else None)
            if known.own(found):
                return None
        if reservation.reason in (RESERVATION_CHANGED, POD_FORGOTTEN):
            return answers.lost(
                call.pod,
                fit,
                reservation,
                unknown=candidates.unknown,
                attempts=attempt,
                policy_id=call.policy.policy_id,
            )
        state.attempts = attempt
        state.refused = reservation
        state.refresh.add(fit.node_name)
        state.fresh_quota = True
        if reservation.reason == NODE_CHANGED:
            state.suspects[fit.node_name] = candidates.state_of(fit.node_name)
        call.span.add_event(
            "reservation refused",
            {
                "hami.accounting.node": fit.node_name,
                "hami.accounting.reason": reservation.reason,
                "hami.accounting.attempt": attempt,
            },
        )
        _LOG.info(
            "reservation of pod %s on %s refused (%s), attempt %d of %d: %s",
            call.pod.key, fit.node_name, reservation.reason, attempt, self._attempts,
            reservation.message,
            extra={"pod_uid": call.pod.uid, "node": fit.node_name},
        )
        return None

    def _no_fit(
        self,
        call: _FilterCall,
        fit: FitResult,
        unknown: tuple[str, ...],
        attempt: int,
        dropped: Mapping[str, str],
    ) -> FilterOutcome:
        """No node fits. A re-filter releases the pod's reservation, so the pod holds nothing
        (HAMi's re-filter released it before fitting); a Filter that read nothing stored
        checks that no other Filter for the pod placed it meanwhile. Either way, when another
        Filter's placement is stored, that answer stands and this one says so."""
        pod, known, policy_id = call.pod, call.known, call.policy.policy_id
        stored = known.stored()
        refusal: Reservation | None = None
        if stored is not None and known.own(stored):
            released = self._recorder.release(pod.uid, stored.revision, call.timeout())
            if released.reason == RESERVATION_CHANGED:
                refusal = Reservation(
                    reserved=False, reason=released.reason, message=released.message
                )
        else:
            now = stored if stored is not None else self._recorder.stored(pod.uid, call.timeout())
            if now is not None:
                refusal = answers.rival_stored(pod, now)
        if refusal is not None:
            return answers.lost(
                pod, fit, refusal, unknown=unknown, attempts=attempt, policy_id=policy_id
            )
        return answers.no_node_fits(
            fit,
            candidates=len(call.node_names),
            unknown=unknown,
            dropped=dropped,
            attempts=attempt,
            policy_id=policy_id,
        )

    # -- read, fit, reserve ----------------------------------------------------------------------

    def _start_reading_stored(self, call: _FilterCall) -> None:
        """Starts reading what is stored for the pod, unless known or under way."""
        call.known.begin(lambda: self._recorder.stored_later(call.pod.uid, call.timeout()))

    def _read(
        self, call: _FilterCall, node_names: Sequence[str], state: _RetryState
    ) -> Candidates:
        """The candidates (``state`` says what to read directly); raises
        ``PolicyChangedError`` when the recorder answered the read under another policy than
        the one the Filter runs under."""
        timeout_s = call.timeout()
        namespace = call.pod.namespace
        if self._node_cache is None:
            candidates = Candidates.of(self._recorder.snapshot(node_names, namespace, timeout_s))
        else:
            candidates = self._node_cache.candidates(
                node_names, namespace, timeout_s, refresh=state.refresh,
                fresh_quota=state.fresh_quota, holds=self._holds, pod_uid=call.pod.uid,
            )
        state.candidates = candidates
        check_unchanged(self._policy, call.policy)
        return candidates

    def _fit(
        self, call: _FilterCall, candidates: Candidates, stored: StoredReservation | None
    ) -> CandidateFit:
        return fit_over_candidates(
            call.pod,
            candidates,
            policy=call.policy,
            stored=stored,
            node_policy=self._node_policy,
            gpu_policy=self._gpu_policy,
        )

    def _reserve(self, call: _FilterCall, fit: FitResult, *, held: bool) -> Reservation:
        """Reserve, in place of the reservation the Filter knows of; with ``held`` (the Filter
        read the cache, which then lets holds go as it catches up), the placement is held
        meanwhile, and after until the cache shows it, for the replica's other Filters
        (services.scheduler.holds)."""
        assert fit.node_name is not None
        pod, node_name = call.pod, fit.node_name
        replaces = call.known.replaces()
        if not held:
            return self._recorder.reserve(
                pod, node_name, fit.grants, call.policy.policy_id, call.timeout(),
                replaces_revision=replaces,
            )
        key = self._holds.hold(pod.uid, node_name, placement_usage(pod, fit.grants))
        reservation: Reservation | None = None
        try:
            reservation = self._recorder.reserve(
                pod, node_name, fit.grants, call.policy.policy_id, call.timeout(),
                replaces_revision=replaces,
            )
            return reservation
        finally:
            if reservation is not None and reservation.reserved:
                self._holds.reserved(key, reservation.revision)
            else:
                self._holds.drop(key)


def _with_score_entries(outcome: FilterOutcome, state: _RetryState) -> FilterOutcome:
    """The outcome with the encoded score entries of its fit, when its fit is the last one
    computed (the entries are that fit's)."""
    if not state.score_entries or outcome.fit is not state.fit:
        return outcome
    return dataclasses.replace(outcome, score_entries=state.score_entries)


def _devices_of(candidates: Candidates, node_name: str) -> dict[str, Device]:
    """The chosen node's devices by UUID (the annotations name their indexes and models)."""
    node = candidates.state_of(node_name)
    if node is None:
        return {}
    return {state.device.uuid: state.device for state in node.devices}
