"""SIGTERM and SIGINT as a daemon's graceful stop.

Layer: services (runtime). ``StopSignals`` remembers the signals from before the daemon
starts; ``run_until_signalled`` serves until one arrives (or the server is stopped elsewhere),
then stops the server gracefully and runs the daemon's own stop.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType

from services.common.server.handle import DEFAULT_GRACE_S, ServerHandle

_LOG = logging.getLogger(__name__)


class StopSignals:
    """SIGTERM and SIGINT, remembered from the moment this is made until ``restore``.

    A daemon makes it before it starts: its health can say SERVING (the gRPC server is up)
    while the rest of its start still runs, and a SIGTERM then would otherwise find the default
    action and kill it uncleanly; remembered, it stops the daemon gracefully once started.
    Must be made in the main thread.
    """

    WATCHED = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received = threading.Event()
        self._previous = {signum: signal.signal(signum, self._on_signal) for signum in self.WATCHED}

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        _LOG.info("stopping on %s", signal.Signals(signum).name)
        self.received.set()

    def restore(self) -> None:
        """Puts back the handlers that were there before."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def run_until_signalled(
    handle: ServerHandle,
    on_stop: Callable[[], None] | None = None,
    grace_s: float = DEFAULT_GRACE_S,
    signals: StopSignals | None = None,
) -> None:
    """Serves until SIGTERM or SIGINT (or until the server is stopped elsewhere), then stops.

    Stopping reports NOT_SERVING, drains in-flight calls for up to ``grace_s``, then calls
    ``on_stop`` (flush the tracer provider, close the journal). Must run in the main thread.
    ``signals``: the ones the caller made before starting the server (a signal received since
    then stops it at once); restored at the end either way.
    """
    signals = signals or StopSignals()
    try:
        # A bounded wait, so a server stopped by another thread also ends the loop.
        while not signals.received.wait(0.5) and not handle.stopped:
            pass
        handle.stop(grace_s)
        if on_stop is not None:
            on_stop()
    finally:
        signals.restore()
