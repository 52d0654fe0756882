"""The usage recorder as the scheduler calls it: ``RecorderClient``.

Layer: services/scheduler (adapter). The scheduler's only way to the usage recorder: a deadline
on every call, and an unreachable recorder is ``DependencyUnavailableError`` (UNAVAILABLE on the
wire). It reads the candidates' node usage and the namespace quota (one snapshot, in parallel),
what is stored for a pod, and sends Reserve and ReleaseReservation; every read tells the
recorder's accounting policy (services.common.policy) what it was answered under.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from accounting.fit import NodeState, QuotaContext
from accounting.model import Pod
from accounting.reasons import NODE_CHANGED
from hami.accounting.v1 import usage_pb2, usage_pb2_grpc
from services.common.errors import recorder_unavailable
from services.common.policy import RecorderPolicy
from services.scheduler import convert
from services.scheduler.convert import PodDevices, Released, Reservation, StoredReservation
from services.scheduler.metrics import METRICS_SERVICE

NODE_BATCH = 500
"""Candidate nodes per GetNodeUsage call: 10,000 nodes' device lists in one answer would pass
the 4 MiB message limit, so large candidate lists are read in parallel batches."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """What one direct read answers, in candidate order."""

    nodes: tuple[NodeState, ...]
    """The registered candidates."""
    unregistered: tuple[str, ...]
    """The candidates the recorder does not know."""
    quota: QuotaContext
    """The namespace quota (empty, and meaning nothing, when the read did not ask for it)."""


class RecorderClient:
    """The usage recorder as the scheduler uses it; every call carries a deadline.

    Raises (every method):
        DependencyUnavailableError: the recorder is unreachable or did not answer in time,
            naming its address.
        grpc.RpcError: any other refusal (e.g. INVALID_ARGUMENT, or FAILED_PRECONDITION from a
            standby replica); ``map_errors`` passes those codes through.
    """

    def __init__(
        self,
        channel: grpc.Channel,
        target: str,
        *,
        node_batch: int = NODE_BATCH,
        policy: RecorderPolicy | None = None,
    ) -> None:
        """Args: ``policy`` is the recorder's accounting policy as this daemon holds it, told
        the policy every read was answered under; by default one over ``channel``."""
        self._channel = channel
        self._stub = usage_pb2_grpc.UsageRecorderStub(channel)
        self.target = target
        """The recorder's address, named in every error."""
        self._node_batch = node_batch
        self.policy = policy or RecorderPolicy(channel, target, service=METRICS_SERVICE)

    def close(self) -> None:
        self._channel.close()

    def _result(self, future: grpc.Future[T]) -> T:
        try:
            return future.result()
        except grpc.RpcError as error:
            raise self._mapped(error) from None

    def _call(self, method: Any, request: Any, timeout_s: float) -> Any:
        try:
            # Wait out a reconnect within the deadline rather than fail while the channel backs
            # off (the recorder restarting, or starting after this daemon).
            return method(request, timeout=timeout_s, wait_for_ready=True)
        except grpc.RpcError as error:
            raise self._mapped(error) from None

    def _mapped(self, error: grpc.RpcError) -> Exception:
        code = error.code() if callable(getattr(error, "code", None)) else None
        if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return error
        return recorder_unavailable(self.target, error, "the pod cannot be placed")

    def snapshot(
        self, node_names: Sequence[str], namespace: str, timeout_s: float, *, quota: bool = True
    ) -> Snapshot:
        """The candidates' device usage, the unregistered candidates, and the namespace quota,
        read in parallel (only the quota when ``node_names`` is empty); without ``quota`` only
        the nodes (the snapshot's quota is then empty and means nothing)."""
        if not quota:
            answers: list[usage_pb2.GetNodeUsageResponse] = [
                self._call(
                    self._stub.GetNodeUsage,
                    convert.node_usage_request(node_names[start : start + self._node_batch]),
                    timeout_s,
                )
                for start in range(0, len(node_names), self._node_batch)
            ]
            nodes, unknown = convert.node_states_from_pb(answers)
            return Snapshot(nodes=nodes, unregistered=unknown, quota=QuotaContext({}))
        quota_future = self._stub.GetNamespaceUsage.future(
            convert.namespace_usage_request(namespace), timeout=timeout_s, wait_for_ready=True
        )
        node_futures = [
            self._stub.GetNodeUsage.future(
                convert.node_usage_request(node_names[start : start + self._node_batch]),
                timeout=timeout_s,
                wait_for_ready=True,
            )
            for start in range(0, len(node_names), self._node_batch)
        ]
        try:
            responses: list[usage_pb2.GetNodeUsageResponse] = [
                self._result(future) for future in node_futures
            ]
            namespace_usage = self._result(quota_future)
            quota_context = convert.quota_context_from_pb(namespace_usage)
        finally:
            # After a failure the other reads are moot; cancelling a finished call is a no-op.
            pending: list[grpc.Future[Any]] = [quota_future, *node_futures]
            for call in pending:
                call.cancel()
        self.policy.observe(namespace_usage.policy_id)
        nodes, unknown = convert.node_states_from_pb(responses)
        return Snapshot(nodes=nodes, unregistered=unknown, quota=quota_context)

    def stored(self, pod_uid: str, timeout_s: float) -> StoredReservation | None:
        """What is stored for the pod (its node, usage and revision), or None."""
        return self.stored_later(pod_uid, timeout_s)()

    def stored_later(
        self, pod_uid: str, timeout_s: float
    ) -> Callable[[], StoredReservation | None]:
        """Starts reading what is stored for the pod; the returned call waits for the answer
        (so the read runs beside the Filter's other reads)."""
        future = self._stub.GetPodUsage.future(
            convert.pod_usage_request(pod_uid), timeout=timeout_s, wait_for_ready=True
        )
        return lambda: convert.stored_reservation(self._result(future))

    def release(self, pod_uid: str, replaces_revision: int, timeout_s: float) -> Released:
        """Releases the pod's reservation if it is still ``replaces_revision``."""
        response = self._call(
            self._stub.ReleaseReservation,
            convert.release_request(pod_uid, replaces_revision),
            timeout_s,
        )
        return convert.released_from_pb(response)

    def reserve(
        self,
        pod: Pod,
        node_name: str,
        grants: PodDevices,
        policy_id: str,
        timeout_s: float,
        *,
        replaces_revision: int | None = None,
    ) -> Reservation:
        """Reserves the grants, fitted under the accounting policy ``policy_id``, in place of
        the reservation ``replaces_revision`` (0: none) when given."""
        try:
            response = self._call(
                self._stub.Reserve,
                convert.reserve_request(pod, node_name, grants, policy_id, replaces_revision),
                timeout_s,
            )
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.INVALID_ARGUMENT:
                raise
            # The pod was validated here and the grants come from this recorder's own node
            # state: if it calls them invalid, the node changed since it was read (unregistered,
            # or its inventory replaced). That is a lost race, refused like any other so the
            # node is read again, not an error blaming the caller's pod.
            return Reservation(
                reserved=False,
                reason=NODE_CHANGED,
                message=f"the recorder refused the grants: {error.details()}",
            )
        return convert.reservation_from_pb(response)
