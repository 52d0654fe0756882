"""Filter on a cluster that looks like a real one: cards of three sizes, most nodes carrying a
few pods, several namespaces with quotas, pods of several shapes.

Layer: benchmark. bench/scheduler_scale.py measures Filter on identical, empty nodes, the
kindest case for the scheduler: alike nodes get one verdict, so the per-node work of distinct
nodes is hidden. Here, with the same stack (one recorder, journal on, one scheduler daemon with
its WatchUsage node cache, the no-op server):

* node ``i`` has 8 cards of one model, by ``i % 3``: NVIDIA A10 (24 GiB), A100 40 GB, H100
  80 GB; cards 0–3 on NUMA node 0, 4–7 on NUMA node 1;
* about 60 % of the nodes carry 1–4 pods already, each one container with one card: a share of
  2–16 GiB and 0–30 % of the cores, on a card drawn at random, in one of five namespaces
  (``team-0`` … ``team-4``), so that nearly every node's device state differs from every
  other's (``distinct_states`` counts them);
* every namespace, the Filter's too, has a GPU-memory quota (large enough that none refuses,
  so each Filter reads and compares it);
* the Filter rotates through four pod shapes (the benchmark's pod of 2 init containers, a
  sidecar and 2 apps; one app with one 8 GiB share; one app with two 20 GiB cards; an init
  container with an app), each a fresh uid, every node a candidate, in the namespaces in turn.

Rounds of [no-op RPC, Filter with one caller] back to back at each node count, as
scheduler_scale's; the pods each figure placed are forgotten after it, untimed, so the
background stays as built. The figures are Filter p50 against the no-op's in the same rounds.
Everything random is drawn from a seeded generator: the cluster is the same on every run.

``python -m bench.realistic_cluster`` runs this alone (``--profile SECONDS`` adds py-spy's
profile of the scheduler at the largest node count); ``make bench`` runs it after
bench/scheduler_scale.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from accounting.model import (
    Container,
    ContainerClass,
    Device,
    DeviceGrant,
    DeviceRequest,
    Pod,
    PodPhase,
)
from bench import load, profiling, rpc, workload
from bench.stats import combine_rounds, ratio
from hami.accounting.v1 import scheduler_pb2, types_pb2, usage_pb2
from services.common.convert import device_to_pb, pod_to_pb

NODE_STEPS = (1000, 5000)
SEED = 20261201
CARD_MODELS = (
    ("NVIDIA A10", 24576),
    ("NVIDIA A100-SXM4-40GB", 40960),
    ("NVIDIA H100 80GB HBM3", 81920),
)
BUSY_SHARE = 0.6
"""Of the nodes, how many carry pods before the Filters."""
NAMESPACES = tuple(f"team-{k}" for k in range(5))
QUOTA_MEMORY_MIB = 10**9
"""Large enough that no Filter is refused for quota, finite so that every Filter compares."""
VS_NOOP_LIMIT = {1000: 4.0, 5000: 6.0}
P50_LIMIT_MS = {1000: 3.0, 5000: 10.0}
ROUND_BUDGET = load.Budget(1.5, 8, 3000, 5)

Log = Callable[[str], None]


def node_name(index: int) -> str:
    return f"real-{index:05d}"


def node_devices(index: int) -> tuple[Device, ...]:
    model, memory_mib = CARD_MODELS[index % len(CARD_MODELS)]
    name = node_name(index)
    return tuple(
        Device(f"GPU-{name}-{i}", model, i, 10, memory_mib, 100, numa=i // 4) for i in range(8)
    )


def background_pods(index: int, rng: random.Random) -> list[Pod]:
    """The pods node ``index`` carries before the Filters (none for about 40 % of nodes)."""
    if rng.random() >= BUSY_SHARE:
        return []
    devices = node_devices(index)
    pods = []
    for k in range(rng.randint(1, 4)):
        card = rng.choice(devices)
        memory_mib = min(rng.choice((2048, 4096, 8192, 10240, 16384)),
                         card.memory_total_mib // 2)
        cores = rng.choice((0, 10, 20, 30))
        grant = DeviceGrant(card.uuid, "NVIDIA", memory_mib, cores)
        request = DeviceRequest("NVIDIA", 1, memory_mib, 0, cores)
        namespace = rng.choice(NAMESPACES)
        pods.append(Pod(
            f"bg-{index:05d}-{k}", namespace, f"bg-{index:05d}-{k}",
            (Container("main", ContainerClass.APP, (request,), (grant,)),),
            phase=PodPhase.RUNNING, node_name=node_name(index),
        ))
    return pods


def _gpu(count: int, memory_mib: int, cores: int) -> tuple[DeviceRequest, ...]:
    return (DeviceRequest("NVIDIA", count, memory_mib, 0, cores),)


def pod_shapes() -> tuple[Pod, ...]:
    """The Filter's pods, uid and namespace filled in per call."""
    return (
        workload.pod(rpc.UID_PLACEHOLDER),
        Pod(rpc.UID_PLACEHOLDER, "", "small",
            (Container("app", ContainerClass.APP, _gpu(1, 8192, 20)),)),
        Pod(rpc.UID_PLACEHOLDER, "", "two-cards",
            (Container("train", ContainerClass.APP, _gpu(2, 20480, 50)),)),
        Pod(rpc.UID_PLACEHOLDER, "", "init-then-app",
            (Container("prepare", ContainerClass.INIT, _gpu(1, 16384, 30)),
             Container("serve", ContainerClass.APP, _gpu(1, 12288, 40)))),
    )


