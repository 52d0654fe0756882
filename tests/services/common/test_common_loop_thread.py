"""The asyncio server's event-loop thread (services/common/server/loop_thread.py) at its stop."""

from __future__ import annotations

import asyncio
import threading

from services.common.server import loop_thread


def test_work_handed_to_the_loop_as_it_stops_is_cancelled_not_left_pending() -> None:
    # The race behind a health update during shutdown: another thread hands the loop a
    # coroutine in the same turn as the loop's stop. Left pending, its caller would wait
    # START_TIMEOUT_S for nothing and the coroutine be dropped never awaited.
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop_thread._run_loop, args=(loop,), daemon=True)
    thread.start()
    busy = threading.Event()
    loop.call_soon_threadsafe(busy.wait)  # the loop is busy while the two below are queued
    loop.call_soon_threadsafe(loop.stop)
    ran: list[bool] = []

    async def update() -> None:
        ran.append(True)

    handed = asyncio.run_coroutine_threadsafe(update(), loop)
    busy.set()
    thread.join(timeout=10)

    assert not thread.is_alive()
    assert loop.is_closed()
    assert handed.cancelled()
    assert ran == []
