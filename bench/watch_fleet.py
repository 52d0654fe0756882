"""A fleet of WatchUsage watchers in one process: the replicas of a large deployment.

Layer: benchmark. ``python -m bench.watch_fleet TARGET COUNT`` opens COUNT streams to the
recorder at TARGET, each on its own connection (as separate replicas would), half of them
watching namespaces (what an admission replica asks for) and half nodes (a scheduler replica),
all with the initial state and batches, like ``services.common.usage_watch``. The events are
decoded and counted, nothing more: the fleet stands for caches, it should cost the shared
machine as little as it can. It prints ``ready`` once every stream has delivered its
INITIAL_STATE_COMPLETE event, then a JSON line of counts whenever it reads ``report`` on
stdin, and ends on ``stop`` or end of input.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass, field

import grpc

from hami.accounting.v1 import usage_pb2, usage_pb2_grpc

STREAM_LIFETIME_S = 3600.0


@dataclass
class _Counts:
    messages: int = 0
    events: int = 0
    errors: dict[str, int] = field(default_factory=dict)


async def _watch(target: str, content: usage_pb2.WatchContent.ValueType, counts: _Counts,
                 ready: asyncio.Event) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = usage_pb2_grpc.UsageRecorderStub(channel)
        call = stub.WatchUsage(usage_pb2.WatchUsageRequest(
            send_initial_state=True, content=content, accept_batches=True),
            timeout=STREAM_LIFETIME_S)
        try:
            async for message in call:
                events = message.batch if message.batch else (message,)
                counts.messages += 1
                counts.events += len(events)
                if any(e.kind == usage_pb2.USAGE_EVENT_KIND_INITIAL_STATE_COMPLETE
                       for e in events):
                    ready.set()
        except grpc.aio.AioRpcError as error:
            name = error.code().name
            counts.errors[name] = counts.errors.get(name, 0) + 1
            ready.set()


async def _main(target: str, count: int) -> None:
    counts = _Counts()
    readies = [asyncio.Event() for _ in range(count)]
    contents = [usage_pb2.WATCH_CONTENT_NAMESPACES if i % 2 == 0 else usage_pb2.WATCH_CONTENT_NODES
                for i in range(count)]
    tasks = [asyncio.create_task(_watch(target, contents[i], counts, readies[i]))
             for i in range(count)]
    await asyncio.gather(*(ready.wait() for ready in readies))
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        command = line.strip()
        if command == "report":
            print(json.dumps({"streams": count, "messages": counts.messages,
                              "events": counts.events, "errors": counts.errors}), flush=True)
        elif command in ("stop", ""):
            break
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], int(sys.argv[2])))
