"""gRPC adapter of the UsageRecorder service; no business rules.

Layer: services/usage (adapter). Each method validates and converts the request, calls the
usage store (which applies the accounting rules, journals, traces and counts), and converts the
result back. Errors are mapped to status codes by ``map_errors``. When leader election is on,
a standby replica refuses writes with FAILED_PRECONDITION naming the leader, and still serves
reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, TypeVar

import grpc

from accounting.errors import AccountingError
from hami.accounting.v1 import usage_pb2, usage_pb2_grpc
from services.common import convert as common
from services.common.errors import map_errors
from services.usage import convert
from services.usage.store import UsageStore

SERVICE_NAME = usage_pb2.DESCRIPTOR.services_by_name["UsageRecorder"].full_name
"""hami.accounting.v1.UsageRecorder"""

WATCH_POLL_S = 1.0
"""How often an idle watch stream checks that its client is still there."""


class LeaderStatus(Protocol):
    """What the servicer needs to know about leader election (``__main__.LeaderView``)."""

    @property
    def is_leader(self) -> bool: ...

    @property
    def identity(self) -> str:
        """This replica's holder identity."""
        ...

    @property
    def leader_identity(self) -> str | None:
        """Who holds the Lease, when known."""
        ...


class NotLeaderError(AccountingError):
    """A write reached a standby replica (mapped to FAILED_PRECONDITION)."""


WriteResponse = TypeVar(
    "WriteResponse",
    usage_pb2.RecordPodResponse,
    usage_pb2.ForgetPodResponse,
    usage_pb2.ReserveResponse,
    usage_pb2.RegisterNodeResponse,
    usage_pb2.SetQuotaResponse,
)
"""The answers of the writes: each carries the revision a reader can wait for."""


class UsageRecorderServicer(usage_pb2_grpc.UsageRecorderServicer):
    """The UsageRecorder RPCs over one ``UsageStore``."""

    def __init__(
        self,
        store: UsageStore,
        *,
        leader: LeaderStatus | None = None,
        watch_poll_s: float = WATCH_POLL_S,
    ) -> None:
        self._store = store
        # Pods are read with the resource names of the policy the store decides under.
        self._vendors = store.policy.vendors
        self._leader = leader
        self._watch_poll_s = watch_poll_s

    def _with_revision(self, response: WriteResponse) -> WriteResponse:
        """A write's answer with its read-your-writes token (the revision its change is visible
        at; the last visible one when it changed nothing)."""
        response.revision = self._store.visible_revision
        return response

    def _require_leader(self) -> None:
        if self._leader is None or self._leader.is_leader:
            return
        holder = self._leader.leader_identity or "unknown (no replica holds the Lease)"
        raise NotLeaderError(
            f"not the leader; the leader is {holder} (this replica is {self._leader.identity})"
        )

    # -- writes --------------------------------------------------------------------------------

    @map_errors
    def RecordPod(
        self, request: usage_pb2.RecordPodRequest, context: grpc.ServicerContext
    ) -> usage_pb2.RecordPodResponse:
        self._require_leader()
        pod = common.pod_from_source(request, self._vendors)
        return self._with_revision(convert.record_response(self._store.record_pod(pod)))

    @map_errors
    def ForgetPod(
        self, request: usage_pb2.ForgetPodRequest, context: grpc.ServicerContext
    ) -> usage_pb2.ForgetPodResponse:
        self._require_leader()
        pod_uid = convert.require_pod_uid(request.pod_uid)
        return self._with_revision(convert.forget_response(self._store.forget_pod(pod_uid)))

    @map_errors
    def Reserve(
        self, request: usage_pb2.ReserveRequest, context: grpc.ServicerContext
    ) -> usage_pb2.ReserveResponse:
        self._require_leader()
        pod = convert.reserve_pod(request, self._vendors)
        outcome = self._store.reserve(pod, request.node_name, policy_id=request.policy_id)
        return self._with_revision(convert.reserve_response(outcome))

    @map_errors
    def RegisterNode(
        self, request: usage_pb2.RegisterNodeRequest, context: grpc.ServicerContext
    ) -> usage_pb2.RegisterNodeResponse:
        self._require_leader()
        node = common.node_from_source(request)
        snapshot = self._store.register_node(node.node_name, node.devices)
        return self._with_revision(convert.register_node_response(snapshot))

    @map_errors
    def SetQuota(
        self, request: usage_pb2.SetQuotaRequest, context: grpc.ServicerContext
    ) -> usage_pb2.SetQuotaResponse:
        self._require_leader()
        items = self._store.set_quota(request.namespace, dict(request.limits))
        return self._with_revision(convert.set_quota_response(items))

    # -- reads ---------------------------------------------------------------------------------

    @map_errors
    def GetPodUsage(
        self, request: usage_pb2.GetPodUsageRequest, context: grpc.ServicerContext
    ) -> usage_pb2.GetPodUsageResponse:
        pod_uid = convert.require_pod_uid(request.pod_uid)
        return convert.pod_usage_response(self._store.pod(pod_uid))

    @map_errors
    def GetNodeUsage(
        self, request: usage_pb2.GetNodeUsageRequest, context: grpc.ServicerContext
    ) -> usage_pb2.GetNodeUsageResponse:
        nodes, unknown = self._store.node_usage(convert.node_names(request))
        return convert.node_usage_response(nodes, unknown)

    @map_errors
    def GetNamespaceUsage(
        self, request: usage_pb2.GetNamespaceUsageRequest, context: grpc.ServicerContext
    ) -> usage_pb2.GetNamespaceUsageResponse:
        return convert.namespace_usage_response(
            self._store.namespace_items(request.namespace), self._store.policy.policy_id
        )

    @map_errors
    def GetPolicy(
        self, request: usage_pb2.GetPolicyRequest, context: grpc.ServicerContext
    ) -> usage_pb2.GetPolicyResponse:
        return convert.policy_response(self._store.policy)

    @map_errors
    def WatchUsage(
        self, request: usage_pb2.WatchUsageRequest, context: grpc.ServicerContext
    ) -> Iterator[usage_pb2.UsageEvent]:
        content = convert.watch_content(request)
        subscription = self._store.subscribe(
            request.send_initial_state, content, send_policy=request.send_policy
        )
        # A client that goes away wakes the loop at once instead of at the next poll.
        context.add_callback(subscription.close)
        try:
            while context.is_active():
                event = subscription.next(self._watch_poll_s)
                if event is not None:
                    yield convert.event_to_pb(event, content)
                elif subscription.overflowed:
                    context.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        "watcher fell too far behind and was dropped; "
                        "watch again with send_initial_state",
                    )
                elif subscription.closed:
                    return
        finally:
            subscription.close()
