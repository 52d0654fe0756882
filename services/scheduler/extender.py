"""The scheduler daemon as a kube-scheduler extender: ``POST /filter`` over HTTP(S), so HAMi as
released can keep its own Bind while our fit decides where a pod goes (docs/extender.md).

Layer: services/scheduler (adapter). The request is kube-scheduler's ``ExtenderArgs``, read as
Go reads it (services.scheduler.extender_args); the answer its ``ExtenderFilterResult``.

* ``NodeNames`` (``nodeCacheCapable: true``, the configuration we ship): the Filter of the gRPC
  service, the same placer (services.scheduler.placer). When it places the pod, the pod's
  annotations (``hami.io/vgpu-node``, ``hami.io/vgpu-time``, each vendor's devices to allocate;
  byte for byte what the gRPC Filter returns) are patched onto the pod through the Kubernetes
  API before the answer names the node: HAMi's Bind and device plugin read them from the pod.
  If the patch fails, the reservation is released in the recorder (stating the revision it
  stored, so a newer one is left alone) and the answer is an ``Error``: nothing stays reserved
  for a placement nobody can act on. A pod filtered again replaces its reservation, as Reserve
  allows.
* ``Nodes`` without ``NodeNames`` (Cluster Autoscaler's simulation of nodes not registered yet;
  HAMi's ``filterSimulation``): the pod is fitted on the Node objects given, as empty nodes
  (their HAMi register annotations, no usage, no quota), nothing read from the recorder but its
  policy, nothing reserved or patched; the answer's ``Nodes`` is the best node, as HAMi answers.
* A pod without a GPU request passes with every candidate, as in HAMi.
* Refusals are split as kube-scheduler's preemption needs them: a node refused only for
  reasons no preemption can lift (accounting.reasons.ROOM_CANNOT_FIX: quota, health, cordon,
  type, no inventory) goes to ``FailedAndUnresolvableNodes``, every other to ``FailedNodes``; a
  pod whose GPU request cannot be read puts every candidate in ``FailedAndUnresolvableNodes``
  with the field named.
* An ``Error`` (HTTP 200): the recorder unreachable, every placement taken by another scheduler
  first, the pod deleted meanwhile, the patch failed. kube-scheduler then retries the pod. A
  body that is not an ``ExtenderArgs`` is HTTP 400 with the ``Error`` naming the field.

Every recorder call and the patch share one deadline (``deadline_s``), kept inside
kube-scheduler's ``httpTimeout``. The request's span, ``extender.filter``, is on the pod's trace:
its ``hami.io/traceparent``, else the trace its uid names (services.common.telemetry
.pod_uid_trace, the AdmissionReview endpoint's); the patch writes the annotation when the pod
has none, so its bind and its recording join the same trace.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from accounting import errors
from accounting.errors import InvalidInputError, Violations
from accounting.fit import BINPACK, SPREAD, FitResult, NodeState, fit_pod
from accounting.kube import pod_json
from accounting.kube.node_json import parse_node
from accounting.model import TRACEPARENT_ANNOTATION, Pod
from accounting.policy import AccountingPolicy
from accounting.reasons import (
    NO_GPU_REQUEST,
    NO_NODE_FITS,
    SCHEDULED,
    room_cannot_fix,
)
from accounting.validate import validate_pod
from services.common import telemetry
from services.common.errors import DependencyUnavailableError
from services.common.json_endpoint import Answer
from services.common.policy import PolicySource, under_recorder_policy
from services.scheduler import convert
from services.scheduler.convert import FilterInput, FilterOutcome, NodeNameReader
from services.scheduler.extender_args import (
    ExtenderArgs,
    ExtenderArgsError,
    filter_result,
    node_name,
    read_extender_args,
)
from services.scheduler.placer import PodPlacer
from services.scheduler.pod_annotations import PatchError, PodAnnotationWriter
from services.scheduler.recorder_client import RecorderClient

_LOG = logging.getLogger(__name__)

FILTER_PATH = "/filter"
MAX_BODY_BYTES = 8 * 1024 * 1024
"""The largest ExtenderArgs accepted: a pod, and up to 10,000 node names (about 0.5 MiB) or, for
a simulation, the Node objects; HAMi's extender reads at most 1 MiB."""
DEFAULT_DEADLINE_S = 4.0
"""Inside kube-scheduler's default ``httpTimeout`` of 5 s."""
SPAN_NAME = "extender.filter"
_MIN_CALL_S = 0.001
_MIN_PATCH_S = 0.25


@dataclass(frozen=True, slots=True)
class _Placed:
    """A Scheduled outcome and the pod it placed."""

    pod: Pod
    outcome: FilterOutcome


