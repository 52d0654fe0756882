"""HAMi's scheduler metrics from the recorder's /metrics, through a pod's life.

A real recorder (gRPC server, store, SQLite journal) and a real metrics endpoint, scraped over
HTTP and read with prometheus_client's parsers (text format and OpenMetrics). The cluster: node-a
with two NVIDIA A100s, node-b with an AMD card whose cores are compute units; quotas on team-a
and team-b. The pod ``trainer`` (init 20 GiB / 10 % then app 10 GiB / 5 % on GPU-a0, and 4 GiB
/ 20 % on GPU-a1) goes through its life beside two pods that stay put, and after each step every
series of every HAMi family is compared, by name, labels and value, with what HAMi v2.10.0's
``cmd/scheduler/metrics.go`` writes for the same usage: the values are the ledger's, so GPU-a0
shows the init container's 20 GiB while it runs and the app's 10 GiB once it exited 0.

The HAMi families are named in docs/observability.md beside ours; a test there checks the
list.
"""

from __future__ import annotations

import gzip
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from accounting.model import Device, MigPlacement, MigProfile, Pod, PodPhase
from hami.accounting.v1 import types_pb2, usage_pb2
from services.common import convert, metrics
from services.usage import hami_metrics
from tests.builders import PodBuilder, gpu
from tests.support.pods import app_container, kube_pod, to_json
from tests.usage.conftest import RPC_TIMEOUT_S, RunningRecorder, StartRecorder

MIB = 1024 * 1024
A100 = "NVIDIA A100-SXM4-40GB"
MI210 = "AMD Instinct MI210"
ZONE = {"zone": "vGPU"}

GPU_A0 = Device("GPU-a0", A100, 0, 10, 40960, 100)
GPU_A1 = Device("GPU-a1", A100, 1, 10, 40960, 100)
AMD_B0 = Device("AMD-b0", MI210, 0, 4, 65536, 104, vendor="AMD")

Series = dict[frozenset[tuple[str, str]], float]


# -- the cluster and the pods -------------------------------------------------------------------


def _trainer() -> PodBuilder:
    return (
        PodBuilder("trainer", namespace="team-a", uid="uid-trainer", node="node-a")
        .init("convert", gpu("GPU-a0", mib=20480, cores=10))
        .app("server", gpu("GPU-a0", mib=10240, cores=5), gpu("GPU-a1", mib=4096, cores=20))
    )


TRAINER_INIT_RUNNING = _trainer().running("convert").build()
TRAINER_INIT_DONE = (
    _trainer().terminated("convert").running("server").phase(PodPhase.RUNNING).build()
)
WARMUP = (
    PodBuilder("warmup", namespace="team-a", uid="uid-warmup", node="node-a")
    .app("warmup", gpu("GPU-a0", mib=2048, cores=10))
    .running("warmup")
    .phase(PodPhase.RUNNING)
    .build()
)
AMD_JOB = (
    PodBuilder("amd-job", namespace="team-b", uid="uid-amd", node="node-b")
    .app("job", gpu("AMD-b0", mib=8192, cores=52, vendor="AMD"))
    .running("job")
    .phase(PodPhase.RUNNING)
    .build()
)


def _register(recorder: RunningRecorder, node: str, devices: tuple[Device, ...]) -> None:
    recorder.stub.RegisterNode(
        usage_pb2.RegisterNodeRequest(
            node_name=node,
            inventory=types_pb2.NodeInventory(devices=[convert.device_to_pb(d) for d in devices]),
        ),
        timeout=RPC_TIMEOUT_S,
    )


def _record(recorder: RunningRecorder, pod: Pod) -> str:
    response = recorder.stub.RecordPod(
        usage_pb2.RecordPodRequest(pod=convert.pod_to_pb(pod)), timeout=RPC_TIMEOUT_S
    )
    return str(response.decision)


