"""Who may write a pod's scheduler-owned annotations: HAMi's cases as data, with ours added.

Source: HAMi PR #3042 ("deny pods created with scheduler-owned allocation annotations",
merged 2026-09-15) and PR #3074 ("guard allocation annotations on update, not just create",
merged 2026-09-21), both in ``pkg/scheduler/webhook.go`` (``schedulerOwnedAnnotationKeys``,
``schedulerOwnedAnnotation``, ``changedSchedulerOwnedAnnotation``, ``handleUpdate``); the
attack is HAMi issue #3041's reproduction. The snapshot of HAMi this project reads stops at
2026-08-22, before either merge, so the cases are carried over from the pull requests' own
description of what they test (forged annotations refused at create also for a pod naming
another scheduler, unrelated annotations admitted, the refusal naming the annotation; on update:
forged, removed and redirected allocations refused unless a HAMi component sends them,
unrelated updates admitted). Rows marked "ours" are the keys and callers HAMi does not list.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SCHEDULER = "system:serviceaccount:kube-system:hami-scheduler"
DEVICE_PLUGIN = "system:serviceaccount:kube-system:hami-device-plugin"
OUR_SCHEDULER = "system:serviceaccount:hami-system:hami-accounting-scheduler"
TENANT = "system:serviceaccount:team-a:default"
ADMIN = "kubernetes-admin"

ISSUE_3041_ANNOTATIONS = {
    "hami.io/bind-time": "1757923200",
    "hami.io/bind-phase": "allocating",
    "hami.io/vgpu-node": "gpu-node-1",
    "hami.io/vgpu-devices-to-allocate": "GPU-node-b-0,NVIDIA,20000,100:;",
}
"""HAMi issue #3041's hand-written annotations, in its order."""


@dataclass(frozen=True)
class CreateCase:
    id: str
    annotations: dict[str, str]
    refused_for: str | None
    """The annotation the refusal names; None: allowed."""
    scheduler_name: str | None = None
    source: str = "HAMi #3042"


