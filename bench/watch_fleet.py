"""A fleet of WatchUsage watchers in one process: the replicas of a large deployment.

Layer: benchmark. A fleet opens COUNT streams to one recorder, each on its own connection (as
separate replicas would), half of them watching namespaces (what an admission replica asks
for) and half nodes (a scheduler replica), all with the initial state, the policy and batches,
as ``services.common.usage_watch`` asks. It stands for caches that run on other machines, so it
should cost the benchmark's shared machine as little as it can: a small Go program (built with
the interop client's toolchain, like ``bench.go_client``) that counts messages and events by
scanning the wire format, without decoding; where Go is missing, a Python asyncio fleet does
the same (about ten times the CPU per message, noted in the results).

Either prints ``ready`` once every stream has delivered its INITIAL_STATE_COMPLETE event, then a
JSON line of counts whenever it reads ``report`` on stdin, and ends on ``stop`` or end of input.
``python -m bench.watch_fleet TARGET COUNT`` runs the Python fleet.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench.go_client import GoUnavailable, build
from bench.procs import ROOT
from hami.accounting.v1 import usage_pb2, usage_pb2_grpc

STREAM_LIFETIME_S = 3600.0
READY_TIMEOUT_S = 120.0
CONTENTS = (usage_pb2.WATCH_CONTENT_NAMESPACES, usage_pb2.WATCH_CONTENT_NODES)


def request(content: usage_pb2.WatchContent.ValueType) -> usage_pb2.WatchUsageRequest:
    return usage_pb2.WatchUsageRequest(send_initial_state=True, content=content,
                                       send_policy=True, accept_batches=True)


_GO_SOURCE = r"""
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io/ioutil"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
)

type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	p := v.(*[]byte)
	*p = append((*p)[:0], data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

const batchField = 9 // UsageEvent.batch
const kindField = 2  // UsageEvent.kind
const completeKind = 7

func varint(b []byte) (uint64, int) {
	var v uint64
	for i := 0; i < len(b) && i < 10; i++ {
		v |= uint64(b[i]&0x7f) << (7 * uint(i))
		if b[i] < 0x80 {
			return v, i + 1
		}
	}
	return 0, 0
}

// scan walks one UsageEvent: its kind, and its batch elements (each an event).
func scan(b []byte) (events int, complete bool) {
	batched := 0
	for len(b) > 0 {
		key, n := varint(b)
		if n == 0 {
			return 1, false
		}
		b = b[n:]
		switch key & 7 {
		case 0:
			v, m := varint(b)
			if key>>3 == kindField && v == completeKind {
				complete = true
			}
			b = b[m:]
		case 1:
			b = b[8:]
		case 5:
			b = b[4:]
		case 2:
			l, m := varint(b)
			b = b[m:]
			if key>>3 == batchField {
				e, c := scan(b[:l])
				batched += e
				complete = complete || c
			}
			b = b[l:]
		default:
			return 1, complete
		}
	}
	if batched > 0 {
		return batched, complete
	}
	return 1, complete
}

func main() {
	addr := flag.String("addr", "", "host:port")
	count := flag.Int("count", 64, "streams")
	requests := flag.String("requests", "", "comma-separated files, one request per kind")
	flag.Parse()
	bodies := [][]byte{}
	for _, name := range strings.Split(*requests, ",") {
		data, err := ioutil.ReadFile(name)
		if err != nil {
			panic(err)
		}
		bodies = append(bodies, data)
	}
	var messages, events int64
	var mu sync.Mutex
	errors := map[string]int{}
	var ready sync.WaitGroup
	ready.Add(*count)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	for k := 0; k < *count; k++ {
		conn, err := grpc.Dial(*addr, grpc.WithInsecure(), grpc.WithBlock())
		if err != nil {
			panic(err)
		}
		defer conn.Close()
		go func(conn *grpc.ClientConn, body []byte) {
			once := sync.Once{}
			defer once.Do(ready.Done)
			stream, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true},
				"/hami.accounting.v1.UsageRecorder/WatchUsage", grpc.ForceCodec(rawCodec{}))
			if err == nil {
				err = stream.SendMsg(&body)
			}
			if err == nil {
				err = stream.CloseSend()
			}
			for err == nil {
				reply := []byte{}
				if err = stream.RecvMsg(&reply); err != nil {
					break
				}
				n, complete := scan(reply)
				atomic.AddInt64(&messages, 1)
				atomic.AddInt64(&events, int64(n))
				if complete {
					once.Do(ready.Done)
				}
			}
			if ctx.Err() == nil {
				mu.Lock()
				errors[fmt.Sprint(err)]++
				mu.Unlock()
			}
		}(conn, bodies[k%len(bodies)])
	}
	ready.Wait()
	fmt.Println("ready")
	input := bufio.NewScanner(os.Stdin)
	for input.Scan() {
		switch strings.TrimSpace(input.Text()) {
		case "report":
			mu.Lock()
			json.NewEncoder(os.Stdout).Encode(map[string]interface{}{
				"streams": *count, "messages": atomic.LoadInt64(&messages),
				"events": atomic.LoadInt64(&events), "errors": errors,
			})
			mu.Unlock()
		case "stop":
			return
		}
	}
}
"""


class Fleet:
    """A running fleet process (Go when it builds, else Python); ``stop`` ends it."""

    def __init__(self, target: str, count: int, work_dir: Path, *, go: bool = True) -> None:
        self.count = count
        try:
            if not go:
                raise GoUnavailable("not asked for")
            binary = build(work_dir, "hamifleet", _GO_SOURCE)
            files = []
            for content in CONTENTS:
                path = work_dir / f"watch-request-{content}.bin"
                path.write_bytes(request(content).SerializeToString())
                files.append(str(path))
            command = [str(binary), "-addr", target, "-count", str(count),
                       "-requests", ",".join(files)]
            self.kind = "go"
        except GoUnavailable as missing:
            command = [sys.executable, "-m", "bench.watch_fleet", target, str(count)]
            self.kind = f"python ({missing})"
        self.process = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        started = time.monotonic()
        line = self.process.stdout.readline().strip()
        if line != "ready" or time.monotonic() - started > READY_TIMEOUT_S:
            self.stop()
            raise RuntimeError(f"the watcher fleet did not get ready: {line!r}")

    @property
    def pid(self) -> int:
        return self.process.pid

    def report(self) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("report\n")
        self.process.stdin.flush()
        return dict(json.loads(self.process.stdout.readline()))

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                assert self.process.stdin is not None
                self.process.stdin.write("stop\n")
                self.process.stdin.flush()
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()


# -- the Python fleet --------------------------------------------------------------------------


@dataclass
class _Counts:
    messages: int = 0
    events: int = 0
    errors: dict[str, int] = field(default_factory=dict)


async def _watch(target: str, content: usage_pb2.WatchContent.ValueType, counts: _Counts,
                 ready: asyncio.Event) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = usage_pb2_grpc.UsageRecorderStub(channel)
        call = stub.WatchUsage(request(content), timeout=STREAM_LIFETIME_S)
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
    tasks = [asyncio.create_task(_watch(target, CONTENTS[i % 2], counts, readies[i]))
             for i in range(count)]
    await asyncio.gather(*(ready.wait() for ready in readies))
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        command = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
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