def _cluster(recorder: RunningRecorder) -> None:
    _register(recorder, "node-a", (GPU_A0, GPU_A1))
    _register(recorder, "node-b", (AMD_B0,))
    for namespace, limits in (
        ("team-a", {"limits.nvidia.com/gpumem": 40960, "limits.nvidia.com/gpucores": 100}),
        ("team-b", {"limits.amd.com/gpumem": 65536}),
    ):
        recorder.stub.SetQuota(
            usage_pb2.SetQuotaRequest(namespace=namespace, limits=limits), timeout=RPC_TIMEOUT_S
        )
    assert _record(recorder, WARMUP) == "Recorded"
    assert _record(recorder, AMD_JOB) == "Recorded"


# -- scraping -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def metrics_url() -> str:
    """This process's /metrics (it serves the recorder started last)."""
    port = metrics.start_metrics_server("127.0.0.1:0")
    return f"http://127.0.0.1:{port}/metrics"


@dataclass(frozen=True)
class Scrape:
    families: dict[str, Series]

    def __getitem__(self, name: str) -> Series:
        return self.families.get(name, {})


def scrape(url: str, *, openmetrics: bool = False, gzipped: bool = False) -> Scrape:
    headers = {}
    if openmetrics:
        headers["Accept"] = "application/openmetrics-text; version=1.0.0; charset=utf-8"
    if gzipped:
        headers["Accept-Encoding"] = "gzip"
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
        body = r.read()
        if gzipped:
            assert r.headers["Content-Encoding"] == "gzip"
            body = gzip.decompress(body)
    text = body.decode()
    parse = om_families if openmetrics else text_string_to_metric_families
    families: dict[str, Series] = {}
    for found in parse(text):
        for sample in found.samples:
            families.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return Scrape(families)


def series(*rows: tuple[Mapping[str, str], float]) -> Series:
    return {frozenset({**labels, **ZONE}.items()): value for labels, value in rows}


def device(node: str, card: Device, **extra: str) -> dict[str, str]:
    return {"node": node, "device_uuid": card.uuid, "device_index": str(card.index),
            "device_type": card.model, **extra}


def container(pod: Pod, card: Device) -> dict[str, str]:
    return {"namespace": pod.namespace, "node": pod.node_name, "pod": pod.name,
            "container_index": "0", "device_uuid": card.uuid}


def quota(namespace: str, resource: str, limit: int | None = None) -> dict[str, str]:
    labels = {"namespace": namespace, "quota_name": resource}
    return labels if limit is None else {**labels, "limit": str(limit)}


# -- what HAMi writes for a given usage -----------------------------------------------------------


@dataclass(frozen=True)
class Charge:
    """What is charged on a card: memory MiB, cores (as stored) and slots."""

    memory_mib: int
    cores: int
    slots: int


