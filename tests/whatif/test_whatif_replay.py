"""The what-if replay on generated workloads: the generator is seeded and realistic, and the
replay's figures keep their invariants under every rule; its node choices are fit_pod's."""

from __future__ import annotations

from collections import Counter

import pytest

from accounting.counting_rules import CountingRule
from accounting.fit import NodeFit, NodeState, QuotaContext, fit_pod
from accounting.model import ContainerClass
from whatif import replay as replay_module
from whatif.generate import generate
from whatif.kube_input import SourcedObject, read_workload
from whatif.replay import replay
from whatif.results import Outcome
from whatif.settings import ReplaySettings
from whatif.workload import Workload

SHAPES = {"inference", "warmup", "sidecar-first", "sidecar-after", "two-stage", "trainer", "mesh"}


def generated(pods: int, seed: int, nodes: int | None = None) -> Workload:
    made = generate(pods, seed, nodes=nodes)
    return read_workload([SourcedObject("generated", made.objects)], window_s=made.window_s)


def integral(times_s: tuple[int, ...], values: tuple[int, ...], window_s: int) -> int:
    ends = (*times_s[1:], window_s)
    return sum(
        value * (end - start) for start, end, value in zip(times_s, ends, values, strict=True)
    )


@pytest.fixture(scope="module")
def workload() -> Workload:
    return generated(400, seed=11)


def test_a_seed_always_gives_the_same_workload_and_another_seed_another() -> None:
    assert generate(50, 3).objects == generate(50, 3).objects
    assert generate(50, 3).objects != generate(50, 4).objects


def test_the_generated_mix_has_every_shape_with_init_containers_and_sidecars(
    workload: Workload,
) -> None:
    shapes = Counter(p.pod.name.rsplit("-", 1)[0] for p in workload.pods)
    assert set(shapes) == SHAPES
    classes = Counter(c.container_class for p in workload.pods for c in p.pod.containers)
    assert classes[ContainerClass.INIT] and classes[ContainerClass.SIDECAR]
    arrivals = [p.arrival_s for p in workload.pods]
    assert arrivals == sorted(arrivals) and arrivals[-1] > arrivals[0]
    assert workload.quotas and len(workload.nodes) == 20
    assert any(p.app_run_s is not None for p in workload.pods)  # some pods end inside the window


@pytest.mark.parametrize("rule", list(CountingRule), ids=[r.value for r in CountingRule])
def test_every_pod_is_accounted_for_and_the_pool_is_never_overbooked(
    workload: Workload, rule: CountingRule
) -> None:
    result = replay(workload, rule)

    assert len(result.pods) == len(workload.pods)
    counts = Counter(p.outcome for p in result.pods)
    assert counts[Outcome.PLACED] == result.placed
    assert counts[Outcome.PENDING] == result.pending
    assert counts[Outcome.REFUSED] == sum(result.refused.values())
    pool_mib = sum(d.memory_total_mib for n in workload.nodes for d in n.devices)
    assert min(result.reserved_mib) >= 0 and max(result.reserved_mib) <= pool_mib
    assert result.peak_reserved_mib == max(result.reserved_mib)
    assert result.mean_reserved_mib <= result.peak_reserved_mib
    assert list(result.times_s) == sorted(set(result.times_s))
    # The idle and beyond-reservation curves integrate to the per-pod totals.
    assert integral(result.times_s, result.idle_mib, result.window_s) == result.idle_mib_s
    assert (
        integral(result.times_s, result.unreserved_mib, result.window_s) == result.unreserved_mib_s
    )
    assert (
        result.mean_requested_mib
        == integral(result.times_s, result.requested_mib, result.window_s) // result.window_s
    )
    for namespace in result.namespaces:
        if namespace.limit_mib is not None:
            assert namespace.peak_used_mib <= namespace.limit_mib, namespace
    for pod in result.pods:
        if pod.outcome is Outcome.PLACED:
            assert pod.placed_s is not None and pod.node_name and pod.peak_stored_mib > 0
        else:
            assert pod.placed_s is None and pod.peak_stored_mib == 0


