"""An OTLP/gRPC trace receiver inside the benchmark, so traced daemons really export.

Layer: benchmark. The daemons' BatchSpanProcessor sends ExportTraceServiceRequest batches here
(the OTLP exporter of docs/observability.md); the sink only counts spans per service, so what a
traced run pays is the daemons' own tracing and exporting, not a backend's.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class OtlpSink(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spans_by_service: Counter[str] = Counter()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def Export(
        self,
        request: trace_service_pb2.ExportTraceServiceRequest,
        context: grpc.ServicerContext,
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        counts: Counter[str] = Counter()
        for resource_spans in request.resource_spans:
            service = next((a.value.string_value for a in resource_spans.resource.attributes
                            if a.key == "service.name"), "?")
            counts[service] += sum(len(s.spans) for s in resource_spans.scope_spans)
        with self._lock:
            self.spans_by_service.update(counts)
        return trace_service_pb2.ExportTraceServiceResponse()

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.spans_by_service)

    def stop(self) -> None:
        self._server.stop(0)