def device_families(charges: Mapping[tuple[str, str], Charge]) -> dict[str, Series]:
    """HAMi's device families for the three cards with ``charges`` on them (node, uuid)."""
    cards = (("node-a", GPU_A0), ("node-a", GPU_A1), ("node-b", AMD_B0))
    out: dict[str, Series] = {name: {} for name, _ in hami_metrics.DEVICE_FAMILIES}
    for node, card in cards:
        used = charges.get((node, card.uuid), Charge(0, 0, 0))
        amd = card.vendor == "AMD"
        core_limit = 100 if amd else card.core_percent_total
        core_allocated = -(-used.cores * 100 // card.core_percent_total) if amd else used.cores
        cores = {"device_cores": str(card.core_percent_total)}
        rows = {
            hami_metrics.GPU_MEMORY_LIMIT: (device(node, card), card.memory_total_mib * MIB),
            hami_metrics.GPU_CORE_LIMIT: (device(node, card), core_limit),
            hami_metrics.GPU_MEMORY_ALLOCATED: (device(node, card, **cores),
                                                used.memory_mib * MIB),
            hami_metrics.GPU_SHARED_COUNT: (device(node, card), used.slots),
            hami_metrics.GPU_CORE_ALLOCATED: (device(node, card), core_allocated),
            hami_metrics.NODE_GPU_OVERVIEW: (
                device(node, card, **cores,
                       device_memory_limit=str(card.memory_total_mib)), used.memory_mib * MIB),
            hami_metrics.NODE_GPU_MEMORY_RATIO: (
                device(node, card), used.memory_mib / card.memory_total_mib),
        }
        for name, row in rows.items():
            out[name].update(series(row))
    return out


def pod_families(charges: Sequence[tuple[Pod, Device, int, int]]) -> dict[str, Series]:
    """HAMi's per-container families for ``charges``: (pod, card, memory MiB, cores)."""
    memory: Series = {}
    cores: Series = {}
    for pod, card, memory_mib, core_value in charges:
        memory.update(series((container(pod, card), memory_mib * MIB)))
        if card.vendor == "AMD":
            core_value = -(-core_value * 100 // card.core_percent_total)
        cores.update(series((container(pod, card), core_value)))
    return {hami_metrics.VGPU_MEMORY_ALLOCATED: memory,
            hami_metrics.VGPU_CORE_ALLOCATED: cores}


def quota_families(used_a: tuple[int, int]) -> dict[str, Series]:
    """HAMi's quota families with team-a using ``used_a`` (memory MiB, cores); team-b's AMD
    job never changes (its cores are compute units, counted as stored)."""
    memory_a, cores_a = used_a
    return {
        hami_metrics.RESOURCE_QUOTA_USED: series(
            (quota("team-a", "nvidia.com/gpumem", 40960), memory_a),
            (quota("team-a", "nvidia.com/gpucores", 100), cores_a),
            (quota("team-b", "amd.com/gpumem", 65536), 8192),
            (quota("team-b", "amd.com/gpucores", 0), 52),
        ),
        hami_metrics.RESOURCE_QUOTA_LIMIT: series(
            (quota("team-a", "nvidia.com/gpumem"), 40960),
            (quota("team-a", "nvidia.com/gpucores"), 100),
            (quota("team-b", "amd.com/gpumem"), 65536),
        ),
    }


def expected(step: str) -> dict[str, Series]:
    """Every HAMi family after ``step`` of the trainer's life."""
    warmup = Charge(2048, 10, 1)
    amd = Charge(8192, 52, 1)
    if step == "init running":
        a0, a1 = Charge(20480 + 2048, 10 + 10, 2), Charge(4096, 20, 1)
        trainer = [(TRAINER_INIT_RUNNING, GPU_A0, 20480, 10),
                   (TRAINER_INIT_RUNNING, GPU_A1, 4096, 20)]
        team_a = (20480 + 4096 + 2048, 10 + 20 + 10)
    elif step == "init finished":
        a0, a1 = Charge(10240 + 2048, 5 + 10, 2), Charge(4096, 20, 1)
        trainer = [(TRAINER_INIT_DONE, GPU_A0, 10240, 5),
                   (TRAINER_INIT_DONE, GPU_A1, 4096, 20)]
        team_a = (10240 + 4096 + 2048, 5 + 20 + 10)
    else:
        a0, a1 = warmup, Charge(0, 0, 0)
        trainer = []
        team_a = (2048, 10)
    return {
        **device_families({("node-a", "GPU-a0"): a0, ("node-a", "GPU-a1"): a1,
                           ("node-b", "AMD-b0"): amd}),
        **pod_families([*trainer, (WARMUP, GPU_A0, 2048, 10), (AMD_JOB, AMD_B0, 8192, 52)]),
        **quota_families(team_a),
    }


def _released(scraped: Scrape, family: str) -> float:
    return scraped[f"{family}_total"].get(frozenset({"namespace": "team-a"}.items()), 0.0)


LIFE = (
    ("init running", TRAINER_INIT_RUNNING, "Recorded"),
    ("init finished", TRAINER_INIT_DONE, "Shrunk"),
    ("deleted", None, ""),
)


@pytest.fixture
def cluster(start_recorder: StartRecorder, metrics_url: str) -> Iterator[RunningRecorder]:
    recorder = start_recorder()
    _cluster(recorder)
    yield recorder


def test_every_hami_family_follows_the_pod_life(cluster: RunningRecorder, metrics_url: str) -> None:
    released_before = _released(scrape(metrics_url), "hami_accounting_init_share_released_mib")
    for step, pod, decision in LIFE:
        if pod is not None:
            assert _record(cluster, pod) == decision
        else:
            cluster.stub.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid="uid-trainer"),
                                   timeout=RPC_TIMEOUT_S)
        scraped = scrape(metrics_url)
        for name, want in expected(step).items():
            assert scraped[name] == want, f"{name} after {step}"
        assert not set(hami_metrics.LEGACY_FAMILY_NAMES) & set(scraped.families), step
        held = scraped["hami_accounting_init_share_held_mib"]
        if step == "init running":
            # The init's 20 GiB peak over the app's 10 GiB, held on GPU-a0 only.
            assert held == {frozenset({"node": "node-a", "device_uuid": "GPU-a0"}.items()): 10240}
            assert scraped["hami_accounting_init_share_held_cores"] == {
                frozenset({"node": "node-a", "device_uuid": "GPU-a0"}.items()): 5}
        else:
            assert held == {}
        if step != "init running":
            released = _released(scraped, "hami_accounting_init_share_released_mib")
            assert released - released_before == 10240