def _filter_templates(node_names: Sequence[str]) -> list[bytes]:
    """One FilterRequest per (shape, namespace) pair, with the placeholder uid."""
    names = scheduler_pb2.FilterRequest(node_names=node_names).SerializeToString()
    templates = []
    for index, shape in enumerate(pod_shapes()):
        namespace = NAMESPACES[index % len(NAMESPACES)]
        pod = dataclasses.replace(shape, namespace=namespace, name=f"{shape.name}-{index}")
        templates.append(
            scheduler_pb2.FilterRequest(pod=pod_to_pb(pod)).SerializeToString() + names)
    return templates


def filter_caller(node_names: Sequence[str], tally: rpc.Tally) -> load.ClientFactory:
    """Filter over ``node_names``, the pod shapes in turn, a fresh uid per call."""
    run = next(rpc._RUN_IDS)
    templates = _filter_templates(node_names)

    def factory(channel: grpc.Channel, _k: int) -> load.Call:
        method = channel.unary_unary(rpc.FILTER_METHOD, request_serializer=None,
                                     response_deserializer=scheduler_pb2.FilterResponse.FromString)

        def call(i: int) -> None:
            uid = rpc.fixed_uid("real", run, i)
            template = templates[i % len(templates)]
            response = method(template.replace(rpc.UID_PLACEHOLDER.encode(), uid.encode()),
                              timeout=rpc.RPC_TIMEOUT_S)
            tally.add(uid, response.reason)
        return call
    return factory


class _Cluster:
    """Registers the nodes and records their pods through the recorder's gRPC."""

    def __init__(self, stack: rpc.Stack) -> None:
        self._stack = stack
        self._rng = random.Random(SEED)
        self.node_count = 0
        self.pods = 0
        self.distinct: set[tuple[Any, ...]] = set()

    def quotas(self) -> None:
        for namespace in (*NAMESPACES, workload.NAMESPACE):
            self._stack.usage_stub.SetQuota(usage_pb2.SetQuotaRequest(
                namespace=namespace, limits={"limits.nvidia.com/gpumem": QUOTA_MEMORY_MIB}),
                timeout=rpc.RPC_TIMEOUT_S)

    def grow(self, node_count: int) -> None:
        indices = range(self.node_count, node_count)
        pods_by_node = [background_pods(i, self._rng) for i in indices]
        stub = self._stack.usage_stub

        def register(index: int) -> None:
            inventory = types_pb2.NodeInventory(
                devices=[device_to_pb(d) for d in node_devices(index)])
            stub.RegisterNode(usage_pb2.RegisterNodeRequest(
                node_name=node_name(index), inventory=inventory), timeout=rpc.RPC_TIMEOUT_S)

        def record(pod: Pod) -> None:
            stub.RecordPod(usage_pb2.RecordPodRequest(pod=pod_to_pb(pod)),
                           timeout=rpc.RPC_TIMEOUT_S)

        with futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(register, indices))
            list(pool.map(record, [p for pods in pods_by_node for p in pods]))
        for index, pods in zip(indices, pods_by_node, strict=True):
            self.pods += len(pods)
            used = sorted((p.containers[0].grants[0].uuid.rsplit("-", 1)[1],
                           p.containers[0].grants[0].memory_mib,
                           p.containers[0].grants[0].core_percent) for p in pods)
            self.distinct.add((index % len(CARD_MODELS), tuple(used)))
        self.node_count = node_count


def _rounds(stack: rpc.Stack, names: Sequence[str], rounds: int, budget: load.Budget,
            log: Log) -> dict[str, Any]:
    assert stack.noop is not None and stack.scheduler is not None
    noop_rounds: list[dict[str, Any]] = []
    filter_rounds: list[dict[str, Any]] = []
    outcomes: dict[str, int] = {}
    for round_index in range(rounds):
        log(f"realistic cluster: {len(names)} nodes, round {round_index + 1}/{rounds}")
        noop_rounds.append(load.run(stack.noop.address, rpc.noop_caller(), budget))
        tally = rpc.Tally()
        try:
            filter_rounds.append(load.run(stack.scheduler.address,
                                          filter_caller(names, tally), budget))
        finally:
            stack.forget(tally.uids)
        for reason, count in tally.reasons.items():
            outcomes[reason] = outcomes.get(reason, 0) + count
    figure = combine_rounds(filter_rounds)
    figure["errors"] = sum(int(r.get("errors", 0)) for r in filter_rounds)
    figure["outcomes"] = outcomes
    figure["round_vs_noop"] = [ratio(f["p50_us"], n["p50_us"])
                               for f, n in zip(filter_rounds, noop_rounds, strict=True)]
    figure["vs_noop"] = round(statistics.median(figure["round_vs_noop"]), 2)
    return {"noop": combine_rounds(noop_rounds), "filter": figure}


