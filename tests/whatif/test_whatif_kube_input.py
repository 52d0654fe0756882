"""A what-if workload from Kubernetes objects: what is read, what is skipped and counted, the
timing taken from statuses, and malformed objects named in the error."""

from __future__ import annotations

from typing import Any

import pytest

from accounting.annotations import NODE_REGISTER_ANNOTATION
from accounting.errors import InvalidInputError
from accounting.hami_codec import encode_node_register
from tests.builders import device
from whatif.kube_input import (
    DEFAULT_WINDOW_S,
    SKIPPED_AFTER_WINDOW,
    SKIPPED_GPU_LESS_NODE,
    SKIPPED_GPU_LESS_POD,
    SKIPPED_GPU_LESS_QUOTA,
    SKIPPED_NO_KIND,
    SourcedObject,
    read_workload,
)
from whatif.workload import DEFAULT_INIT_RUN_S

Json = dict[str, Any]


def gpu_node(name: str = "node-1") -> Json:
    register = encode_node_register([device(f"{name}-gpu0")])
    return {
        "kind": "Node",
        "metadata": {"name": name, "annotations": {NODE_REGISTER_ANNOTATION: register}},
    }


def container(name: str, mib: int | None, **extra: Any) -> Json:
    limits = {} if mib is None else {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mib)}
    return {"name": name, "resources": {"limits": limits}, **extra}


def pod(
    name: str,
    *,
    created: str | None = "2025-01-06T09:00:00Z",
    init: list[Json] | None = None,
    apps: list[Json] | None = None,
    status: Json | None = None,
    deleted: str | None = None,
) -> Json:
    metadata: Json = {"name": name, "namespace": "team-a", "uid": f"uid-{name}"}
    if created:
        metadata["creationTimestamp"] = created
    if deleted:
        metadata["deletionTimestamp"] = deleted
    return {
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "initContainers": init or [],
            "containers": apps if apps is not None else [container("app", 4096)],
        },
        "status": status or {},
    }


def kubectl_list(*items: Json) -> SourcedObject:
    return SourcedObject("cluster.json", {"apiVersion": "v1", "kind": "List", "items": list(items)})


def test_a_kubectl_list_is_read_and_what_is_not_replayed_is_counted() -> None:
    workload = read_workload(
        [
            kubectl_list(
                gpu_node(),
                {"kind": "Node", "metadata": {"name": "cpu-node"}},
                pod("trainer"),
                pod("web", apps=[container("nginx", None)]),
                {"kind": "Service", "metadata": {"name": "api"}},
                {"kind": "ResourceQuota", "metadata": {"name": "cpu"}, "spec": {"hard": {}}},
                {"metadata": {"name": "kindless"}},
            )
        ]
    )

    assert [p.pod.key for p in workload.pods] == ["team-a/trainer"]
    assert [n.node_name for n in workload.nodes] == ["node-1"]
    assert dict(workload.skipped) == {
        SKIPPED_GPU_LESS_NODE: 1,
        SKIPPED_GPU_LESS_POD: 1,
        "Service": 1,
        SKIPPED_GPU_LESS_QUOTA: 1,
        SKIPPED_NO_KIND: 1,
    }


def test_an_input_without_gpu_pods_is_an_empty_workload_not_an_error() -> None:
    workload = read_workload([kubectl_list(pod("web", apps=[container("nginx", None)]))])

    assert workload.pods == () and workload.nodes == ()
    assert dict(workload.skipped) == {SKIPPED_GPU_LESS_POD: 1}