def test_init_aware_the_card_shows_the_init_peak_then_the_app(
    cluster: RunningRecorder, metrics_url: str
) -> None:
    a0 = frozenset({**device("node-a", GPU_A0, device_cores="100"), **ZONE}.items())
    _record(cluster, TRAINER_INIT_RUNNING)
    during = scrape(metrics_url)[hami_metrics.GPU_MEMORY_ALLOCATED][a0]
    _record(cluster, TRAINER_INIT_DONE)
    after = scrape(metrics_url)[hami_metrics.GPU_MEMORY_ALLOCATED][a0]
    # 20 GiB while the init runs, 10 GiB once it exited 0 (plus the warmup pod's 2 GiB).
    assert (during, after) == ((20480 + 2048) * MIB, (10240 + 2048) * MIB)


def test_our_quota_families_count_devices_and_compare_limits_as_the_check_does(
    start_recorder: StartRecorder, metrics_url: str
) -> None:
    recorder = start_recorder(memory_factor=2)
    _cluster(recorder)
    _record(recorder, TRAINER_INIT_RUNNING)
    scraped = scrape(metrics_url)

    def labels(namespace: str, resource: str) -> frozenset[tuple[str, str]]:
        return frozenset({"namespace": namespace, "resource": resource}.items())

    used = scraped["hami_accounting_quota_used"]
    assert used[labels("team-a", "nvidia.com/gpu")] == 3  # trainer's 2 cards, warmup's 1
    assert used[labels("team-a", "nvidia.com/gpumem")] == 20480 + 4096 + 2048
    limits = scraped["hami_accounting_quota_limit"]
    # NVIDIA's memory factor 2 doubles the compared limit; AMD's memory unit is fixed.
    assert limits[labels("team-a", "nvidia.com/gpumem")] == 2 * 40960
    assert limits[labels("team-a", "nvidia.com/gpucores")] == 100
    assert limits[labels("team-b", "amd.com/gpumem")] == 65536
    # HAMi's family keeps HAMi's raw limit.
    assert scraped[hami_metrics.RESOURCE_QUOTA_LIMIT][
        frozenset({**quota("team-a", "nvidia.com/gpumem"), **ZONE}.items())] == 40960


