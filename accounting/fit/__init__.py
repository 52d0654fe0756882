"""Scheduler fit: on which node, and on which physical GPUs, a pod fits.

Layer: accounting (pure). Pure accounting rules; no I/O, no clock, no logging.

The passes follow docs/design.md §2.5 (HAMi's scoreNode after PR #2723, with the
#3052 quota misclassification fixed):

* **steady pass** — sidecars and app containers are fitted cumulatively on one copy of the
  node's device state, in declaration order (apps after every init container and sidecar, as
  Kubernetes starts them);
* **init pass** — each regular init container is fitted on the steady copy *as it stands at the
  point the container is declared*, so it is pre-charged with exactly the sidecars declared
  before it, and it does not charge that copy;
* **merge** — per device UUID and dimension, what the pod adds is max(steady, every init point),
  which equals accounting.pod.collapse_grants of the grants handed out;
* the node fails with the reason of the first container, in that order, that does not fit.

HAMi deep-copies the node for every init container. Here the steady pass keeps each device's
free capacity in three small integer lists local to one call, and an init container is checked
against those lists without changing them, so a node costs one pass over its containers whatever
the number of init containers. Only the picks are recorded per node; grants, the quota shape and
the merged usage are derived from them for the nodes that need them. After a steady container
only the cards it charged move in the device order (``_reposition``). bench/naive_fit.py keeps
the literal deep-copy version; a property test pins both to the same answers.

Device choice follows HAMi's NVIDIA Fit (docs/design.md §2.5).
A device is refused with the first reason that applies, in this order: CardNotHealth,
CardCordoned (NVIDIA: named by the node's hami.io/device-cordon, ``Device.cordoned``),
ExclusiveDeviceAllocateConflict under the mutex GPU policy (a card with a task, after its slots),
CardTypeMismatch (vendor, nvidia.com/use-gputype and nouse-gputype, nvidia.com/vgpu-mode),
CardUuidMismatch (nvidia.com/use-gpuuuid and nouse-gpuuuid), CardTimeSlicingExhausted,
ResourceQuotaNotFit (the namespace quota, checked per candidate card: ``_QuotaWalk``),
CardInsufficientMemory, CardInsufficientCore, ExclusiveDeviceAllocateConflict,
CardComputeUnitsExhausted. Devices are tried in the order of the pod's GPU policy
(``accounting.gpu_order``: binpack, spread, mutex, numa and their chains, ties by NUMA node and
index) by HAMi's device score (``device_order``), its three used fractions weighed by the pod's
hami.io/device-scoring-weights (``scoring_weights``; 1, 1, 1 without it); with
nvidia.com/numa-bind an NVIDIA container's cards come from one NUMA node (NumaNotFit).

Every vendor of the policy is placed on its own devices (docs/design.md §2.7). The loop above is
the generic path; a vendor whose table entry names a rule of its own, an NVIDIA node with a
card in MIG mode, or a pod whose GPU policy names topology-aware (on its NVIDIA cards: every
card that passes is collected, then the node's pair scores choose among them) is placed by
``accounting.vendor_fit`` instead (``vendor_fit.needs_rules`` and
``_VendorPlan.by_topology`` say which): NVIDIA's quota priced card by card there too
(``_QuotaWalk`` handed down), every vendor's checked on the complete placement.

The package, one job a module, from the top floor down (.importlinter holds the floors):

* ``kernel_plan`` — what a fast path is handed (``FitPlan``) and its node fit and answer;
  ``choose`` — ``fit_pod``, the node chosen among the candidates;
* ``node_fit`` — ``fit_node`` and ``fit_nodes``, one node at a time;
* ``node_score`` — the node's score with the pod placed (the default score plus a vendor's
  term: Kunlunxin's wings, Ascend 910's network groups);
* ``place`` — placing a pod on one node: static refusals, the generic walk, the vendor rules;
* ``refusal`` — why a container fits nowhere (HAMi's per-device count); ``grants`` — what a
  placement grants and the usage it adds;
* ``plan`` — the pod's plan, made once per pod;
* ``quota_walk`` — the quota state and its walk per card; ``node_state`` — a candidate node
  and its columns;
* ``answer`` — ``NodeFit``, ``FitResult`` and where they are written; ``device_order`` — the
  device score and orders; ``policies`` — binpack and spread; ``scoring_weights`` — the pod's
  weights of the device score.

One container's ask is ``accounting.container_ask.ContainerAsk``, beneath the fit and the
vendors' rules, which read the same value. Callers import from ``accounting.fit``; the names
below are the package's public ones.
"""

from accounting.annotations import (
    GPU_POLICY_ANNOTATION,
    NODE_POLICY_ANNOTATION,
    NOUSE_GPU_TYPE_ANNOTATION,
    NOUSE_GPU_UUID_ANNOTATION,
    USE_GPU_TYPE_ANNOTATION,
    USE_GPU_UUID_ANNOTATION,
    VGPU_MODE_ANNOTATION,
)
from accounting.container_ask import ContainerAsk
from accounting.fit.answer import FitResult, JoinedScores, NodeFit, no_device_asked
from accounting.fit.choose import fit_pod
from accounting.fit.device_order import _device_order, _reposition, device_score, weighted_score
from accounting.fit.grants import placement_usage
from accounting.fit.kernel_plan import (
    DeviceTables,
    FitPlan,
    answer_from_columns,
    fit_node_of_plan,
    fit_plan,
    fitted_answer,
)
from accounting.fit.node_fit import fit_node, fit_nodes
from accounting.fit.node_score import adds_node_term
from accounting.fit.node_state import NodeState
from accounting.fit.plan import pod_requests_devices
from accounting.fit.policies import BINPACK, POLICIES, SPREAD, node_order_key, node_policy_for
from accounting.fit.quota_walk import QuotaContext
from accounting.fit.refusal import card_capacity_refusal
from accounting.fit.scoring_weights import (
    DEFAULT_WEIGHTS,
    ScoringWeights,
    parse_scoring_weights,
    scoring_weights,
)

__all__ = [
    "BINPACK",
    "DEFAULT_WEIGHTS",
    "GPU_POLICY_ANNOTATION",
    "NODE_POLICY_ANNOTATION",
    "NOUSE_GPU_TYPE_ANNOTATION",
    "NOUSE_GPU_UUID_ANNOTATION",
    "POLICIES",
    "SPREAD",
    "USE_GPU_TYPE_ANNOTATION",
    "USE_GPU_UUID_ANNOTATION",
    "VGPU_MODE_ANNOTATION",
    "ContainerAsk",
    "DeviceTables",
    "FitPlan",
    "FitResult",
    "JoinedScores",
    "NodeFit",
    "NodeState",
    "QuotaContext",
    "ScoringWeights",
    "_device_order",
    "_reposition",
    "adds_node_term",
    "answer_from_columns",
    "card_capacity_refusal",
    "device_score",
    "fit_node",
    "fit_node_of_plan",
    "fit_nodes",
    "fit_plan",
    "fit_pod",
    "fitted_answer",
    "no_device_asked",
    "node_order_key",
    "node_policy_for",
    "parse_scoring_weights",
    "placement_usage",
    "pod_requests_devices",
    "scoring_weights",
    "weighted_score",
]