def test_only_hami_v2_10_reserves_less_than_the_running_containers_ask(
    workload: Workload,
) -> None:
    results = {rule: replay(workload, rule) for rule in CountingRule}

    # A sidecar counted as an init container is under-counted beside the apps.
    assert results[CountingRule.HAMI_V2_10].unreserved_mib_s > 0
    for rule in (CountingRule.SUMMED, CountingRule.SHRINK, CountingRule.PROGRESSIVE):
        assert results[rule].unreserved_mib_s == 0, rule
    # Releasing each init container's share as it finishes leaves less reserved but idle.
    assert results[CountingRule.PROGRESSIVE].idle_mib_s < results[CountingRule.SHRINK].idle_mib_s
    assert results[CountingRule.SHRINK].idle_mib_s < results[CountingRule.SUMMED].idle_mib_s


def test_the_replay_is_deterministic(workload: Workload) -> None:
    assert replay(workload, CountingRule.SHRINK) == replay(workload, CountingRule.SHRINK)


@pytest.mark.parametrize("rule", list(CountingRule), ids=[r.value for r in CountingRule])
@pytest.mark.parametrize("node_policy", ["binpack", "spread"])
def test_every_placement_is_what_fit_pod_chooses_over_every_node(
    monkeypatch: pytest.MonkeyPatch, rule: CountingRule, node_policy: str
) -> None:
    """The replay tries few nodes (those that changed since a shape failed, those a cheap
    check does not rule out, in preference order); fit_pod on every node must agree."""
    # Small and crowded: pods wait, shapes fail and are retried, quotas refuse.
    workload = generated(150, seed=5, nodes=4)
    place = replay_module._Replay.place
    checked = Counter[str]()

    def checked_place(
        self: replay_module._Replay, live: object, chosen: NodeFit, now_s: int
    ) -> None:
        pod = self.pods[live.index].counted  # type: ignore[attr-defined]
        nodes = [NodeState(n, self.ledger.node_states(n) or ()) for n in self.inventories]
        quota = None
        if pod.namespace in self.quota_namespaces:
            quota = QuotaContext(self.ledger.namespace_items(pod.namespace))
        reference = fit_pod(pod, nodes, node_policy=node_policy, quota=quota)
        assert (chosen.node_name, chosen.grants) == (reference.node_name, reference.grants)
        checked["placed"] += 1
        place(self, live, chosen, now_s)  # type: ignore[arg-type]

    monkeypatch.setattr(replay_module._Replay, "place", checked_place)
    result = replay(workload, rule, ReplaySettings(node_policy=node_policy))

    assert checked["placed"] == result.placed > 0
    if rule is CountingRule.SUMMED:
        assert result.waited_over_threshold > 0 and result.refused


def _weighted_pod(name: str, second: int, limits: dict[str, str],
                  annotations: dict[str, str]) -> dict[str, object]:
    return {
        "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "team-a", "uid": f"uid-{name}",
            "creationTimestamp": f"2025-01-06T09:00:0{second}Z", "annotations": annotations,
        },
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
        "status": {},
    }


@pytest.mark.parametrize(
    "weights, card", [(None, "gpu-a"), ("slot=1,core=1,memory=3", "gpu-b")]
)
def test_the_replay_orders_cards_by_the_pods_scoring_weights(
    monkeypatch: pytest.MonkeyPatch, weights: str | None, card: str
) -> None:
    # gpu-a is busy in cores, gpu-b in memory: equal weights make gpu-a the busier card (binpack
    # takes it), memory weighing 3 makes gpu-b the busier (hami.io/device-scoring-weights).
    from accounting.annotations import NODE_REGISTER_ANNOTATION
    from accounting.hami_codec import encode_node_register
    from tests.builders import device

    register = encode_node_register(
        [device("gpu-a", mib=10000, index=0), device("gpu-b", mib=10000, index=1)]
    )
    node = {"kind": "Node", "metadata": {"name": "node-1",
                                         "annotations": {NODE_REGISTER_ANNOTATION: register}}}
    annotations = {"hami.io/gpu-scheduler-policy": "binpack"}
    if weights is not None:
        annotations["hami.io/device-scoring-weights"] = weights
    objects = [
        node,
        _weighted_pod("cores", 0, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000",
                                   "nvidia.com/gpucores": "90"},
                      {"nvidia.com/use-gpuuuid": "gpu-a"}),
        _weighted_pod("memory", 1, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "5000",
                                    "nvidia.com/gpucores": "1"},
                      {"nvidia.com/use-gpuuuid": "gpu-b"}),
        _weighted_pod("weighed", 2, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000",
                                     "nvidia.com/gpucores": "5"}, annotations),
    ]
    workload = read_workload([SourcedObject("cluster.json", {"kind": "List", "items": objects})],
                             window_s=600)
    place = replay_module._Replay.place
    granted: dict[str, list[str]] = {}

    def recording_place(
        self: replay_module._Replay, live: object, chosen: NodeFit, now_s: int
    ) -> None:
        pod = self.pods[live.index].counted  # type: ignore[attr-defined]
        granted[pod.name] = [g.uuid for grants in chosen.grants for g in grants]
        place(self, live, chosen, now_s)  # type: ignore[arg-type]

    monkeypatch.setattr(replay_module._Replay, "place", recording_place)
    replay(workload, CountingRule.SHRINK)

    assert granted == {"cores": ["gpu-a"], "memory": ["gpu-b"], "weighed": [card]}