def test_openmetrics_and_gzip_carry_the_same_series(
    cluster: RunningRecorder, metrics_url: str
) -> None:
    _record(cluster, TRAINER_INIT_RUNNING)
    text = scrape(metrics_url)
    for other in (scrape(metrics_url, openmetrics=True), scrape(metrics_url, gzipped=True)):
        for name in hami_metrics.HAMI_FAMILY_NAMES:
            assert other[name] == text[name], name


def test_a_new_inventory_rewrites_the_cards_lines(
    cluster: RunningRecorder, metrics_url: str
) -> None:
    _record(cluster, TRAINER_INIT_RUNNING)
    scrape(metrics_url)  # the lines are now kept
    bigger = Device("GPU-a1", A100, 1, 10, 81920, 100)
    _register(cluster, "node-a", (GPU_A0, bigger))
    scraped = scrape(metrics_url)
    assert scraped[hami_metrics.GPU_MEMORY_LIMIT][
        frozenset({**device("node-a", bigger), **ZONE}.items())] == 81920 * MIB
    assert scraped[hami_metrics.NODE_GPU_MEMORY_RATIO][
        frozenset({**device("node-a", bigger), **ZONE}.items())] == 4096 / 81920


# -- the legacy switch (HAMi's --legacy-metrics) --------------------------------------------------


def legacy_device(node: str, card: Device, **extra: str) -> dict[str, str]:
    return {"nodeid": node, "deviceuuid": card.uuid, "deviceidx": str(card.index), **extra}


def test_the_legacy_switch_adds_hamis_old_names_with_their_labels(
    start_recorder: StartRecorder, metrics_url: str
) -> None:
    recorder = start_recorder(hami_legacy_metrics=True)
    _cluster(recorder)
    _record(recorder, TRAINER_INIT_RUNNING)
    scraped = scrape(metrics_url)
    for name, want in expected("init running").items():
        assert scraped[name] == want, name  # the new names are still all there

    amd = legacy_device("node-b", AMD_B0, devicetype=MI210)
    amd_cores = {**amd, "devicecores": "104"}
    # Legacy core values are raw, as HAMi writes them: 104 compute units, 52 charged.
    assert scraped["GPUDeviceCoreLimit"][frozenset({**amd, **ZONE}.items())] == 104
    assert scraped["GPUDeviceCoreAllocated"][frozenset({**amd, **ZONE}.items())] == 52
    assert scraped["GPUDeviceMemoryLimit"][frozenset({**amd, **ZONE}.items())] == 65536 * MIB
    assert scraped["GPUDeviceMemoryAllocated"][frozenset({**amd_cores, **ZONE}.items())] == (
        8192 * MIB)
    assert scraped["GPUDeviceSharedNum"][frozenset({**amd, **ZONE}.items())] == 1
    assert scraped["nodeGPUOverview"][
        frozenset({**amd_cores, "devicememorylimit": "65536", **ZONE}.items())] == 8192 * MIB
    # nodeGPUMemoryPercentage has no device type label in HAMi.
    assert scraped["nodeGPUMemoryPercentage"][
        frozenset({**legacy_device("node-b", AMD_B0), **ZONE}.items())] == 8192 / 65536
    job = {"podnamespace": "team-b", "nodename": "node-b", "podname": "amd-job",
           "containeridx": "0", "deviceuuid": "AMD-b0", **ZONE}
    assert scraped["vGPUMemoryAllocated"][frozenset(job.items())] == 8192 * MIB
    assert scraped["vGPUCoreAllocated"][frozenset(job.items())] == 52
    assert scraped["QuotaUsed"][frozenset({"quotanamespace": "team-a",
                                           "quotaName": "nvidia.com/gpumem", "limit": "40960",
                                           **ZONE}.items())] == 20480 + 4096 + 2048
    for name in hami_metrics.LEGACY_FAMILY_NAMES:
        # This cluster has no MIG card: test_mig_instances_show_once_created covers that one.
        assert scraped[name] or name == "nodeGPUMigInstance", f"{name} has no series"


