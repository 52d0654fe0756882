"""The scrape-time families, line by line: HAMi's own test vectors for its scheduler collector,
and the invariants of the lines the recorder keeps between scrapes.

HAMi's vectors come from ``cmd/scheduler/metrics_test.go`` at v2.10.0 (the test named beside
each case); HAMi registers its collector there without the ``zone`` label its scheduler adds, so
the comparison leaves that label out. The property runs random changes on a store and checks
after each that the kept lines equal freshly written ones and that every device's figures are
the ledger's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from accounting.ledger import Ledger
from accounting.lifecycle import StoredPod
from accounting.mig import MigAllocation, MigRuntime
from accounting.model import (
    Device,
    DeviceUsage,
    MigInstance,
    MigPlacement,
    Pod,
    PodPhase,
    QuotaItem,
)
from services.usage import exposition, hami_metrics
from services.usage.journal import Journal
from services.usage.scrape import RecorderScrape
from services.usage.store import UsageStore
from tests.builders import PodBuilder, gpu

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str, *, keep_zone: bool = False) -> Samples:
    out: Samples = {}
    for found in text_string_to_metric_families(text):
        for sample in found.samples:
            labels = dict(sample.labels)
            if not keep_zone:
                assert labels.pop("zone") == "vGPU"
            out[(sample.name, frozenset(labels.items()))] = sample.value
    return out


def hami(text: str) -> Samples:
    """HAMi's expected exposition (a test's ``want``) as samples."""
    return samples(text, keep_zone=True)


def only(found: Samples, *names: str) -> Samples:
    return {key: value for key, value in found.items() if key[0] in names}


def device_text(
    node: str, device: Device, used: tuple[int, int, int], legacy: bool,
    instances: list[MigAllocation] | None = None,
) -> str:
    families = hami_metrics.families(legacy)[0]
    lines = hami_metrics.device_lines(node, device, used, legacy, instances or ())
    return "".join(exposition.family(n, h, [line]) for (n, h), line in zip(families, lines,
                                                                          strict=True))


def pod_text(stored: StoredPod, devices: dict[str, Device], legacy: bool) -> str:
    families = hami_metrics.families(legacy)[1]
    lines = hami_metrics.pod_lines(stored, devices, legacy)
    return "".join(exposition.family(n, h, [line]) for (n, h), line in zip(families, lines,
                                                                          strict=True))


def quota_text(namespace: str, items: tuple[QuotaItem, ...], legacy: bool) -> str:
    tracked = frozenset({"nvidia.com/gpumem", "nvidia.com/gpucores"})
    families = hami_metrics.families(legacy)[2]
    lines = hami_metrics.quota_lines(namespace, items, tracked, legacy)
    return "".join(exposition.family(n, h, [line]) for (n, h), line in zip(families, lines,
                                                                          strict=True))


# -- HAMi's vectors ---------------------------------------------------------------------------


def test_hami_describe_collect_sync_device() -> None:
    """TestSchedulerDescribeCollectSync: GPU-abc-123, 2 of 4 slots, 4096 of 8192 MiB, 50 of
    100 cores, NVIDIA."""
    card = Device("GPU-abc-123", "NVIDIA", 0, 4, 8192, 100)
    found = samples(device_text("node-1", card, (4096, 50, 2), legacy=False))
    labels = {"device_index": "0", "device_type": "NVIDIA", "device_uuid": "GPU-abc-123",
              "node": "node-1"}
    assert found == {
        ("hami_gpu_memory_limit_bytes", frozenset(labels.items())): 8192 * 2**20,
        ("hami_gpu_core_limit_ratio", frozenset(labels.items())): 100,
        ("hami_gpu_memory_allocated_bytes",
         frozenset({**labels, "device_cores": "100"}.items())): 4096 * 2**20,
        ("hami_gpu_shared_count", frozenset(labels.items())): 2,
        ("hami_gpu_core_allocated_ratio", frozenset(labels.items())): 50,
        ("hami_node_gpu_overview", frozenset(
            {**labels, "device_cores": "100", "device_memory_limit": "8192"}.items())):
            4096 * 2**20,
        ("hami_node_gpu_memory_allocated_ratio", frozenset(labels.items())): 0.5,
    }


def test_hami_amd_core_allocated_ratio_normalization() -> None:
    """TestAMDCoreAllocatedRatioNormalization (HAMi #2518): a 50 % request on a 64-CU card is
    stored as 32 CUs; both ratio families show 50, the legacy ones the raw 32."""
    card = Device("AMD-1", "AMDGPU", 0, 1, 192000, 64, vendor="AMD")
    found = samples(device_text("node-1", card, (0, 32, 0), legacy=True))
    want = hami("""
hami_gpu_core_allocated_ratio{device_index="0",device_type="AMDGPU",device_uuid="AMD-1",node="node-1"} 50
GPUDeviceCoreAllocated{deviceidx="0",devicetype="AMDGPU",deviceuuid="AMD-1",nodeid="node-1"} 32
""")  # noqa: E501  # HAMi's expected lines, as written in its test
    assert only(found, "hami_gpu_core_allocated_ratio", "GPUDeviceCoreAllocated") == want
    stored = StoredPod(uid="uid-amd", namespace="default", name="amd-pod", node_name="node-1",
                       usage=(DeviceUsage("AMD-1", "AMD", 96000, 32, 1),))
    found = samples(pod_text(stored, {"AMD-1": card}, legacy=True))
    want = hami("""
hami_vgpu_core_allocated_ratio{container_index="0",device_uuid="AMD-1",namespace="default",node="node-1",pod="amd-pod"} 50
vGPUCoreAllocated{containeridx="0",deviceuuid="AMD-1",nodename="node-1",podname="amd-pod",podnamespace="default"} 32
""")  # noqa: E501
    assert only(found, "hami_vgpu_core_allocated_ratio", "vGPUCoreAllocated") == want


def test_hami_mig_runtime_identity() -> None:
    """TestClusterManagerCollectorExposesDynamicMigRuntimeIdentity: a created 2g.10gb instance
    at slices 0-1, GPU instance 4, compute instance 0; one not created yet is not written."""
    card = Device("GPU-parent", "NVIDIA", 0, 7, 40960, 100, mode="mig")
    created = MigAllocation(0, 0, "GPU-parent", MigInstance("2g.10gb", MigPlacement(0, 2)),
                            MigRuntime("MIG-runtime", 4, 0))
    found = samples(device_text("node-1", card, (10240, 28, 1), legacy=True, instances=[created]))
    want = hami("""
hami_node_gpu_mig_instance_info{compute_instance_id="0",device_index="0",device_uuid="GPU-parent",gpu_instance_id="4",mig_uuid="MIG-runtime",node="node-1",placement_size="2",placement_start="0",profile="2g.10gb"} 1
nodeGPUMigInstance{deviceidx="0",deviceuuid="GPU-parent",migname="2g.10gb-4",nodeid="node-1"} 1
""")  # noqa: E501  # HAMi's expected line; the legacy one as its legacy collector writes it
    assert only(found, "hami_node_gpu_mig_instance_info", "nodeGPUMigInstance") == want
    # A card not in MIG mode writes none (HAMi reads the allocations of MIG cards only).
    plain = Device("GPU-parent", "NVIDIA", 0, 7, 40960, 100)
    found = samples(device_text("node-1", plain, (0, 0, 0), legacy=True, instances=[created]))
    assert only(found, "hami_node_gpu_mig_instance_info", "nodeGPUMigInstance") == {}


@pytest.mark.parametrize(
    ("device_type", "memory_mib", "want_ratio"),
    [("AWSNeuron", 0, None), ("NVIDIA", 4, 0.25)],
    ids=["a card without memory writes no ratio", "1 of 4 MiB is 0.25"],
)
def test_hami_memory_ratio_only_for_a_card_with_memory(
    device_type: str, memory_mib: int, want_ratio: float | None
) -> None:
    """TestClusterManagerCollectorSkipsMemoryRatioWithNonPositiveTotalMemory (its negative
    total cannot be registered here: inventories are validated)."""
    card = Device("card", device_type, 2, 1, memory_mib, 2)
    used = (1 if memory_mib else 0, 0, 0)
    found = samples(device_text("node-1", card, used, legacy=True))
    labels = {"device_index": "2", "device_type": device_type, "device_uuid": "card",
              "node": "node-1"}
    legacy = {"deviceidx": "2", "deviceuuid": "card", "nodeid": "node-1"}
    assert found[("hami_gpu_core_limit_ratio", frozenset(labels.items()))] == 2
    ratio = found.get(("hami_node_gpu_memory_allocated_ratio", frozenset(labels.items())))
    old = found.get(("nodeGPUMemoryPercentage", frozenset(legacy.items())))
    assert (ratio, old) == (want_ratio, want_ratio)


def test_hami_quota_metrics() -> None:
    """TestClusterManagerCollectorQuotaMetrics, both of its cases (legacy off and on)."""
    items = (QuotaItem("nvidia.com/gpucores", used=50, limit=100, limit_set=True),
             QuotaItem("nvidia.com/gpumem", used=4096, limit=8192, limit_set=True))
    new = """
hami_resource_quota_limit{namespace="team-a",quota_name="nvidia.com/gpucores"} 100
hami_resource_quota_limit{namespace="team-a",quota_name="nvidia.com/gpumem"} 8192
hami_resource_quota_used{limit="100",namespace="team-a",quota_name="nvidia.com/gpucores"} 50
hami_resource_quota_used{limit="8192",namespace="team-a",quota_name="nvidia.com/gpumem"} 4096
"""
    old = """
QuotaUsed{limit="100",quotaName="nvidia.com/gpucores",quotanamespace="team-a"} 50
QuotaUsed{limit="8192",quotaName="nvidia.com/gpumem",quotanamespace="team-a"} 4096
"""
    assert samples(quota_text("team-a", items, legacy=False)) == hami(new)
    assert samples(quota_text("team-a", items, legacy=True)) == hami(new + old)


def test_hami_quota_unconfigured_limit() -> None:
    """TestClusterManagerCollectorQuotaUnconfiguredLimit: usage without a limit writes the
    used series with limit "0" and no limit series."""
    items = (QuotaItem("nvidia.com/gpumem", used=1024, limit=0, limit_set=False),)
    assert samples(quota_text("team-b", items, legacy=False)) == hami(
        'hami_resource_quota_used{limit="0",namespace="team-b",quota_name="nvidia.com/gpumem"}'
        " 1024\n"
    )


@pytest.mark.parametrize(("mib", "want"), [(0, 0), (1, 1024 * 1024), (16384, 16384 * 2**20)],
                         ids=["zero", "one mebibyte", "typical device memory"])
def test_hami_mib_to_bytes(mib: int, want: int) -> None:
    """TestMibToBytes: memory families are in bytes."""
    card = Device("g", "NVIDIA", 0, 1, 16384, 100)
    found = samples(device_text("n", card, (mib, 0, 0), legacy=False))
    labels = {"device_index": "0", "device_type": "NVIDIA", "device_uuid": "g", "node": "n"}
    assert found[("hami_gpu_memory_allocated_bytes",
                  frozenset({**labels, "device_cores": "100"}.items()))] == want


def test_label_values_are_escaped() -> None:
    card = Device('GPU-"quoted"\\', "NVIDIA\nA10", 0, 1, 1024, 100)
    found = samples(device_text("node", card, (0, 0, 0), legacy=False))
    assert ("hami_gpu_memory_limit_bytes", frozenset(
        {"device_index": "0", "device_type": "NVIDIA\nA10", "device_uuid": 'GPU-"quoted"\\',
         "node": "node"}.items())) in found


# -- the kept lines ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    kind: str
    """"register" a node, "record" a pod's state, "forget" a pod."""
    node: int
    pod: int = 0
    stage: int = 0
    """0: init running, 1: init exited 0, 2: terminal."""
    memory_mib: int = 1024


OPS = st.one_of(
    st.builds(Op, st.just("register"), st.integers(0, 2), memory_mib=st.sampled_from(
        [40960, 81920])),
    st.builds(Op, st.just("record"), st.integers(0, 2), st.integers(0, 4), st.integers(0, 2),
              st.sampled_from([1024, 2048, 4096])),
    st.builds(Op, st.just("forget"), st.integers(0, 2), st.integers(0, 4)),
)


def _devices(node: int, memory_mib: int) -> tuple[Device, ...]:
    return tuple(Device(f"GPU-{node}-{i}", "NVIDIA A100", i, 10, memory_mib, 100)
                 for i in range(2))


def _pod(op: Op) -> Pod:
    builder = (
        PodBuilder(f"p{op.pod}", namespace=f"ns{op.pod % 2}", uid=f"uid-{op.pod}",
                   node=f"node-{op.node}")
        .init("init", gpu(f"GPU-{op.node}-0", mib=2 * op.memory_mib, cores=20))
        .app("app", gpu(f"GPU-{op.node}-0", mib=op.memory_mib, cores=10),
             gpu(f"GPU-{op.node}-1", mib=op.memory_mib // 2, cores=5))
    )
    if op.stage == 0:
        return builder.running("init").build()
    phase = PodPhase.RUNNING if op.stage == 1 else PodPhase.SUCCEEDED
    return builder.terminated("init").running("app").phase(phase).build()


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(OPS, min_size=1, max_size=25))
def test_kept_lines_equal_fresh_ones_and_the_ledger(ops: list[Op]) -> None:
    store = UsageStore(Ledger(), None)
    kept = RecorderScrape(store)
    for op in ops:
        if op.kind == "register":
            store.register_node(f"node-{op.node}", _devices(op.node, op.memory_mib))
        elif op.kind == "forget":
            store.forget_pod(f"uid-{op.pod}")
        else:
            store.record_pod(_pod(op))
        text = kept.render()
        assert text == RecorderScrape(store).render()
        found = samples(text, keep_zone=True)
        nodes, _ = store.node_usage()
        for node in nodes:
            for state in node.devices:
                labels = {"node": node.node_name, "device_uuid": state.device.uuid,
                          "device_index": str(state.device.index),
                          "device_type": state.device.model, "zone": "vGPU",
                          "device_cores": "100"}
                assert found[("hami_gpu_memory_allocated_bytes", frozenset(labels.items()))] == (
                    state.memory_used_mib * 2**20)
                del labels["device_cores"]
                assert found[("hami_gpu_shared_count", frozenset(labels.items()))] == (
                    state.slots_used)
                assert found[("hami_gpu_core_allocated_ratio", frozenset(labels.items()))] == (
                    state.core_percent_used)


def _held(store: UsageStore) -> Samples:
    return only(samples(RecorderScrape(store).render(), keep_zone=True),
                "hami_accounting_init_share_held_mib")


def test_a_reservation_holds_its_init_share_and_a_restart_shows_it_once_recorded(
    tmp_path: Path,
) -> None:
    journal = Journal.in_data_dir(tmp_path)
    store = UsageStore(Ledger(), journal)
    store.register_node("node-0", _devices(0, 40960))
    pod = _pod(Op("record", 0, 1, 0, 4096))
    assert store.reserve(pod, "node-0").reserved
    where = frozenset({"node": "node-0", "device_uuid": "GPU-0-0"}.items())
    # The init's 8192 MiB over the app's 4096 on GPU-0-0.
    assert _held(store) == {("hami_accounting_init_share_held_mib", where): 4096}
    journal.close()

    # After a restart the share shows once the pod is recorded again: the steady state it is
    # measured against needs the pod's containers, which the journal does not keep.
    journal = Journal.in_data_dir(tmp_path)
    restarted = UsageStore(Ledger(), journal)
    assert restarted.recover().pods == 1
    assert _held(restarted) == {}
    restarted.record_pod(pod)
    assert _held(restarted) == {("hami_accounting_init_share_held_mib", where): 4096}
    journal.close()
