"""Why a daemon that gRPC reports only as UNAVAILABLE cannot be reached: nothing listening,
or a TLS setting on one side that the other does not share.

Layer: services/common (runtime). gRPC folds a refused connection, a plaintext client at a TLS
daemon and a certificate from the wrong CA into one ``UNAVAILABLE``; a command-line user needs
to know which, so this asks the socket and the TLS handshake directly, once, after gRPC failed.
"""

from __future__ import annotations

import socket
import ssl

from services.common.config import TlsConfig, parse_host_port

__all__ = ["unreachable_reason"]

# What OpenSSL says when the peer's first bytes are not a TLS record (a plaintext HTTP/2
# server answers a ClientHello with a GOAWAY frame, or just closes).
_NOT_TLS = frozenset({
    "WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "UNEXPECTED_EOF_WHILE_READING",
    "HTTP_REQUEST", "PACKET_LENGTH_TOO_LONG",
})

_TLS_HINT = (
    "set HAMI_ACCOUNTING_TLS_CERT_FILE, HAMI_ACCOUNTING_TLS_KEY_FILE and "
    "HAMI_ACCOUNTING_TLS_CA_FILE as the daemon's clients do (docs/security.md)"
)


def unreachable_reason(target: str, tls: TlsConfig | None, timeout_s: float) -> str | None:
    """One sentence saying what keeps this client from the daemon at ``target``, or None when
    the probe finds nothing wrong at the socket or TLS level (then gRPC's own words stand)."""
    try:
        host, port = parse_host_port(target)
    except ValueError:
        return None
    try:
        connection = socket.create_connection((host, port), timeout=timeout_s)
    except ConnectionRefusedError:
        return f"nothing listens on {target}"
    except OSError as error:
        return f"cannot connect to {target}: {error.strerror or error}"
    with connection:
        speaks_tls, refusal = _handshake(connection, host, tls, timeout_s, verify=False)
    if not speaks_tls:
        if tls is None:
            return None
        return (f"the daemon at {target} speaks plaintext, and this client is set for TLS "
                "(HAMI_ACCOUNTING_TLS_*): unset those variables, or give the daemon its "
                "certificate")
    if tls is None:
        return f"the daemon at {target} speaks TLS and this client does not: {_TLS_HINT}"
    if refusal is not None:
        return (f"the daemon at {target} refused this client's certificate "
                f"({refusal}): it must be signed by the CA the daemon trusts")
    try:
        connection = socket.create_connection((host, port), timeout=timeout_s)
    except OSError:
        return None
    with connection:
        _speaks, untrusted = _handshake(connection, host, tls, timeout_s, verify=True)
    if untrusted is not None:
        return (f"the certificate of the daemon at {target} is not trusted by "
                f"HAMI_ACCOUNTING_TLS_CA_FILE, or does not name {host} ({untrusted})")
    return None


def _handshake(
    connection: socket.socket, host: str, tls: TlsConfig | None, timeout_s: float, *,
    verify: bool,
) -> tuple[bool, str | None]:
    """Whether the peer speaks TLS, and what it (or, with ``verify``, this side) refused."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.set_alpn_protocols(["h2"])
    if verify and tls is not None:
        if tls.ca_file is not None:
            context.load_verify_locations(cafile=tls.ca_file)
        else:
            context.load_default_certs()
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if tls is not None:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    connection.settimeout(timeout_s)
    try:
        with context.wrap_socket(connection, server_hostname=host) as secured:
            # Under TLS 1.3 a server refuses a client certificate after the handshake: it
            # alerts, or closes the connection, where an HTTP/2 server would send its settings.
            if secured.recv(1) == b"":
                return True, "the connection was closed after the handshake"
    except ssl.SSLCertVerificationError as error:
        return True, error.verify_message or error.reason or str(error)
    except ssl.SSLError as error:
        reason = error.reason or str(error)
        if reason in _NOT_TLS:
            return False, None
        return True, reason.lower().replace("_", " ")
    except (TimeoutError, ConnectionError, OSError):
        return True, None
    return True, None
