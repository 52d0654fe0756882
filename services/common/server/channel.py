"""The client channel a daemon (or a tool) dials another daemon with.

Layer: services (runtime). The same message limits as the servers, a reconnect backoff short
enough to follow a recorder's restart, TLS with the daemon's own certificate, and, when a
tracer provider is given, the client spans of opentelemetry-instrumentation-grpc.
"""

from __future__ import annotations

import grpc
from opentelemetry.instrumentation.grpc import client_interceptor, grpcext
from opentelemetry.sdk.trace import TracerProvider

from services.common.config import TlsConfig
from services.common.server.listen import DEFAULT_MAX_MESSAGE_BYTES, message_options


def client_channel(
    target: str,
    *,
    tls: TlsConfig | None = None,
    tracer_provider: TracerProvider | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> grpc.Channel:
    """A channel to another daemon, traced with ``tracer_provider`` when given.

    With ``tls``, the server is verified against its CA (the system roots when the CA is None)
    and the daemon's own certificate is presented (needed when the server runs mutual TLS).
    """
    options = [
        *message_options(max_message_bytes),
        # gRPC's default reconnect backoff grows to 120 s: a daemon started before the recorder
        # (a rollout, a recorder restart) would answer UNAVAILABLE for minutes after the recorder
        # is back. Retry the connection at most every 2 s instead.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2000),
    ]
    if tls is None:
        channel = grpc.insecure_channel(target, options=options)
    else:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=tls.read_ca(),
            private_key=tls.read_key(),
            certificate_chain=tls.read_cert(),
        )
        channel = grpc.secure_channel(target, credentials, options=options)
    if tracer_provider is None:
        return channel
    interceptor = client_interceptor(tracer_provider=tracer_provider)  # type: ignore[no-untyped-call]
    # The OTel client interceptor implements OTel's own interceptor API, not grpc's.
    traced: grpc.Channel = grpcext.intercept_channel(channel, interceptor)  # type: ignore[no-untyped-call]
    return traced
