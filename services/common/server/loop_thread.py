"""An asyncio event loop on a thread of its own, and how other threads hand it work.

Layer: services (runtime). The asyncio server (``event_loop``) runs on one: its streams and its
health service live on the loop, while the daemon's own threads (its start, its readiness, its
stop) hand coroutines over with ``run`` (wait for the result) or ``hand`` (from any thread, the
loop's own included; nothing once the loop has stopped). At its stop the loop cancels what is
still pending and runs it to its end, as ``asyncio.run`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from concurrent import futures
from typing import Any, TypeVar

START_TIMEOUT_S = 30.0
"""How long work handed to the loop (building and starting the server, a health update) may
take."""

_T = TypeVar("_T")


class LoopThread:
    """A new event loop, running on a daemon thread from the moment this is made."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._stopping = False
        self._thread = threading.Thread(target=_run_loop, args=(self.loop,), name=name,
                                        daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, _T], timeout_s: float = START_TIMEOUT_S) -> _T:
        """Runs ``coroutine`` on the loop and waits for its result (from another thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=timeout_s)

    def hand(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        """Runs ``coroutine`` on the loop: from another thread waiting until it has run, from
        the loop itself as a task; once the loop is stopping, not at all."""
        if self._stopping or self.loop.is_closed():
            coroutine.close()
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            self.loop.create_task(coroutine)
            return
        try:
            done = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        except RuntimeError:  # the loop closed since the check above
            coroutine.close()
            return
        # Cancelled: the loop stopped before running it (_run_loop).
        with contextlib.suppress(futures.CancelledError):
            done.result(timeout=START_TIMEOUT_S)

    def stop(self) -> None:
        """Stops the loop and waits for its thread to end (what is pending is cancelled)."""
        self._stopping = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=START_TIMEOUT_S)


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        _cancel_pending(loop)
        loop.close()


def _cancel_pending(loop: asyncio.AbstractEventLoop) -> None:
    """Cancels what is still pending once the loop has stopped, and runs it to its end, as
    ``asyncio.run`` does: a health update from another thread that raced the stop would
    otherwise never run, its caller waiting ``START_TIMEOUT_S`` for it in vain."""
    while pending := asyncio.all_tasks(loop):
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
