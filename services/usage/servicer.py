"""gRPC adapter of the UsageRecorder service; no business rules.

Layer: services/usage (adapter). Each method validates and converts the request, calls the
usage store (which applies the accounting rules, journals, traces and counts), and converts the
result back. Errors are mapped to status codes by ``map_errors``. When leader election is on,
a standby replica refuses writes with FAILED_PRECONDITION naming the leader, and still serves
reads.

The unary methods are synchronous: the recorder's aio server runs them on its thread pool.
``WatchUsage`` is an async generator on the server's event loop: it opens a stream on the
store's watch hub, subscribes it off the loop (the store's lock and the initial state's
encoding), and passes on the hub's messages, which are already encoded — ``add_to_server``
registers it with a pass-through serializer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from concurrent import futures
from typing import Any, Protocol, TypeVar

import grpc

from accounting.errors import AccountingError, InvalidInputError
from hami.accounting.v1 import usage_pb2, usage_pb2_grpc
from services.common import convert as common
from services.common.errors import map_errors
from services.usage import convert
from services.usage.store import UsageStore
from services.usage.watch_hub import StreamCapReachedError, WatcherCutOffError

SERVICE_NAME = usage_pb2.DESCRIPTOR.services_by_name["UsageRecorder"].full_name
"""hami.accounting.v1.UsageRecorder"""
INLINE_METHODS = frozenset(
    f"/{SERVICE_NAME}/{name}"
    for name in (
        "RecordPod", "ForgetPod", "Reserve", "ReleaseReservation", "GetPodUsage",
        "GetNamespaceUsage", "RegisterNode", "SetQuota", "GetPolicy",
    )
)
"""The calls the recorder's event loop answers itself
(``services.common.server.event_loop.build_aio_server``): each takes the store's lock for a
fraction of a millisecond and waits on nothing else (SQLite commits without fsync by default).
GetNodeUsage is not among them: every node of a large cluster takes milliseconds to copy out.
A standby replica's writes are not run there either: naming the leader may read the Lease
from the Kubernetes API."""


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
    usage_pb2.ReleaseReservationResponse,
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
    ) -> None:
        self._store = store
        # Pods are read with the resource names of the policy the store decides under.
        self._vendors = store.policy.vendors
        self._leader = leader
        # One thread subscribes watchers: a subscription takes the store's lock and encodes the
        # initial state, which must not happen on the event loop nor on a unary call's thread.
        self._subscriber = futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="watch-subscribe"
        )

    def _with_revision(self, response: WriteResponse) -> WriteResponse:
        """A write's answer with its read-your-writes token (the revision its change is visible
        at; the last visible one when it changed nothing)."""
        response.revision = self._store.visible_revision
        return response

    def must_not_run_inline(self) -> bool:
        """True when a call could block the event loop now: another thread holds the store's
        lock, or this replica is a standby (a write reads the Lease to name the leader)."""
        return self._store.busy or (self._leader is not None and not self._leader.is_leader)

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
        try:
            outcome = self._store.record_pod(pod)
        except InvalidInputError as error:
            raise common.grants_as_sent(error, request, pod, self._vendors) from None
        return self._with_revision(convert.record_response(outcome))

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
        replaces = (
            request.replaces_revision if request.HasField("replaces_revision") else None
        )
        try:
            outcome = self._store.reserve(
                pod, request.node_name, policy_id=request.policy_id, replaces_revision=replaces
            )
        except InvalidInputError as error:
            if request.container_grants:
                raise
            raise common.grants_as_sent(error, request, pod, self._vendors) from None
        return self._with_revision(convert.reserve_response(outcome))

    @map_errors
    def ReleaseReservation(
        self, request: usage_pb2.ReleaseReservationRequest, context: grpc.ServicerContext
    ) -> usage_pb2.ReleaseReservationResponse:
        self._require_leader()
        pod_uid = convert.require_pod_uid(request.pod_uid)
        outcome = self._store.release_reservation(pod_uid, request.replaces_revision)
        return self._with_revision(convert.release_response(outcome))

    @map_errors
    def RegisterNode(
        self, request: usage_pb2.RegisterNodeRequest, context: grpc.ServicerContext
    ) -> usage_pb2.RegisterNodeResponse:
        self._require_leader()
        node = common.node_from_source(request, self._vendors)
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

    @map_errors  # type: ignore[arg-type]  # the aio context: same surface
    async def WatchUsage(  # type: ignore[override]  # yields encoded UsageEvent messages
        self, request: usage_pb2.WatchUsageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        content = convert.watch_content(request)
        hub = self._store.hub
        try:
            stream = hub.open(content, request.accept_batches)
        except StreamCapReachedError as error:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error))
        try:
            initial = await asyncio.get_running_loop().run_in_executor(
                self._subscriber, self._store.subscribe, stream, request.send_initial_state,
                request.send_policy,
            )
            messages = hub.messages(stream, initial)
            del initial  # the hub lets it go once it has been sent
            async for message in messages:
                yield message
        except WatcherCutOffError as error:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error))
        finally:
            hub.close(stream)

    def close(self) -> None:
        """Stops the subscribing thread (after the server has stopped)."""
        self._subscriber.shutdown(wait=False, cancel_futures=True)


class _Registrations:
    """Collects what the generated ``add_UsageRecorderServicer_to_server`` registers."""

    def __init__(self) -> None:
        self.method_handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: Sequence[Any]) -> None:
        pass  # rebuilt from the method handlers below

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.method_handlers.update(handlers)


def add_to_server(servicer: UsageRecorderServicer, server: grpc.aio.Server) -> None:
    """Registers the UsageRecorder service, with WatchUsage sending the hub's bytes as they are
    (grpc passes bytes through when the serializer is None)."""
    collected = _Registrations()
    usage_pb2_grpc.add_UsageRecorderServicer_to_server(servicer, collected)  # type: ignore[arg-type]
    handlers = dict(collected.method_handlers)
    handlers["WatchUsage"] = grpc.unary_stream_rpc_method_handler(
        servicer.WatchUsage,
        request_deserializer=usage_pb2.WatchUsageRequest.FromString,
        response_serializer=None,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),)
    )
    server.add_registered_method_handlers(SERVICE_NAME, handlers)  # type: ignore[attr-defined]
