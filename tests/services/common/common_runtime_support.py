"""Test support for the shared runtime tests: a tiny UsageRecorder servicer and shared names.

A uniquely named module (not conftest) so test files can import it without clashing with
other test folders' conftest modules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from accounting.errors import FieldViolation, InvalidInputError
from hami.accounting.v1 import usage_pb2, usage_pb2_grpc
from services.common import server as common_server
from services.common.errors import DependencyUnavailableError, NotFoundError, map_errors

USAGE_SERVICE = "hami.accounting.v1.UsageRecorder"
SECRET = "s3cret-token-from-the-request"
# A port nothing listens on: used to make a real upstream call fail with UNAVAILABLE.
DEAD_TARGET = "127.0.0.1:1"


class TinyRecorder(usage_pb2_grpc.UsageRecorderServicer):
    """Implements GetPodUsage and WatchUsage only; the pod uid picks the behaviour."""

    @map_errors
    def GetPodUsage(
        self, request: usage_pb2.GetPodUsageRequest, context: grpc.ServicerContext
    ) -> usage_pb2.GetPodUsageResponse:
        uid = request.pod_uid
        if uid == "invalid":
            raise InvalidInputError([
                FieldViolation("pod.uid", "must not be empty"),
                FieldViolation("pod.containers[1].grants[0].memory_mib", "must be >= 0"),
            ])
        if uid == "bug":
            raise RuntimeError(f"unexpected state while handling {SECRET}")
        if uid == "missing":
            raise NotFoundError("pod missing is not tracked")
        if uid == "dependency":
            raise DependencyUnavailableError("kubernetes API unavailable at 10.0.0.1:443")
        if uid == "own-abort":
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "the servicer said no itself")
        if uid == "upstream":
            with grpc.insecure_channel(DEAD_TARGET) as channel:
                usage_pb2_grpc.UsageRecorderStub(channel).GetPodUsage(
                    usage_pb2.GetPodUsageRequest(pod_uid="x"), timeout=2.0
                )
        return usage_pb2.GetPodUsageResponse(found=True, namespace="team-a", name=uid)

    @map_errors
    def WatchUsage(
        self, request: usage_pb2.WatchUsageRequest, context: grpc.ServicerContext
    ) -> Iterator[usage_pb2.UsageEvent]:
        yield usage_pb2.UsageEvent(revision=1)
        if request.send_initial_state:
            raise InvalidInputError.single("send_initial_state", "not supported by this fake")
        yield usage_pb2.UsageEvent(revision=2)


ServeFn = Callable[..., common_server.ServerHandle]
SpanFixture = tuple[TracerProvider, InMemorySpanExporter]
