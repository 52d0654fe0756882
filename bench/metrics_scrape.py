"""The cost of a scrape of the recorder's /metrics at scale: 5,000 nodes × 8 GPUs, 40,000 pods.

Layer: benchmark. The store is filled through ``UsageStore.record_pod`` (the recorder_scale pod:
3 GPUs, 2 init containers, 1 sidecar, 2 apps; 8 per node, every card carrying 3 pods), without
a journal. Then, in rounds:

* **lock**: how long ``UsageStore.reading`` holds the store's lock (every write waits that long);
* **cold**: a scrape by a fresh ``RecorderScrape`` (every line written);
* **steady**: a scrape with nothing changed since the last one;
* **churn**: a scrape after 1 % of the pods changed (their init containers finished: shrunk);
* **gzip**: compressing the text as /metrics does when Prometheus asks for gzip;
* **http**: a whole scrape over HTTP from a real metrics endpoint (the store unchanged);
* **baseline** (with ``--baseline``): the same series through prometheus_client's own
  exposition (``generate_latest`` of a collector yielding them), what writing them as ordinary
  prometheus_client families would cost on every scrape.

Usage: python -m bench.metrics_scrape [--nodes N] [--rounds R]
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import logging
import statistics
import time
import urllib.request
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from accounting.ledger import Ledger
from accounting.model import ContainerClass, ContainerState, ContainerStatus, Pod, PodPhase
from bench import workload
from bench.recorder_scale import PODS_PER_NODE, rotated_pod, template_pod
from services.common import metrics
from services.usage.scrape import RecorderScrape
from services.usage.store import UsageStore


def build_store(nodes: int) -> tuple[UsageStore, list[Pod]]:
    """A store with ``nodes`` nodes and 8 pods per node, their init containers running."""
    store = UsageStore(Ledger(), None)
    previous_level = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)
    try:
        for n in range(nodes):
            name = workload.node_name(n)
            store.register_node(name, workload.node_devices(name))
        template = template_pod()
        pods = []
        for i in range(nodes * PODS_PER_NODE):
            node = workload.node_name(i // PODS_PER_NODE)
            pod = rotated_pod(template, f"scrape-{i:06d}", node, i % PODS_PER_NODE)
            store.record_pod(pod)
            pods.append(pod)
    finally:
        logging.getLogger().setLevel(previous_level)
    return store, pods


def finished(pod: Pod) -> Pod:
    """The pod once every regular init container exited 0 (the shrink)."""
    statuses = tuple(
        ContainerStatus(c.name, ContainerState.TERMINATED, 0)
        if c.container_class is ContainerClass.INIT
        else ContainerStatus(c.name, ContainerState.RUNNING)
        for c in pod.containers
        if c.container_class is not ContainerClass.APP
    )
    return dataclasses.replace(pod, init_container_statuses=statuses, phase=PodPhase.RUNNING)


class _Fixed:
    """A collector yielding the same families on every collect."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def _timed(action: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:8.1f} ms (min {min(values) * 1000:.1f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.metrics_scrape",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", action="store_true",
                        help="also time prometheus_client's exposition of the same series")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    store, pods = build_store(args.nodes)
    print(f"store: {args.nodes} nodes × {workload.GPUS_PER_NODE} GPUs, {len(pods)} pods "
          f"(built in {time.perf_counter() - started:.0f} s)")

    figures: dict[str, list[float]] = {k: [] for k in
                                       ("lock", "cold", "steady", "churn", "gzip", "http")}
    text = ""
    step = max(1, len(pods) // 100)
    for changed in range(args.rounds):
        figures["lock"].append(_timed(store.reading)[0])
        scrape = RecorderScrape(store)
        seconds, result = _timed(scrape.render)
        figures["cold"].append(seconds)
        text = str(result)
        figures["steady"].append(_timed(scrape.render)[0])
        for pod in pods[changed::step][: len(pods) // 100]:
            store.record_pod(finished(pod))
        figures["churn"].append(_timed(scrape.render)[0])
        encoded = text.encode()
        figures["gzip"].append(_timed(lambda data=encoded: gzip.compress(data, compresslevel=1))[0])

    scrape = RecorderScrape(store)
    metrics.set_scrape_text(scrape.render)
    port = metrics.start_metrics_server("127.0.0.1:0")
    url = f"http://127.0.0.1:{port}/metrics"
    body = b""
    for _ in range(args.rounds):
        request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})

        def fetch(request: urllib.request.Request = request) -> bytes:
            with urllib.request.urlopen(request, timeout=120) as response:
                return bytes(response.read())

        seconds, result = _timed(fetch)
        figures["http"].append(seconds)
        body = bytes(result)  # type: ignore[arg-type]
    if args.baseline:
        families = list(text_string_to_metric_families(text))
        registry = CollectorRegistry()
        registry.register(_Fixed(families))
        figures["baseline"] = [_timed(lambda: generate_latest(registry))[0]
                               for _ in range(max(1, args.rounds // 2))]
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    print(f"text: {len(text) / 2**20:.1f} MiB, {series} series; over HTTP gzipped "
          f"{len(body) / 2**20:.1f} MiB")
    for name, values in figures.items():
        print(f"{name:>7}: {_ms(values)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
