"""Where a daemon's server listens: the port it binds, plaintext or (mutual) TLS, its message
limits, and the address a client on the same machine dials for it.

Layer: services (runtime). Both servers (``thread_pool``, ``event_loop``) bind through
``bind``: a taken address, an unreadable certificate or an address this machine does not have
is a ``ServerStartError`` naming it, never grpcio's bare "failed to bind".
"""

from __future__ import annotations

from typing import Any, Protocol

import grpc

from services.common.config import TlsConfig, parse_host_port
from services.common.ports import listen_problem

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024

# Addresses that listen everywhere; a local client reaches them through the loopback address.
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]", ""})


class ServerStartError(RuntimeError):
    """The server cannot start, typically because its address cannot be bound."""


class _Ports(Protocol):
    """What binding needs of a server: ``grpc.Server`` and ``grpc.aio.Server`` alike."""

    def add_insecure_port(self, address: str) -> int: ...

    def add_secure_port(self, address: str, server_credentials: Any) -> int: ...


def message_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """The channel options that limit received and sent messages (servers and clients)."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]


def server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """A daemon server's options: the message limits, and no shared port."""
    return [
        *message_options(max_message_bytes),
        # Without this a second server on the same port binds too (SO_REUSEPORT) and the two
        # share traffic silently; a daemon must fail instead.
        ("grpc.so_reuseport", 0),
    ]


def dial_target(listen_addr: str, port: int) -> str:
    """An address a client on this machine can dial for a server listening on ``listen_addr``
    (a wildcard host is reached through the loopback address), at its bound ``port``."""
    host, _ = parse_host_port(listen_addr)
    if host in _WILDCARD_HOSTS:
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"{host}:{port}"


def tls_mode(tls: TlsConfig | None) -> str:
    """How the server is reached, as its "listening" log line says: off, server or mutual."""
    if tls is None:
        return "off"
    return "mutual" if tls.mutual else "server"


def bind(server: _Ports, listen_addr: str, tls: TlsConfig | None) -> int:
    """Binds ``server`` to ``listen_addr`` (with ``tls``) and returns the bound port.

    Raises:
        ServerStartError: the address is malformed, taken or not this machine's, or the
            certificates cannot be read.
    """
    try:
        host, port = parse_host_port(listen_addr)
    except ValueError as error:
        raise ServerStartError(f"listen address {error}") from None
    busy = listen_problem(host, port)
    if busy is not None:
        raise ServerStartError(f"cannot listen on {listen_addr}: {busy}")
    if tls is not None:
        problem = tls.problem()
        if problem is not None:
            raise ServerStartError(problem)
    try:
        if tls is None:
            port = server.add_insecure_port(listen_addr)
        else:
            credentials = grpc.ssl_server_credentials(
                [(tls.read_key(), tls.read_cert())],
                root_certificates=tls.read_ca(),
                require_client_auth=tls.mutual,
            )
            port = server.add_secure_port(listen_addr, credentials)
    except OSError as error:
        raise ServerStartError(f"cannot read TLS files: {error}") from None
    except RuntimeError as error:
        raise ServerStartError(
            f"cannot listen on {listen_addr} (address in use or not available here): {error}"
        ) from None
    if port == 0:
        # Older grpcio reports a failed bind by returning 0 instead of raising.
        raise ServerStartError(
            f"cannot listen on {listen_addr} (address in use or not available here)"
        )
    return port