def test_timing_comes_from_timestamps_and_statuses() -> None:
    first = pod(
        "first",
        created="2025-01-06T09:00:00Z",
        init=[container("download", 8192), container("warmup", 4096)],
        status={
            "phase": "Running",
            "initContainerStatuses": [
                {
                    "name": "download",
                    "state": {
                        "terminated": {
                            "exitCode": 0,
                            "startedAt": "2025-01-06T09:00:05Z",
                            "finishedAt": "2025-01-06T09:02:05Z",
                        }
                    },
                },
                {"name": "warmup", "state": {"running": {"startedAt": "2025-01-06T09:02:06Z"}}},
            ],
        },
    )
    second = pod(
        "second",
        created="2025-01-06T09:10:00Z",
        status={
            "containerStatuses": [
                {"name": "app", "state": {"running": {"startedAt": "2025-01-06T09:10:30Z"}}}
            ]
        },
        deleted="2025-01-06T10:10:30Z",
    )
    workload = read_workload([kubectl_list(second, first)])

    by_name = {p.pod.name: p for p in workload.pods}
    assert [p.pod.name for p in workload.pods] == ["first", "second"]  # in creation order
    assert by_name["first"].arrival_s == 0
    # download ran 120 s; warmup has no finished run recorded: the default.
    assert by_name["first"].init_run_s == (120, DEFAULT_INIT_RUN_S)
    assert by_name["first"].app_run_s is None  # runs until the window ends
    assert by_name["second"].arrival_s == 600
    assert by_name["second"].app_run_s == 3600
    # The window ends at the latest timestamp in the input (the deletion).
    assert workload.window_s == 3600 + 630


def test_a_succeeded_pod_ends_at_its_last_finished_container() -> None:
    done = pod(
        "job",
        status={
            "phase": "Succeeded",
            "containerStatuses": [
                {
                    "name": "app",
                    "state": {
                        "terminated": {
                            "exitCode": 0,
                            "startedAt": "2025-01-06T09:00:10Z",
                            "finishedAt": "2025-01-06T09:05:10Z",
                        }
                    },
                }
            ],
        },
    )
    (replayed,) = read_workload([kubectl_list(done)]).pods

    assert replayed.app_run_s == 300
    # What the input says about where it ran and how it ended is the replay's to decide.
    assert replayed.pod.node_name == "" and replayed.pod.container_statuses == ()


def test_hand_written_manifests_without_timestamps_or_uids_arrive_at_the_start() -> None:
    manifests = [pod(f"p{i}", created=None) for i in range(3)]
    for manifest in manifests:
        del manifest["metadata"]["uid"]
    workload = read_workload(
        SourcedObject(f"pods/p{i}.yaml[0]", m) for i, m in enumerate(manifests)
    )

    assert [(p.pod.name, p.arrival_s) for p in workload.pods] == [("p0", 0), ("p1", 0), ("p2", 0)]
    assert [p.pod.uid for p in workload.pods] == ["team-a/p0", "team-a/p1", "team-a/p2"]
    assert workload.window_s == DEFAULT_WINDOW_S
    assert read_workload([SourcedObject("x", manifests[0])], window_s=90).window_s == 90


def test_resource_quotas_give_limits_and_the_tightest_one_binds() -> None:
    def quota(name: str, memory: str) -> Json:
        return {
            "kind": "ResourceQuota",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": memory, "pods": "10"}},
        }

    workload = read_workload([kubectl_list(quota("wide", "48Ki"), quota("tight", "24576"))])

    assert {ns: dict(limits) for ns, limits in workload.quotas.items()} == {
        "team-a": {"nvidia.com/gpumem": 24576}
    }


