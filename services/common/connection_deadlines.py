"""Connection deadlines for the JSON endpoints (services.common.json_endpoint): one thread
closes every connection that overruns its deadline.

Layer: services/common (runtime). A socket timeout bounds each single read, not a request: a
client sending one byte every few seconds keeps it alive for ever, and a few hundred such
clients hold as many TLS connections, and as many threads, for as long as they please
(``tests/admission/test_admission_webhook_slow_clients.py`` opens them). Here each connection
carries one absolute deadline at a time — for its TLS handshake and first request, for the
wait for its next request, for that request — and when it passes, the socket is shut down
under the reading thread, which then ends with an error and frees its connection slot.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class ConnectionDeadlines:
    """Deadlines of open connections, enforced by one daemon thread (``close`` ends it)."""

    def __init__(self, name: str = "endpoint-deadlines") -> None:
        self._condition = threading.Condition()
        self._deadlines: dict[socket.socket, float] = {}
        self._closed = False
        self.expired = 0
        """Connections shut down because they overran a deadline (for logs and tests)."""
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def set(self, sock: socket.socket, seconds: float) -> None:
        """From now on ``sock`` must finish what it is doing within ``seconds``."""
        with self._condition:
            self._deadlines[sock] = time.monotonic() + seconds
            self._condition.notify()

    def clear(self, sock: socket.socket) -> None:
        """Forgets ``sock`` (its connection ended)."""
        with self._condition:
            self._deadlines.pop(sock, None)

    def __len__(self) -> int:
        with self._condition:
            return len(self._deadlines)

    def close(self) -> None:
        with self._condition:
            self._closed = True
            self._condition.notify()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        with self._condition:
            while not self._closed:
                now = time.monotonic()
                expired = [sock for sock, deadline in self._deadlines.items() if deadline <= now]
                for sock in expired:
                    del self._deadlines[sock]
                    self.expired += 1
                    # socket.socket.shutdown on the descriptor, not SSLSocket.shutdown (which
                    # tears down the TLS state a reading thread is using): the blocked read
                    # returns at once and that thread ends the connection.
                    with contextlib.suppress(OSError):
                        socket.socket.shutdown(sock, socket.SHUT_RDWR)
                wait_s = min(self._deadlines.values(), default=now + 3600.0) - now
                self._condition.wait(timeout=max(wait_s, 0.0))
