"""Fit compute per node, in process: accounting.fit against the naive deep-copy fit.

Layer: benchmark. 5,000 nodes × 8 GPUs with varied usage (bench.naive_fit's node set), the pod
with 2 init containers, 1 sidecar and 2 apps. ``fit_pod`` over all nodes is what the scheduler
runs per Filter once it holds the NodeStates; ``naive_fit_node`` per node is the literal
reading of the design (a deep copy of the node per init container). Building the NodeStates
(with their precomputed columns) is timed apart: the scheduler pays it when node usage changes.
The scheduler's own per-Filter path is timed too: ``services.scheduler.fit_kernel`` (the
vectorized fit, whose answer is checked against fit_pod's here) over the nodes' rows of a
``NodeTable``, and the copy of those rows each Filter takes first (``NodeTable.gather``).
CPU time of this process is measured (a neighbour's load does not count), per round, and the
median over rounds is reported.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from accounting import fit
from bench.naive_fit import _benchmark_nodes, _benchmark_pod, naive_fit_node
from services.scheduler import candidate_fit
from services.scheduler.convert import score_entry
from services.scheduler.node_table import NodeTable


def _cpu_us_per_node(run: Callable[[], object], nodes: int, repeat: int) -> float:
    started = time.process_time()
    for _ in range(repeat):
        run()
    return (time.process_time() - started) / repeat / nodes * 1e6


def run(node_count: int, rounds: int, fit_repeat: int, naive_nodes: int) -> dict[str, object]:
    """Per-node µs of fit_pod, fit_node, naive_fit_node, NodeState building, the vectorized
    fit and the copy of the rows it reads."""
    kernel_repeat = fit_repeat * 10
    pod = _benchmark_pod()
    nodes = _benchmark_nodes(node_count)
    checked = nodes[:: max(1, node_count // 200)]
    for node in checked:
        if fit.fit_node(pod, node) != naive_fit_node(pod, node):
            raise AssertionError(f"fit and naive fit disagree on {node.node_name}")
    naive_sample = nodes[:naive_nodes]
    raw = [(n.node_name, n.devices) for n in nodes]
    figures: dict[str, list[float]] = {"fit_pod": [], "fit_node": [], "naive_fit_node": [],
                                       "node_state_build": [], "fit_kernel": [],
                                       "columns_gather": []}
    result = fit.fit_pod(pod, nodes)
    table = NodeTable(encode_score=score_entry)
    for node in nodes:
        table.put(node)
    names = [node.node_name for node in nodes]
    columns, missing = table.gather(names)
    plan = fit.fit_plan(pod)
    if missing or plan is None or candidate_fit.fit_columns(plan, columns, ()) != result:
        raise AssertionError("the vectorized fit disagrees with fit_pod on the benchmark nodes")
    for _ in range(rounds):
        figures["fit_pod"].append(
            _cpu_us_per_node(lambda: fit.fit_pod(pod, nodes), node_count, fit_repeat))
        figures["fit_node"].append(
            _cpu_us_per_node(lambda: [fit.fit_node(pod, n) for n in nodes], node_count, 1))
        figures["naive_fit_node"].append(
            _cpu_us_per_node(lambda: [naive_fit_node(pod, n) for n in naive_sample],
                             len(naive_sample), 1))
        figures["node_state_build"].append(
            _cpu_us_per_node(lambda: [fit.NodeState(name, devices) for name, devices in raw],
                             node_count, 1))
        figures["fit_kernel"].append(_cpu_us_per_node(
            lambda: candidate_fit.fit_columns(plan, columns, ()), node_count, kernel_repeat))
        figures["columns_gather"].append(
            _cpu_us_per_node(lambda: table.gather(names), node_count, kernel_repeat))
    medians = {name: round(statistics.median(values), 2) for name, values in figures.items()}
    return {
        "nodes": node_count,
        "gpus_per_node": len(nodes[0].devices),
        "naive_nodes_timed": len(naive_sample),
        "rounds": rounds,
        "us_per_node": medians,
        "round_us_per_node": {name: [round(v, 2) for v in values]
                              for name, values in figures.items()},
        "fit_pod_ms": round(medians["fit_pod"] * node_count / 1e3, 1),
        "fit_kernel_ms": round(medians["fit_kernel"] * node_count / 1e3, 2),
        "speedup_vs_naive": round(medians["naive_fit_node"] / medians["fit_pod"], 1),
        "nodes_fitting": len(result.scores),
        "chosen": result.node_name,
        "answers_checked": len(checked),
    }
