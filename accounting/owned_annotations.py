"""The pod annotations only the scheduler and the device plugins write, and the verdict on a pod
created or changed with them.

Layer: accounting (pure). HAMi's device plugin hands out the devices, memory and cores these
annotations name, and its scheduler and our recorder take them for a placement that was decided:
a pod that writes its own takes devices nobody accounted for. HAMi's webhook therefore refuses
a pod created with any of them (HAMi #3042) and an update that adds, rewrites or drops one unless
a HAMi component sends it (HAMi #3074); this module is that rule, with the key list HAMi's
``schedulerOwnedAnnotationKeys`` builds (the node, bind time and bind phase, every vendor's
to-allocate and allocated keys) and the two more keys our Filter writes and our recorder reads
(``hami.io/vgpu-time`` and the MIG allocations). docs/security.md, "Who may write what".

Who counts as a HAMi component is the admission daemon's configuration (the user names of the
service accounts allowed): HAMi asks the API server whether the caller may write nodes, which a
daemon without RBAC cannot; a list says the same and is checked without a call.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from accounting import reasons, vendors
from accounting.annotations import (
    BIND_PHASE_ANNOTATION,
    BIND_TIME_ANNOTATION,
    VGPU_NODE_ANNOTATION,
    VGPU_TIME_ANNOTATION,
)
from accounting.mig import MIG_ALLOCATIONS_ANNOTATION
from accounting.quoting import quote

FIXED_OWNED_ANNOTATIONS = (
    VGPU_NODE_ANNOTATION,
    BIND_TIME_ANNOTATION,
    BIND_PHASE_ANNOTATION,
    VGPU_TIME_ANNOTATION,
    MIG_ALLOCATIONS_ANNOTATION,
)
"""The keys every placement writes, whatever the vendor: HAMi's three (``AssignedNodeAnnotations``,
``BindTimeAnnotations``, ``DeviceBindPhase``), then ours."""

DEFAULT_ANNOTATION_WRITERS = (
    "system:serviceaccount:kube-system:hami-scheduler",
    "system:serviceaccount:kube-system:hami-device-plugin",
    "system:serviceaccount:hami-system:hami-accounting-scheduler",
)
"""Who may change the keys on an existing pod unless configured otherwise: HAMi's scheduler,
which writes them at Filter and Bind, and its NVIDIA device plugin, which rewrites the bind
phase and the to-allocate entries as it hands devices out (both as HAMi's chart names them,
installed as ``hami`` in ``kube-system``), and our scheduler daemon's account."""


def scheduler_owned_annotations() -> tuple[str, ...]:
    """Every scheduler-owned key: the fixed ones, then each vendor's allocated and to-allocate
    keys in the vendor table's order (entries ``vendors.register`` added included)."""
    return _owned(vendors.known())


@functools.lru_cache(maxsize=8)
def _owned(keywords: tuple[str, ...]) -> tuple[str, ...]:
    keys = dict.fromkeys(FIXED_OWNED_ANNOTATIONS)
    for keyword in keywords:
        spec = vendors.find(keyword)
        if spec is not None:
            keys.update(dict.fromkeys(spec.annotation_keys))
    return tuple(keys)


@dataclass(frozen=True, slots=True)
class AnnotationVerdict:
    """Whether a pod's scheduler-owned annotations may be as they are, and why not."""

    allowed: bool
    reason: str = ""
    """``SchedulerOwnedAnnotation`` when refused."""
    message: str = ""
    annotation: str = ""
    """The first key that decided a refusal."""


ALLOWED = AnnotationVerdict(True)


def first_owned_annotation(annotations: Mapping[str, str]) -> str | None:
    """The first scheduler-owned key ``annotations`` carries (in ``scheduler_owned_annotations``
    order), or None."""
    if not annotations:
        return None
    return next((key for key in scheduler_owned_annotations() if key in annotations), None)


def first_changed_owned_annotation(
    old: Mapping[str, str], new: Mapping[str, str]
) -> str | None:
    """The first scheduler-owned key an update adds, rewrites or drops, or None."""
    if not old and not new:
        return None
    return next(
        (key for key in scheduler_owned_annotations() if old.get(key) != new.get(key)), None
    )


def on_create(annotations: Mapping[str, str]) -> AnnotationVerdict:
    """A pod being created may carry none of the keys: it did not get them from a scheduler."""
    key = first_owned_annotation(annotations)
    if key is None:
        return ALLOWED
    return AnnotationVerdict(
        False,
        reasons.SCHEDULER_OWNED_ANNOTATION,
        f"annotation {key} is written by the scheduler and cannot be set when creating a pod",
        key,
    )


def on_update(
    old: Mapping[str, str],
    new: Mapping[str, str],
    username: str,
    writers: Collection[str],
) -> AnnotationVerdict:
    """An update may add, rewrite or drop a key only when ``username`` (the AdmissionReview's
    ``request.userInfo.username``) is one of ``writers``; any other update passes."""
    key = first_changed_owned_annotation(old, new)
    if key is None or username in writers:
        return ALLOWED
    who = quote(username) if username else "a caller without a user name"
    return AnnotationVerdict(
        False,
        reasons.SCHEDULER_OWNED_ANNOTATION,
        f"annotation {key} is written by the scheduler and cannot be set by {who}",
        key,
    )