def run(work_dir: Path, rounds: int, budget: load.Budget = ROUND_BUDGET, *,
        node_steps: Sequence[int] = NODE_STEPS, profile_seconds: float = 0.0,
        log: Log = print) -> dict[str, Any]:
    """Every figure of the module docstring; with ``profile_seconds``, py-spy samples the
    scheduler while Filters run one at a time at the largest node count."""
    log(f"realistic cluster: up to {node_steps[-1]} nodes of {len(CARD_MODELS)} card models")
    stack = rpc.Stack("realistic", work_dir, admission=False)
    cluster = _Cluster(stack)
    result: dict[str, Any] = {"rounds": rounds, "steps": {}}
    try:
        cluster.quotas()
        for nodes in node_steps:
            log(f"realistic cluster: building nodes up to {nodes}")
            cluster.grow(nodes)
            names = [node_name(i) for i in range(nodes)]
            time.sleep(1.0)  # the scheduler's cache takes the registrations' events
            step = _rounds(stack, names, rounds, budget, log)
            step["background_pods"] = cluster.pods
            step["distinct_states"] = len(cluster.distinct)
            result["steps"][str(nodes)] = step
        if profile_seconds:
            log(f"realistic cluster: profiling Filter at {node_steps[-1]} nodes")
            result["profile"] = _profile(stack, names, profile_seconds, work_dir)
    finally:
        stack.stop()
    return result


def _profile(stack: rpc.Stack, names: Sequence[str], seconds: float,
             work_dir: Path) -> dict[str, Any]:
    assert stack.scheduler is not None
    out = work_dir / "profile-realistic-cluster.raw"
    recording = profiling.record_pid(stack.scheduler.pid, seconds, out)
    deadline = time.monotonic() + seconds + 0.5
    while time.monotonic() < deadline:
        tally = rpc.Tally()
        try:
            load.run(stack.scheduler.address, filter_caller(names, tally), ROUND_BUDGET)
        finally:
            stack.forget(tally.uids)
    return profiling.finish(recording, out)


def goal_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 32's Filter goals on this cluster, at the first and last node counts."""
    steps = [(int(nodes), step) for nodes, step in result["steps"].items()]
    rows: list[dict[str, Any]] = []
    for (nodes, step), size in zip((steps[0], steps[-1]) if len(steps) > 1 else steps,
                                   (1000, 5000), strict=False):
        figure, noop = step["filter"], step["noop"]
        detail = (f"{step['background_pods']} pods already on the nodes, "
                  f"{step['distinct_states']} distinct node states of {nodes}; no-op p50 "
                  f"{noop['p50_us']:.0f} µs in the same rounds; round ratios "
                  f"{figure['round_vs_noop']}; Filter p50 {figure['p50_us'] / 1000:.2f} ms, p99 "
                  f"{figure['p99_us'] / 1000:.2f} ms; outcomes {figure['outcomes']}")
        rows.append(_row(f"realistic_filter_vs_noop_{'small' if size == 1000 else 'large'}",
                         f"realistic cluster: Filter p50 ≤ {VS_NOOP_LIMIT[size]:g} × no-op at "
                         f"{nodes:,} nodes", figure["vs_noop"], VS_NOOP_LIMIT[size], "×", detail))
        rows.append(_row(f"realistic_filter_p50_{'small' if size == 1000 else 'large'}_ms",
                         f"realistic cluster: Filter p50 ≤ {P50_LIMIT_MS[size]:g} ms at "
                         f"{nodes:,} nodes (quiet machine)",
                         round(figure["p50_us"] / 1000, 2), P50_LIMIT_MS[size], "ms", detail))
    return rows


def _row(key: str, text: str, value: float, limit: float, unit: str,
         detail: str) -> dict[str, Any]:
    return {"key": key, "goal": text, "value": value, "limit": limit, "unit": unit,
            "at_least": False, "pass": value <= limit, "detail": detail}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.realistic_cluster",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=ROUND_BUDGET.seconds,
                        help="per figure per round")
    parser.add_argument("--nodes", type=int, nargs="+", default=list(NODE_STEPS))
    parser.add_argument("--profile", type=float, default=0.0, metavar="SECONDS",
                        help="py-spy the scheduler at the largest node count")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    work_dir = Path(tempfile.mkdtemp(prefix="hami-bench-realistic-"))
    try:
        budget = load.Budget(args.seconds, ROUND_BUDGET.min_calls, ROUND_BUDGET.max_calls,
                             ROUND_BUDGET.warmup_calls)
        result = run(work_dir, args.rounds, budget, node_steps=args.nodes,
                     profile_seconds=args.profile)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    for goal in goal_rows(result):
        print(f"{'pass' if goal['pass'] else 'MISS':8} {goal['goal']}: {goal['value']} "
              f"{goal['unit']} — {goal['detail']}")
    if "profile" in result:
        print(json.dumps(result["profile"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
