"""Which server a daemon runs on: the same admission and scheduler, thread pool against asyncio.

Layer: benchmark. ``python -m bench.server_choice`` starts one usage recorder and, reading from
it, the admission and scheduler daemons twice each: as they ship (the thread-pool server) and
on the asyncio server the recorder runs on (``services.common.server.build_aio_server``,
unary handlers on its thread pool: CheckQuota and Filter can wait on the recorder, so they may
not run on the loop). It then times CheckQuota and Filter on both, one caller and 8, in rounds
that alternate the two servers (a neighbour's burst of CPU spoils one round of both), with the
no-op server as the floor, and prints one JSON document: per figure the median over rounds
and each round's p50. docs/server-choice.md records the figures and what was decided.

The asyncio variant is the daemon's own ``start`` with its server builder swapped for the
asyncio one (``--serve-on-event-loop NAME``, the child process's entry): nothing else differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import load, procs, rpc, workload
from bench.stats import combine_rounds, ratio

DAEMONS = ("admission", "scheduler")
SERVERS = ("thread_pool", "event_loop")
NODES = 100
"""Filter candidates: the benchmark suite's smallest cluster, where the server's share of a
call is largest."""
SEQUENTIAL = load.Budget(0.6, 8, 3000, 30)
CONCURRENT = load.Budget(0.6, 16, 3000, 10)


def serve_on_event_loop(name: str, argv: Sequence[str]) -> int:
    """Runs daemon ``name`` as ``serve NAME`` does, its gRPC server the asyncio one."""
    from services.common import server

    def event_loop_service_server(common: Any, service_name: str, register: Any, *,
                                  tracer_provider: Any = None, max_workers: int = 16,
                                  serving: bool = True) -> Any:
        return server.build_aio_server(
            service_names=[service_name], register=register, listen_addr=common.listen_addr,
            tls=common.tls, tracer_provider=tracer_provider, max_workers=max_workers,
            serving=serving)

    if name == "admission":
        from services.admission import __main__ as daemon
    else:
        from services.scheduler import __main__ as daemon  # type: ignore[no-redef]
    # The one seam: the daemon's start builds its server through this module-level name.
    daemon.build_service_server = event_loop_service_server  # type: ignore[assignment]
    return daemon.main(list(argv))


def _start_on_event_loop(stack: rpc.Stack, name: str, work_dir: Path) -> procs.Child:
    address = f"127.0.0.1:{procs.free_port()}"
    env = {**procs.tracing_env(None), "HAMI_ACCOUNTING_LISTEN_ADDR": address,
           "HAMI_ACCOUNTING_METRICS_ADDR": "off", "PYTHONUNBUFFERED": "1",
           "HAMI_ACCOUNTING_USAGE_ADDR": stack.usage.address}
    child_env = {k: v for k, v in os.environ.items()
                 if not k.startswith(("HAMI_ACCOUNTING_", "OTEL_"))} | env
    log_path = work_dir / f"{name}-event-loop.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "bench.server_choice", "--serve-on-event-loop", name],
            cwd=procs.ROOT, env=child_env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT)
    child = procs.Child(f"{name}-event-loop", address, log_path, process)
    stack.children.append(child)
    return child


def measure(rounds: int, work_dir: Path) -> dict[str, Any]:
    stack = rpc.Stack("choice", work_dir)
    try:
        assert stack.admission and stack.scheduler and stack.noop
        on_loop = {name: _start_on_event_loop(stack, name, work_dir) for name in DAEMONS}
        for child in on_loop.values():
            child.wait_serving()
        stack.grow(NODES)
        names = [workload.node_name(i) for i in range(NODES)]
        targets = {
            ("admission", "thread_pool"): stack.admission.address,
            ("admission", "event_loop"): on_loop["admission"].address,
            ("scheduler", "thread_pool"): stack.scheduler.address,
            ("scheduler", "event_loop"): on_loop["scheduler"].address,
        }
        results: dict[str, list[dict[str, Any]]] = {}

        def run(figure: str, target: str, factory: Callable[[], load.ClientFactory],
                callers: int, cleanup: rpc.Tally | None = None) -> None:
            budget = SEQUENTIAL if callers == 1 else CONCURRENT
            try:
                summary = load.run(target, factory(), budget, callers=callers)
            finally:
                if cleanup is not None:
                    stack.forget(cleanup.uids)
            results.setdefault(f"{figure}_x{callers}", []).append(summary)

        for _ in range(rounds):
            for callers in (1, 8):
                run("noop", stack.noop.address, rpc.noop_caller, callers)
                for server in SERVERS:
                    run(f"check_quota_{server}", targets[("admission", server)],
                        rpc.check_quota_caller, callers)
                for server in SERVERS:
                    tally = rpc.Tally()
                    run(f"filter_{server}", targets[("scheduler", server)],
                        lambda t=tally: rpc.filter_caller(names, t), callers, tally)
        combined = {figure: combine_rounds(values) for figure, values in results.items()}
        for figure in ("check_quota", "filter"):
            for callers in (1, 8):
                pool = combined[f"{figure}_thread_pool_x{callers}"]["p50_us"]
                loop = combined[f"{figure}_event_loop_x{callers}"]["p50_us"]
                combined[f"{figure}_event_loop_vs_thread_pool_x{callers}"] = ratio(loop, pool)
        loadavg = Path("/proc/loadavg").read_text().split()[:3]
        return {"nodes": NODES, "rounds": rounds, "loadavg": loadavg, "figures": combined}
    finally:
        stack.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.server_choice", description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--serve-on-event-loop", choices=DAEMONS, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.serve_on_event_loop:
        return serve_on_event_loop(args.serve_on_event_loop, rest)
    with tempfile.TemporaryDirectory(prefix="server-choice-") as work:
        print(json.dumps(measure(args.rounds, Path(work)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