class ExtenderFilter:
    """Answers ``POST /filter`` (see the module docstring)."""

    def __init__(
        self,
        placer: PodPlacer,
        recorder: RecorderClient,
        annotations: PodAnnotationWriter,
        *,
        policy: PolicySource,
        node_policy: str = BINPACK,
        gpu_policy: str = SPREAD,
        deadline_s: float = DEFAULT_DEADLINE_S,
        tracer: trace.Tracer | None = None,
        clock: Any = time.monotonic,
    ) -> None:
        self._placer = placer
        self._recorder = recorder
        self._annotations = annotations
        self._policy = policy
        self._node_policy = node_policy
        self._gpu_policy = gpu_policy
        self._deadline_s = deadline_s
        self._tracer = tracer or trace.NoOpTracer()
        self._clock = clock
        self._names = NodeNameReader()

    def answer(self, body: bytes) -> Answer:
        """The HTTP status and ExtenderFilterResult of one request body."""
        try:
            args = read_extender_args(body)
            deadline = self._clock() + self._deadline_s
            token = otel_context.attach(_pod_trace(args.pod))
            try:
                with self._tracer.start_as_current_span(
                    SPAN_NAME, kind=trace.SpanKind.SERVER, attributes=_span_attributes(args)
                ) as span:
                    result = self._answer(args, deadline)
                    telemetry.set_attributes(span, {"error": result["Error"]} if result["Error"]
                                             else {"nodes": len(result["NodeNames"] or ())})
                    return HTTPStatus.OK, result
            finally:
                otel_context.detach(token)
        except ExtenderArgsError as error:
            return HTTPStatus.BAD_REQUEST, filter_result(
                error=errors.bounded_text(f"malformed ExtenderArgs: {error}",
                                          errors.MAX_MESSAGE_CHARS)
            )

    # -- the two forms ---------------------------------------------------------------------------

    def _answer(self, args: ExtenderArgs, deadline: float) -> dict[str, Any]:
        if args.node_names is None:
            assert args.nodes is not None
            return self._simulate(args)
        if not args.node_names:
            return filter_result(node_names=())
        checked = Violations()
        node_names = self._names.read(checked, args.node_names, path="NodeNames")
        try:
            checked.raise_if_any()
        except InvalidInputError as error:
            # Not a pod's problem: kube-scheduler never sends such names.
            raise ExtenderArgsError(error.bounded()[1]) from None
        try:
            pod, outcome = self._placer.place_request(
                lambda vendors: self._read_input(args.pod, node_names, vendors),
                lambda: pod_json.names_extended_resources(args.pod),
                lambda: max(min(self._placer.usage_timeout_s, deadline - self._clock()),
                            _MIN_CALL_S),
            )
        except InvalidInputError as error:
            message = error.bounded(prefix="invalid pod: ")[1]
            return filter_result(
                node_names=(), unresolvable=dict.fromkeys(args.node_names, message)
            )
        except DependencyUnavailableError as error:
            return filter_result(error=str(error))
        if outcome.reason == NO_GPU_REQUEST:
            return filter_result(node_names=args.node_names)
        failed, unresolvable = _split_failed(convert.failed_nodes(outcome.fit,
                                                                  outcome.unregistered))
        if outcome.reason == NO_NODE_FITS:
            return filter_result(node_names=(), failed=failed, unresolvable=unresolvable)
        if outcome.reason != SCHEDULED:
            # ReservationConflict or PodForgotten: the placement is not ours to give.
            return filter_result(error=f"{outcome.reason}: {outcome.message}")
        problem = self._annotate(_Placed(pod, outcome), deadline)
        if problem is not None:
            return filter_result(error=problem)
        assert outcome.fit.node_name is not None
        return filter_result(
            node_names=(outcome.fit.node_name,), failed=failed, unresolvable=unresolvable
        )

    def _read_input(
        self, pod_object: Mapping[str, Any], node_names: tuple[str, ...], vendors: Sequence[Any]
    ) -> FilterInput:
        pod = pod_json.parse_pod(pod_object, vendors, path="Pod")
        validate_pod(pod, "Pod")
        return FilterInput(pod=pod, node_names=node_names)

    def _simulate(self, args: ExtenderArgs) -> dict[str, Any]:
        given = args.nodes or ()

        def fitted(policy: AccountingPolicy | None) -> tuple[FitResult | None, dict[str, str]]:
            if policy is None:
                return None, {}  # no device asked and no policy to read the nodes with
            pod = pod_json.parse_pod(args.pod, policy.vendors, path="Pod")
            validate_pod(pod, "Pod")
            states, refused = _template_nodes(given, policy.vendors)
            fit = fit_pod(pod, states, vendors=policy.vendors, node_policy=self._node_policy,
                          gpu_policy=self._gpu_policy)
            return fit, refused

        try:
            fit, refused = under_recorder_policy(
                self._policy, lambda: pod_json.names_extended_resources(args.pod), fitted
            )
        except InvalidInputError as error:
            message = error.bounded(prefix="invalid pod: ")[1]
            return filter_result(
                nodes=(), unresolvable={node_name(node): message for node in given}
            )
        except DependencyUnavailableError as error:
            return filter_result(error=str(error))
        if fit is None or fit.reason == NO_GPU_REQUEST:
            return filter_result(nodes=given)
        failed, unresolvable = _split_failed(fit.failed_nodes)
        unresolvable.update(refused)  # a Node that cannot be read stays unreadable
        chosen = [node for node in given if node_name(node) == fit.node_name][:1]
        return filter_result(nodes=chosen, failed=failed, unresolvable=unresolvable)

    # -- the patch -------------------------------------------------------------------------------

    def _annotate(self, placed: _Placed, deadline: float) -> str | None:
        """Patches the placement's annotations onto the pod; on failure releases the
        reservation and returns the Error to answer."""
        pod, outcome = placed.pod, placed.outcome
        annotations = dict(outcome.annotations)
        if telemetry.context_from_traceparent(pod.annotations.get(TRACEPARENT_ANNOTATION, "")) \
                is None:
            traceparent = telemetry.current_traceparent()
            if traceparent:
                annotations[TRACEPARENT_ANNOTATION] = traceparent
        timeout_s = max(deadline - self._clock(), _MIN_PATCH_S)
        try:
            self._annotations.write(pod.namespace, pod.name, pod.uid, annotations, timeout_s)
        except PatchError as error:
            return self._release(pod, outcome, f"cannot annotate pod {pod.key}: {error}")
        return None

    def _release(self, pod: Pod, outcome: FilterOutcome, problem: str) -> str:
        assert outcome.reservation is not None
        try:
            released = self._recorder.release(
                pod.uid, outcome.reservation.stored_revision, self._placer.usage_timeout_s
            )
        except Exception as error:  # the recorder went away between Reserve and now
            _LOG.error("%s; its reservation could not be released: %s", problem, error,
                       extra={"pod_uid": pod.uid})
            return (f"{problem}; its reservation could not be released ({error}): a later "
                    "Filter of the pod replaces it, ForgetPod or the pod's deletion drops it")
        _LOG.warning("%s; reservation released: %s", problem, released.reason,
                     extra={"pod_uid": pod.uid, "released": released.released})
        return f"{problem}; its reservation was released ({released.reason})"