# -- MIG instances ---------------------------------------------------------------------------------

MIG_CARD = Device("GPU-c0", A100, 0, 7, 40960, 100, mode="mig",
                  mig_profiles=(MigProfile("1g.5gb", 5120, 14, 1, (MigPlacement(6, 1),)),))


def _mig_pod(runtime: str) -> dict[str, object]:
    allocation = ('[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-c0","profile":"1g.5gb",'
                  f'"placement":{{"start":6,"size":1}}{runtime}}}]')
    return kube_pod("mig-job", uid="uid-mig", namespace="team-a", node="node-c",
                    apps=[app_container("job", gpumem=5120)], phase="Running",
                    allocation="GPU-c0,NVIDIA,5120,14:;",
                    annotations={"hami.io/vgpu-mig-allocations": allocation})


def test_mig_instances_show_once_created(start_recorder: StartRecorder, metrics_url: str) -> None:
    """HAMi writes an instance only once its device plugin created it (``RuntimeReady``: the MIG
    UUID and both instance ids written back into the allocation)."""
    recorder = start_recorder(hami_legacy_metrics=True)
    _register(recorder, "node-c", (MIG_CARD,))

    def record(pod: dict[str, object]) -> None:
        recorder.stub.RecordPod(usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(pod)),
                                timeout=RPC_TIMEOUT_S)

    record(_mig_pod(""))
    scraped = scrape(metrics_url)
    assert scraped[hami_metrics.NODE_GPU_MIG_INSTANCE] == {}
    assert scraped[hami_metrics.GPU_MEMORY_ALLOCATED][frozenset(
        {**device("node-c", MIG_CARD, device_cores="100"), **ZONE}.items())] == 5120 * MIB

    record(_mig_pod(',"migUUID":"MIG-9f2c","gpuInstanceID":7,"computeInstanceID":0'))
    scraped = scrape(metrics_url)
    assert scraped[hami_metrics.NODE_GPU_MIG_INSTANCE] == series(({
        "node": "node-c", "device_uuid": "GPU-c0", "device_index": "0", "mig_uuid": "MIG-9f2c",
        "profile": "1g.5gb", "gpu_instance_id": "7", "compute_instance_id": "0",
        "placement_start": "6", "placement_size": "1"}, 1))
    assert scraped["nodeGPUMigInstance"] == series(({
        "nodeid": "node-c", "deviceuuid": "GPU-c0", "deviceidx": "0", "migname": "1g.5gb-7"}, 1))

    recorder.stub.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid="uid-mig"), timeout=RPC_TIMEOUT_S)
    assert scrape(metrics_url)[hami_metrics.NODE_GPU_MIG_INSTANCE] == {}


# -- the documentation ----------------------------------------------------------------------------


def test_docs_observability_lists_every_family_the_daemons_serve() -> None:
    import re
    from pathlib import Path

    from prometheus_client import REGISTRY

    import services.scheduler.metrics  # noqa: F401  # registers the scheduler's families
    from services.usage import metrics as usage_metrics

    text = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    documented = {name.removesuffix("_total")
                  for name in re.findall(r"^\| `(hami_\w+)` \|", text, flags=re.MULTILINE)}
    documented |= set(hami_metrics.LEGACY_FAMILY_NAMES) & set(re.findall(r"`(\w+)`", text))
    served = {collected.name for collected in REGISTRY.collect()
              if collected.name.startswith("hami_")}
    served |= {name for name, _ in (usage_metrics.INIT_SHARE_HELD_MIB,
                                    usage_metrics.INIT_SHARE_HELD_CORES,
                                    usage_metrics.QUOTA_USED, usage_metrics.QUOTA_LIMIT)}
    served |= set(hami_metrics.HAMI_FAMILY_NAMES) | set(hami_metrics.LEGACY_FAMILY_NAMES)
    assert documented == served
