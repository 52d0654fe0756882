"""Whether an address can be listened on, asked before anything binds it.

Layer: services/common (runtime). gRPC's C core writes its own error line to stderr when a
bind fails, before Python sees the failure; asking the kernel first lets a daemon, or ``up``
before it starts three of them, refuse a busy address with one clear sentence instead.
"""

from __future__ import annotations

import errno
import socket

__all__ = ["listen_problem"]


def listen_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on now, or None when it can (or cannot be told).

    Port 0 (any free port) always can. The probe binds as a server does (``SO_REUSEADDR``, so a
    port left in TIME_WAIT by a daemon that just stopped is not taken for a busy one) and lets
    go at once; what it cannot resolve or probe is left to the real bind to report.
    """
    if port == 0:
        return None
    try:
        addresses = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (OSError, UnicodeError):
        return None
    for family, kind, proto, _name, address in addresses:
        try:
            probe = socket.socket(family, kind, proto)
        except OSError:
            continue
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    return "the address is already in use"
                if error.errno == errno.EADDRNOTAVAIL:
                    return "the address is not available on this machine"
                if error.errno == errno.EACCES:
                    return "permission denied (ports below 1024 need privileges)"
                return error.strerror or str(error)
    return None
