"""Recorder scale: 100,000 tracked pods recorded, journaled, and recovered by a fresh recorder.

Layer: benchmark. The journal is built through ``UsageStore.record_pod`` in this process (the
same path the gRPC servicer and the Kubernetes source take: ledger, journal commit, gauges), which
also gives the in-process RecordPod throughput. Then real recorder daemons start on it, each in
its own process: the recovery time is the one the recorder logs (``recovery_s``: journal load +
ledger restore), and resident memory is VmRSS once SERVING. Bytes per tracked pod are the RSS
difference to a recorder with the same node inventories but no pod, over the pod count; the
difference to an empty recorder (no nodes either) is reported beside it.

The pods are the benchmark pod (3 GPUs, 2 init containers, 1 sidecar, 2 apps), 8 per node on
12,500 nodes × 8 GPUs, the GPUs rotated so that every card carries 3 pods and none is
overcommitted; each pod's stored usage is therefore distinct (its own UUIDs).
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import statistics
import time
from pathlib import Path

from accounting.ledger import Ledger
from accounting.model import DeviceGrant, Pod
from bench import procs, workload
from services.usage.journal import Journal
from services.usage.store import UsageStore

PODS_PER_NODE = 8
ROTATION = 3
"""GPU offset between a node's pods; 3 is coprime with 8, so every card gets each role once."""


def rotated_pod(template: Pod, uid: str, node: str, slot: int) -> Pod:
    shift = slot * ROTATION

    def moved(grant: DeviceGrant) -> DeviceGrant:
        index = int(grant.uuid.rsplit("-", 1)[1])
        uuid = f"GPU-{node}-{(index + shift) % workload.GPUS_PER_NODE}"
        return dataclasses.replace(grant, uuid=uuid)

    containers = tuple(
        dataclasses.replace(c, grants=tuple(moved(g) for g in c.grants))
        for c in template.containers
    )
    return dataclasses.replace(template, uid=uid, name=f"pod-{uid}", node_name=node,
                               containers=containers)


def template_pod() -> Pod:
    """The benchmark pod with its grants on placeholder UUIDs that ``rotated_pod`` moves."""
    template = workload.granted_pod("template", "template-node")
    return dataclasses.replace(
        template,
        containers=tuple(
            dataclasses.replace(c, grants=tuple(
                dataclasses.replace(g, uuid=f"GPU-x-{g.uuid.rsplit('-', 1)[1]}")
                for g in c.grants))
            for c in template.containers))


def build_journal(data_dir: Path, pods: int, *, with_pods: bool = True) -> dict[str, float]:
    """Registers the nodes and records ``pods`` pods through the store; returns throughput."""
    shutil.rmtree(data_dir, ignore_errors=True)
    nodes = -(-pods // PODS_PER_NODE)
    journal = Journal.in_data_dir(data_dir)
    store = UsageStore(Ledger(), journal)
    # The store logs every overcommit; none is expected, and none should cost a log line here.
    previous_level = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)
    overcommitted = 0
    try:
        for n in range(nodes):
            name = workload.node_name(n)
            store.register_node(name, workload.node_devices(name))
        template = template_pod()
        started = time.perf_counter()
        count = pods if with_pods else 0
        for i in range(count):
            node = workload.node_name(i // PODS_PER_NODE)
            outcome = store.record_pod(
                rotated_pod(template, f"scale-{i:06d}", node, i % PODS_PER_NODE))
            overcommitted += bool(outcome.overcommitted)
        elapsed = time.perf_counter() - started
    finally:
        logging.getLogger().setLevel(previous_level)
        journal.close()
    return {
        "pods": count,
        "nodes": nodes,
        "seconds": round(elapsed, 2),
        "records_per_s": round(count / elapsed, 1) if count else 0.0,
        "us_per_record": round(elapsed / count * 1e6, 1) if count else 0.0,
        "overcommitted": overcommitted,
        "journal_mib": round(sum(f.stat().st_size for f in data_dir.iterdir()) / 2**20, 1),
    }


def _recover(data_dir: Path, work_dir: Path, label: str) -> dict[str, float]:
    """Starts a recorder on ``data_dir``; its logged recovery, time to SERVING and RSS."""
    child = procs.start("usage", work_dir, label=label,
                        env={"HAMI_ACCOUNTING_DATA_DIR": str(data_dir),
                             **procs.tracing_env(None)})
    try:
        serving_s = child.wait_serving(timeout_s=120)
        cpu_s = child.cpu_s()
        time.sleep(0.3)  # let the server's threads settle before reading RSS
        rss_kib = child.rss_kib()
    finally:
        child.stop()
    recovered = next((r for r in child.log_records() if "recovery_s" in r), None)
    if recovered is None:
        raise RuntimeError(f"{label}: no recovery line in its log:\n{child.log_tail()}")
    return {"recovery_s": float(recovered["recovery_s"]), "pods": int(recovered.get("pods", 0)),
            "serving_s": round(serving_s, 3), "cpu_s": round(cpu_s, 2), "rss_kib": rss_kib}


def run(work_dir: Path, pods: int, recoveries: int) -> dict[str, object]:
    full_dir, nodes_dir, empty_dir = (work_dir / "scale-full", work_dir / "scale-nodes",
                                      work_dir / "scale-empty")
    built = build_journal(full_dir, pods)
    build_journal(nodes_dir, pods, with_pods=False)
    shutil.rmtree(empty_dir, ignore_errors=True)
    empty_dir.mkdir(parents=True)
    runs: dict[str, list[dict[str, float]]] = {"full": [], "nodes": [], "empty": []}
    # Interleaved, so a noisy moment touches every kind of start alike.
    for r in range(recoveries):
        for kind, directory in (("empty", empty_dir), ("nodes", nodes_dir), ("full", full_dir)):
            runs[kind].append(_recover(directory, work_dir, f"recover-{kind}-{r}"))
    if runs["full"][0]["pods"] != pods:
        raise RuntimeError(f"recovered {runs['full'][0]['pods']} pods, expected {pods}")

    def median(kind: str, key: str) -> float:
        return float(statistics.median(run[key] for run in runs[kind]))

    rss_full, rss_nodes, rss_empty = (median(k, "rss_kib") for k in ("full", "nodes", "empty"))
    return {
        "pods": pods,
        "nodes": built["nodes"],
        "build": built,
        "recovery_s": round(median("full", "recovery_s"), 3),
        "round_recovery_s": [r["recovery_s"] for r in runs["full"]],
        "serving_s": round(median("full", "serving_s"), 3),
        "nodes_only_recovery_s": round(median("nodes", "recovery_s"), 3),
        # CPU to SERVING beyond the nodes-only recorder's: the pods' share, whatever the load.
        "recovery_cpu_s": round(median("full", "cpu_s") - median("nodes", "cpu_s"), 2),
        "cpu_s": {k: median(k, "cpu_s") for k in runs},
        "rss_kib": {"full": rss_full, "nodes_only": rss_nodes, "empty": rss_empty},
        "bytes_per_pod": round((rss_full - rss_nodes) * 1024 / pods, 1),
        "bytes_per_pod_vs_empty": round((rss_full - rss_empty) * 1024 / pods, 1),
    }
