"""Every annotation key the accounting reads or writes: the one place each is spelled.

Layer: accounting (pure; no imports). HAMi's keys keep HAMi's spelling byte for byte, so a pod
or node annotated by HAMi reads the same here; the wire formats of their values live in
``accounting.hami_codec``.
"""

from __future__ import annotations

# -- pod annotations written at placement (the scheduler's Filter) -----------------------------

DEVICES_ALLOCATED_ANNOTATION = "hami.io/vgpu-devices-allocated"
"""Grants per container position; written once by the scheduler, the one the accounting reads."""
DEVICES_TO_ALLOCATE_ANNOTATION = "hami.io/vgpu-devices-to-allocate"
"""Same string at first; the device plugin empties entries as it hands devices out."""
VGPU_NODE_ANNOTATION = "hami.io/vgpu-node"
"""The chosen node; HAMi tracks a pod for accounting only once it is set."""
VGPU_TIME_ANNOTATION = "hami.io/vgpu-time"
"""Unix seconds of the placement, as a decimal string."""
BIND_TIME_ANNOTATION = "hami.io/bind-time"
"""Unix seconds HAMi's Bind started, as a decimal string (its device plugin looks for it)."""
BIND_PHASE_ANNOTATION = "hami.io/bind-phase"
"""allocating, success or failed: written by HAMi's Bind, then by its device plugin."""

# -- pod annotations a user writes: placement choices ------------------------------------------

NODE_POLICY_ANNOTATION = "hami.io/node-scheduler-policy"
"""binpack or spread across nodes, for this pod."""
GPU_POLICY_ANNOTATION = "hami.io/gpu-scheduler-policy"
"""How the GPUs of a node are chosen for this pod: binpack, spread, numa, mutex or
topology-aware, or a comma-separated chain of them (accounting.gpu_order says how each orders
the cards)."""
NUMA_BIND_ANNOTATION = "nvidia.com/numa-bind"
"""true (any spelling Go's ParseBool reads as true): a container's NVIDIA cards all come from
one NUMA node."""
USE_GPU_TYPE_ANNOTATION = "nvidia.com/use-gputype"
"""Comma-separated GPU models the pod may use (substring match, any case)."""
NOUSE_GPU_TYPE_ANNOTATION = "nvidia.com/nouse-gputype"
"""Comma-separated GPU models the pod must not use."""
USE_GPU_UUID_ANNOTATION = "nvidia.com/use-gpuuuid"
"""Comma-separated device UUIDs the pod may use."""
NOUSE_GPU_UUID_ANNOTATION = "nvidia.com/nouse-gpuuuid"
"""Comma-separated device UUIDs the pod must not use."""
VGPU_MODE_ANNOTATION = "nvidia.com/vgpu-mode"
"""The sharing modes the pod accepts (hami-core, mig, mps)."""
DEVICE_SCORING_WEIGHTS_ANNOTATION = "hami.io/device-scoring-weights"
"""How much slots, cores and memory count in the device score that orders a node's devices
for this pod, as ``slot=N,core=N,memory=N`` (all three, any order; 1 each without it)."""

# -- our own ---------------------------------------------------------------------------------------

TRACEPARENT_ANNOTATION = "hami.io/traceparent"
"""The pod's W3C trace context, from the quota check onwards."""

# -- node annotations --------------------------------------------------------------------------

NODE_REGISTER_ANNOTATION = "hami.io/node-nvidia-register"
"""The JSON array of the node's NVIDIA devices, written by HAMi's device plugin."""
NODE_PAIR_SCORE_ANNOTATION = "hami.io/node-nvidia-score"
"""How well each two NVIDIA cards of the node are connected: a JSON array of
``{"uuid": <card>, "score": {<other card>: <int>}}``, written by HAMi's device plugin and read
by the ``topology-aware`` GPU policy (``accounting.pair_scores``)."""
DEVICE_CORDON_ANNOTATION = "hami.io/device-cordon"
"""The NVIDIA cards of the node no new pod may take: their UUIDs, comma-separated (each
trimmed, empty items ignored), as HAMi v2.10 reads it; pods already on them stay."""
