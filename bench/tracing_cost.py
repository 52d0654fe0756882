"""What tracing adds to CheckQuota, alone: ``python -m bench.tracing_cost``.

Layer: benchmark. The part of ``make bench`` behind the goal "tracing adds ≤ 15 % to CheckQuota
p50 at full sampling", on its own: a stack with tracing off and one with every span sampled and
exported over OTLP to a receiver in this process, both with the daemons' defaults (the admission
daemon answers from its WatchUsage cache); in rounds, CheckQuota off then traced, and the no-op
RPC off then traced. The pod carries no traceparent and the caller sends no trace context, as
HAMi's webhook does: the CheckQuota server span is then the pod's root span.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench import load, rpc
from bench.otlp_sink import OtlpSink
from bench.stats import combine_rounds, ratio

FIGURES = ("check_quota", "check_quota_traced", "noop", "noop_traced")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing_cost",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.6, help="per figure per round")
    args = parser.parse_args(argv)
    work_dir = Path(tempfile.mkdtemp(prefix="hami-bench-tracing-"))
    sink = OtlpSink()
    off = rpc.Stack("off", work_dir, scheduler=False)
    on = rpc.Stack("on", work_dir, sink.endpoint, scheduler=False)
    budget = load.Budget(args.seconds, 8, 3000, 30)
    try:
        assert off.admission and on.admission and off.noop and on.noop
        targets = {"check_quota": (off.admission.address, rpc.check_quota_caller()),
                   "check_quota_traced": (on.admission.address, rpc.check_quota_caller()),
                   "noop": (off.noop.address, rpc.noop_caller()),
                   "noop_traced": (on.noop.address, rpc.noop_caller())}
        rounds: dict[str, list[dict[str, float]]] = {name: [] for name in FIGURES}
        for round_index in range(args.rounds):
            print(f"round {round_index + 1}/{args.rounds}", flush=True)
            for name in FIGURES:
                target, factory = targets[name]
                rounds[name].append(load.run(target, factory, budget))
        time.sleep(6)  # one BatchSpanProcessor delay: the spans reach the receiver
        spans = sink.snapshot()
    finally:
        for stack in (on, off):
            stack.stop()
        sink.stop()
    figures = {name: combine_rounds(results) for name, results in rounds.items()}
    for name in FIGURES:
        print(f"{name:20s} p50 {figures[name]['p50_us']:8.1f} µs  rounds "
              f"{figures[name]['round_p50_us']}")
    overhead = [ratio(a, b) - 1 for a, b in zip(figures["check_quota_traced"]["round_p50_us"],
                                                figures["check_quota"]["round_p50_us"],
                                                strict=True)]
    print(f"tracing adds {statistics.median(overhead) * 100:+.1f} % to CheckQuota p50 "
          f"(rounds {', '.join(f'{o * 100:+.1f}' for o in overhead)} %); spans exported: {spans}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