def test_the_replay_takes_fit_pods_node_when_a_vendor_term_reorders_the_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kunlunxin cards: node b holds two pinned pods and a one, so b is the busier and the
    first that fits in the default score's order; Kunlunxin's term on the node score makes a
    the better node for a one-card pod (accounting.fit.node_score), as fit_pod over every node
    says."""
    from accounting.policy import policy_for

    def kunlun_pod(name: str, second: int, pin: str | None) -> dict[str, object]:
        annotations = {} if pin is None else {"hami.io/use-xpu-uuid": pin}
        return _weighted_pod(name, second, {"kunlunxin.com/xpu": "1"}, annotations)

    nodes = [{"kind": "Node", "metadata": {"name": name},
              "status": {"capacity": {"kunlunxin.com/xpu": "8"},
                         "allocatable": {"kunlunxin.com/xpu": "8"}}} for name in ("a", "b")]
    objects = [
        *nodes,
        kunlun_pod("on-a", 0, "a-kunlun-0"),
        kunlun_pod("on-b-0", 1, "b-kunlun-0"),
        kunlun_pod("on-b-1", 2, "b-kunlun-1"),
        kunlun_pod("free", 3, None),
    ]
    settings = ReplaySettings(policy=policy_for(["kunlun"]))
    workload = read_workload([SourcedObject("cluster.json", {"kind": "List", "items": objects})],
                             window_s=600, vendor=settings.policy.vendors[0])
    place = replay_module._Replay.place
    chosen_nodes: dict[str, str] = {}

    def checked_place(
        self: replay_module._Replay, live: object, chosen: NodeFit, now_s: int
    ) -> None:
        pod = self.pods[live.index].counted  # type: ignore[attr-defined]
        states = [NodeState(n, self.ledger.node_states(n) or ()) for n in self.inventories]
        reference = fit_pod(pod, states, vendor=self.vendor)
        assert (chosen.node_name, chosen.grants) == (reference.node_name, reference.grants)
        chosen_nodes[pod.name] = chosen.node_name
        place(self, live, chosen, now_s)  # type: ignore[arg-type]

    monkeypatch.setattr(replay_module._Replay, "place", checked_place)
    result = replay(workload, CountingRule.SHRINK, settings)

    assert result.placed == 4
    assert chosen_nodes == {"on-a": "a", "on-b-0": "b", "on-b-1": "b", "free": "a"}


@pytest.mark.parametrize("policy, card", [(None, "dev-2"), ("topology-aware", "dev-1")])
def test_the_replay_chooses_cards_by_the_topology_aware_policy(
    monkeypatch: pytest.MonkeyPatch, policy: str | None, card: str
) -> None:
    # HAMi's TestFit_TopologyWorstSingleCard node (tests/support/hami_topology_cases.py T2),
    # its pair scores read from the Node: the policy takes the least connected card, dev-1;
    # without it the walk's first card is taken.
    from tests.support import hami_topology_cases

    node = {"kind": "Node", **hami_topology_cases.FIT[1].kube_node("node1")}
    annotations = {} if policy is None else {"hami.io/gpu-scheduler-policy": policy}
    pod = _weighted_pod("topo", 0, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100",
                                    "nvidia.com/gpucores": "10"}, annotations)
    listed = {"kind": "List", "items": [node, pod]}
    workload = read_workload([SourcedObject("cluster.json", listed)], window_s=600)
    place = replay_module._Replay.place
    granted: list[str] = []

    def recording_place(
        self: replay_module._Replay, live: object, chosen: NodeFit, now_s: int
    ) -> None:
        granted.extend(g.uuid for grants in chosen.grants for g in grants)
        place(self, live, chosen, now_s)  # type: ignore[arg-type]

    monkeypatch.setattr(replay_module._Replay, "place", recording_place)
    assert replay(workload, CountingRule.SHRINK).placed == 1

    assert granted == [card]