@pytest.mark.parametrize(
    ("items", "named", "field"),
    [
        (
            [
                pod("ok"),
                pod(
                    "bad",
                    apps=[
                        container(
                            "app",
                            None,
                            resources={
                                "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "lots"}
                            },
                        )
                    ],
                ),
            ],
            "cluster.json items[1] (Pod team-a/bad)",
            'spec.containers[0].resources.limits["nvidia.com/gpumem"]',
        ),
        (
            [
                {
                    "kind": "Node",
                    "metadata": {
                        "name": "n1",
                        "annotations": {NODE_REGISTER_ANNOTATION: "[{not json"},
                    },
                }
            ],
            "cluster.json items[0] (Node n1)",
            'metadata.annotations["hami.io/node-nvidia-register"]',
        ),
        (
            [pod("late", created="yesterday")],
            "cluster.json items[0] (Pod team-a/late)",
            "metadata.creationTimestamp",
        ),
        (
            [
                {
                    "kind": "ResourceQuota",
                    "metadata": {"name": "gpu", "namespace": "team-a"},
                    "spec": {"hard": {"limits.nvidia.com/gpumem": "1.5"}},
                }
            ],
            "cluster.json items[0] (ResourceQuota team-a/gpu)",
            "spec.hard['limits.nvidia.com/gpumem']: must be a whole number from 0 to "
            "1000000000000, got 1.5",
        ),
        (
            [
                {
                    "kind": "ResourceQuota",
                    "metadata": {"name": "huge", "namespace": "team-a"},
                    "spec": {"hard": {"limits.nvidia.com/gpucores": "1e15"}},
                }
            ],
            "cluster.json items[0] (ResourceQuota team-a/huge)",
            "spec.hard['limits.nvidia.com/gpucores']: must be a whole number from 0 to",
        ),
        (
            ["not an object"],
            "cluster.json items[0]",
            "",
        ),
        (
            [{**pod("weighed"), "metadata": {
                **pod("weighed")["metadata"],
                "annotations": {"hami.io/device-scoring-weights": "slot=1,core=-1,memory=3"},
            }}],
            "cluster.json items[0] (Pod team-a/weighed)",
            'metadata.annotations["hami.io/device-scoring-weights"]: "core" weight must not be '
            "negative",
        ),
    ],
    ids=[
        "a pod with a GPU memory quantity that is not one",
        "a node whose HAMi register annotation is not JSON",
        "a pod whose creationTimestamp is not a timestamp",
        "a ResourceQuota with a GPU limit that is not a whole number",
        "a ResourceQuota with a GPU limit beyond what the recorder stores",
        "a list item that is not an object",
        "a GPU pod whose device scoring weights the scheduler refuses",
    ],
)
def test_a_malformed_object_is_an_error_naming_it_and_the_field(
    items: list[Any], named: str, field: str
) -> None:
    with pytest.raises(InvalidInputError) as raised:
        read_workload([SourcedObject("cluster.json", {"kind": "List", "items": items})])

    message = str(raised.value)
    assert message.startswith(named), message
    assert field in message


def test_the_same_pod_twice_is_an_error_naming_both_places() -> None:
    with pytest.raises(InvalidInputError, match=r"a\.yaml\[0\].*appears twice, also .*b\.yaml"):
        read_workload(
            [SourcedObject("b.yaml[0]", pod("twin")), SourcedObject("a.yaml[0]", pod("twin"))]
        )


def test_the_api_servers_typed_lists_give_their_items_a_kind() -> None:
    pod_list = {"kind": "PodList", "apiVersion": "v1", "items": [pod("a"), pod("b")]}
    node_list = {"kind": "NodeList", "items": [gpu_node()]}
    for item in (*pod_list["items"], *node_list["items"]):
        del item["kind"]

    workload = read_workload([SourcedObject("pods.json", pod_list), SourcedObject("n", node_list)])

    assert [p.pod.name for p in workload.pods] == ["a", "b"]
    assert [n.node_name for n in workload.nodes] == ["node-1"]
    assert dict(workload.skipped) == {}


def test_pods_created_after_a_given_window_are_skipped_and_counted() -> None:
    early = pod("early", created="2025-01-06T09:00:00Z")
    late = pod("late", created="2025-01-06T10:00:00Z")

    workload = read_workload([kubectl_list(early, late)], window_s=600)

    assert [p.pod.name for p in workload.pods] == ["early"]
    assert dict(workload.skipped) == {SKIPPED_AFTER_WINDOW: 1}