CREATE_CASES = (
    CreateCase("issue-3041-reproduction", ISSUE_3041_ANNOTATIONS, "hami.io/vgpu-node",
               "default-scheduler", "HAMi #3041, #3042"),
    CreateCase("forged-allocated-alone",
               {"hami.io/vgpu-devices-allocated": "GPU-node-a-0,NVIDIA,1,0:;"},
               "hami.io/vgpu-devices-allocated"),
    CreateCase("forged-to-allocate-alone",
               {"hami.io/vgpu-devices-to-allocate": "GPU-node-a-0,NVIDIA,8000,0:;"},
               "hami.io/vgpu-devices-to-allocate"),
    CreateCase("bind-phase-alone", {"hami.io/bind-phase": "success"}, "hami.io/bind-phase"),
    CreateCase("bind-time-alone", {"hami.io/bind-time": "1757923200"}, "hami.io/bind-time"),
    CreateCase("another-vendor-allocated",
               {"hami.io/cambricon-mlu-devices-allocated": "MLU-0,MLU,1,0:;"},
               "hami.io/cambricon-mlu-devices-allocated"),
    CreateCase("another-vendor-to-allocate",
               {"hami.io/Ascend910B3-devices-to-allocate": "NPU-0,Ascend910B3,1,0:;"},
               "hami.io/Ascend910B3-devices-to-allocate"),
    CreateCase("a-value-that-does-not-parse", {"hami.io/vgpu-devices-allocated": "}{"},
               "hami.io/vgpu-devices-allocated"),
    CreateCase("an-empty-value", {"hami.io/vgpu-node": ""}, "hami.io/vgpu-node"),
    CreateCase("naming-another-scheduler",
               {"hami.io/vgpu-devices-allocated": "GPU-node-a-0,NVIDIA,1,0:;"},
               "hami.io/vgpu-devices-allocated", "default-scheduler"),
    CreateCase("vgpu-time (ours)", {"hami.io/vgpu-time": "1767225600"}, "hami.io/vgpu-time",
               source="ours: our Filter writes it"),
    CreateCase("mig-allocations (ours)", {"hami.io/vgpu-mig-allocations": "[]"},
               "hami.io/vgpu-mig-allocations", source="ours: the recorder reads it"),
    CreateCase("unrelated-annotations",
               {"hami.io/node-scheduler-policy": "spread", "nvidia.com/use-gputype": "A10",
                "example.com/team": "a"}, None),
    CreateCase("no-annotations", {}, None),
    CreateCase("our-traceparent", {"hami.io/traceparent":
                                   "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
               None, source="ours: the quota check's trace, written by HAMi's webhook"),
)


@dataclass(frozen=True)
class UpdateCase:
    id: str
    old: dict[str, str]
    new: dict[str, str]
    username: str
    refused_for: str | None
    source: str = "HAMi #3074"
    writers: tuple[str, ...] = field(default=())
    """The configured writers; () means the defaults."""


_PLACED = {
    "hami.io/vgpu-node": "node-a",
    "hami.io/vgpu-devices-allocated": "GPU-node-a-0,NVIDIA,20000,0:;",
    "hami.io/vgpu-devices-to-allocate": "GPU-node-a-0,NVIDIA,20000,0:;",
    "hami.io/bind-phase": "allocating",
}
_SHRUNK = {**_PLACED, "hami.io/vgpu-devices-allocated": "GPU-node-a-0,NVIDIA,1,0:;"}
_REDIRECTED = {**_PLACED, "hami.io/vgpu-node": "node-b"}
_DROPPED = {k: v for k, v in _PLACED.items() if k != "hami.io/vgpu-devices-allocated"}
_HANDED_OUT = {**_PLACED, "hami.io/vgpu-devices-to-allocate": ";", "hami.io/bind-phase": "success"}
_LABELLED = {**_PLACED, "example.com/team": "a"}

UPDATE_CASES = (
    UpdateCase("tenant-patches-allocated-down", _PLACED, _SHRUNK, TENANT,
               "hami.io/vgpu-devices-allocated", "HAMi #3074; the 20,000 -> 1 MiB attack"),
    UpdateCase("tenant-redirects-the-node", _PLACED, _REDIRECTED, TENANT, "hami.io/vgpu-node"),
    UpdateCase("tenant-drops-the-allocation", _PLACED, _DROPPED, TENANT,
               "hami.io/vgpu-devices-allocated"),
    UpdateCase("tenant-adds-an-allocation-after-create", {}, _PLACED, TENANT,
               "hami.io/vgpu-node"),
    UpdateCase("an-admin-is-no-hami-component", _PLACED, _SHRUNK, ADMIN,
               "hami.io/vgpu-devices-allocated"),
    UpdateCase("no-user-name", _PLACED, _SHRUNK, "", "hami.io/vgpu-devices-allocated"),
    UpdateCase("hami-scheduler-places", {}, _PLACED, SCHEDULER, None),
    UpdateCase("hami-device-plugin-hands-out", _PLACED, _HANDED_OUT, DEVICE_PLUGIN, None),
    UpdateCase("our-scheduler (ours)", {}, _PLACED, OUR_SCHEDULER, None,
               "ours: the default writers name our scheduler's account"),
    UpdateCase("tenant-relabels-a-placed-pod", _PLACED, _LABELLED, TENANT, None),
    UpdateCase("tenant-updates-a-pod-without-any", {}, {"example.com/team": "a"}, TENANT, None),
    UpdateCase("configured-writer", _PLACED, _SHRUNK, "ops:repair", None,
               "ours: HAMI_ACCOUNTING_ANNOTATION_WRITERS", ("ops:repair",)),
    UpdateCase("defaults-replaced-by-the-configured-list", {}, _PLACED, SCHEDULER,
               "hami.io/vgpu-node", "ours: HAMI_ACCOUNTING_ANNOTATION_WRITERS",
               ("ops:repair",)),
)
