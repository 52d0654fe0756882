"""The what-if replay on random workloads (Hypothesis): pods of every shape the fit knows
(shares of a card, several cards, exclusive cores, GPU type annotations, node policies), nodes
of mixed cards with unhealthy ones, quotas that bind. Whatever the rule:

* every placement is the node and the grants fit_pod would choose over every node, with the
  namespace's quota as it stands, and every pod the replay tries and refuses fit_pod refuses
  too (the replay tries far fewer nodes);
* no card is ever charged past its memory, cores or slots; no namespace past its quota;
* every pod ends placed, refused or pending, and the figures add up.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounting.counting_rules import CountingRule
from accounting.fit import NodeFit, NodeState, QuotaContext, fit_pod
from accounting.kube.node_json import NodeRegistration
from accounting.model import NVIDIA, Container, ContainerClass, Device, DeviceRequest, Pod
from whatif import replay as replay_module
from whatif.replay import replay
from whatif.results import Outcome
from whatif.settings import ReplaySettings
from whatif.shapes import ShapeQueue
from whatif.workload import ReplayPod, Workload

MEM = "nvidia.com/gpumem"
MODELS = ("NVIDIA A10", "NVIDIA A100-SXM4-40GB")

requests = st.builds(
    DeviceRequest,
    vendor=st.just(NVIDIA),
    count=st.integers(1, 3),
    memory_mib=st.sampled_from([0, 2048, 8192, 16384, 30000]),
    memory_percent=st.sampled_from([0, 25, 50, 100]),
    core_percent=st.sampled_from([0, 0, 20, 50, 100]),
)


@st.composite
def replay_pods(draw: st.DrawFn, index: int) -> ReplayPod:
    classes = draw(st.lists(st.sampled_from(list(ContainerClass)), min_size=1, max_size=4))
    # spec.initContainers first, then spec.containers, as a parser yields them.
    classes.sort(key=lambda c: c is ContainerClass.APP)
    containers = tuple(
        Container(f"c{i}", cls, draw(st.one_of(st.just(()), requests.map(lambda r: (r,)))))
        for i, cls in enumerate(classes)
    )
    if not any(c.requests for c in containers):
        containers = (*containers[:-1], Container("gpu", ContainerClass.APP, (draw(requests),)))
    annotations = draw(
        st.dictionaries(
            st.sampled_from(
                [
                    "nvidia.com/use-gputype",
                    "hami.io/node-scheduler-policy",
                    "hami.io/gpu-scheduler-policy",
                ]
            ),
            st.sampled_from(["a100", "A10", "binpack", "spread"]),
            max_size=1,
        )
    )
    inits = sum(1 for c in containers if c.container_class is ContainerClass.INIT)
    pod = Pod(
        f"uid-{index}",
        draw(st.sampled_from(["ns-a", "ns-b"])),
        f"p{index}",
        containers,
        annotations=annotations,
    )
    return ReplayPod(
        pod,
        draw(st.integers(0, 300)),
        tuple(draw(st.integers(0, 120)) for _ in range(inits)),
        draw(st.one_of(st.none(), st.integers(0, 400))),
    )


@st.composite
def nodes(draw: st.DrawFn, name: str) -> NodeRegistration:
    count = draw(st.integers(1, 4))
    return NodeRegistration(
        name,
        tuple(
            Device(
                f"{name}-g{i}",
                draw(st.sampled_from(MODELS)),
                i,
                draw(st.sampled_from([2, 10])),
                draw(st.sampled_from([24576, 40960])),
                100,
                healthy=draw(st.sampled_from([True, True, True, False])),
            )
            for i in range(count)
        ),
    )


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    pods = [draw(replay_pods(i)) for i in range(draw(st.integers(1, 25)))]
    pods.sort(key=lambda p: p.arrival_s)
    pool = tuple(draw(nodes(f"node-{i}")) for i in range(draw(st.integers(1, 5))))
    quota = draw(st.one_of(st.none(), st.sampled_from([20000, 60000, 150000])))
    return Workload(
        pods=tuple(pods),
        nodes=pool,
        window_s=600,
        quotas={"ns-a": {MEM: quota}} if quota is not None else {},
    )


@pytest.fixture
def checked_placements(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every placement of the replay compared with fit_pod over every node."""
    place = replay_module._Replay.place
    placements: Counter[str] = Counter()

    def checked(self: replay_module._Replay, live: object, chosen: NodeFit, now_s: int) -> None:
        pod = self.pods[live.index].counted  # type: ignore[attr-defined]
        states = [NodeState(n, self.ledger.node_states(n) or ()) for n in self.inventories]
        quota = None
        if pod.namespace in self.quota_namespaces:
            quota = QuotaContext(self.ledger.namespace_items(pod.namespace))
        reference = fit_pod(pod, states, node_policy=self.settings.node_policy, quota=quota)
        assert (chosen.node_name, chosen.grants) == (reference.node_name, reference.grants)
        place(self, live, chosen, now_s)  # type: ignore[arg-type]
        for state in self.ledger.node_states(chosen.node_name) or ():
            device = state.device
            assert state.memory_used_mib <= device.memory_total_mib
            assert state.core_percent_used <= device.core_percent_total
            assert state.slots_used <= device.slots_total
        placements["placed"] += 1

    monkeypatch.setattr(replay_module._Replay, "place", checked)

    attempt = replay_module._Replay.attempt

    def checked_attempt(self: replay_module._Replay, queue: ShapeQueue, now_s: int) -> bool:
        head = queue.waiting[0]
        if attempt(self, queue, now_s):
            return True
        # Refused on the nodes tried: every node refuses it (none left out would take it).
        pod = self.pods[head].counted
        states = [NodeState(n, self.ledger.node_states(n) or ()) for n in self.inventories]
        quota = None
        if pod.namespace in self.quota_namespaces:
            quota = QuotaContext(self.ledger.namespace_items(pod.namespace))
        reference = fit_pod(pod, states, node_policy=self.settings.node_policy, quota=quota)
        assert reference.node_name is None, (pod.key, reference.message)
        placements["refused"] += 1
        return False

    monkeypatch.setattr(replay_module._Replay, "attempt", checked_attempt)
    return placements


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(workloads(), st.sampled_from(list(CountingRule)), st.sampled_from(["binpack", "spread"]))
def test_random_workloads_place_as_fit_pod_and_never_overbook(
    checked_placements: Counter[str], workload: Workload, rule: CountingRule, node_policy: str
) -> None:
    checked_placements.clear()
    result = replay(workload, rule, ReplaySettings(node_policy=node_policy))

    assert checked_placements["placed"] == result.placed
    outcomes = Counter(p.outcome for p in result.pods)
    assert outcomes[Outcome.PLACED] + outcomes[Outcome.PENDING] + outcomes[Outcome.REFUSED] == len(
        workload.pods
    )
    assert outcomes[Outcome.REFUSED] == sum(result.refused.values())
    for namespace in result.namespaces:
        if namespace.limit_mib is not None:
            assert namespace.peak_used_mib <= namespace.limit_mib
    if rule is not CountingRule.HAMI_V2_10:
        assert result.unreserved_mib_s == 0
    assert min(result.idle_mib) >= 0 and min(result.unreserved_mib) >= 0