def _pod_trace(pod_object: Mapping[str, Any]) -> otel_context.Context:
    """The context the request's span starts in: the pod's trace (module docstring)."""
    metadata = pod_object.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    annotations = metadata.get("annotations")
    written = annotations.get(TRACEPARENT_ANNOTATION) if isinstance(annotations, dict) else None
    if isinstance(written, str):
        parent = telemetry.context_from_traceparent(written)
        if parent is not None:
            return parent
    uid = metadata.get("uid")
    if isinstance(uid, str) and uid:
        return telemetry.pod_uid_trace(uid)
    return otel_context.get_current()


def _span_attributes(args: ExtenderArgs) -> dict[str, Any]:
    metadata = args.pod.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    return {
        key: value
        for key, value in (
            (telemetry.ATTR_POD_UID, metadata.get("uid")),
            (telemetry.ATTR_POD_NAMESPACE, metadata.get("namespace")),
            (telemetry.ATTR_POD_NAME, metadata.get("name")),
            (telemetry.ATTR_PREFIX + "node_count",
             len(args.node_names) if args.node_names is not None else len(args.nodes or ())),
            (telemetry.ATTR_PREFIX + "simulation", args.node_names is None),
        )
        if isinstance(value, (str, int, bool))
    }


def _split_failed(failed: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(FailedNodes, FailedAndUnresolvableNodes) of the fit's failed nodes."""
    fixable: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    for name, reason in failed.items():
        (unresolvable if room_cannot_fix(reason) else fixable)[name] = reason
    return fixable, unresolvable


def _template_nodes(
    nodes: Sequence[Mapping[str, Any]], vendors: Sequence[Any]
) -> tuple[list[NodeState], dict[str, str]]:
    """The simulation's nodes as empty NodeStates, and the ones that cannot be read (their
    reason names the field, as HAMi names why it cannot build the node)."""
    states: list[NodeState] = []
    refused: dict[str, str] = {}
    for index, node in enumerate(nodes):
        name = node_name(node) or f"Nodes.items[{index}]"
        try:
            registration = parse_node(node, vendors)
        except InvalidInputError as error:
            refused[name] = "; ".join(f"{v.path}: {v.message}" for v in error.violations)
            continue
        states.append(NodeState.unused(registration.node_name, registration.devices))
    return states, refused
