"""What the usage store's pod writes tell an operator: the attributes of their spans, the span
named after what a record did, and the log lines of an allocation not taken as sent, of devices
overcommitted and of a Reserve for a deleted pod.

Layer: services/usage (recorder state). Called by ``services.usage.store`` after its lock is
released, each at the place of the span it describes; the lines keep the store's logger.
"""

from __future__ import annotations

import logging

from opentelemetry import trace

from accounting.believed_grants import Belief
from accounting.ledger import RecordOutcome, ReserveOutcome, ReserveReason
from accounting.lifecycle import Decision, StoredPod
from accounting.model import TRACEPARENT_ANNOTATION, Pod
from services.common import telemetry

_LOG = logging.getLogger("services.usage.store")
"""The store's logger: these lines are the store's, wherever they are written."""


def pod_traceparent(pod: Pod) -> str:
    """The pod's hami.io/traceparent annotation ("" without one)."""
    return pod.annotations.get(TRACEPARENT_ANNOTATION, "")


def stored_attributes(stored: StoredPod | None) -> dict[str, object]:
    """A span's attributes of what is stored for a pod (``tracked`` False for nothing)."""
    if stored is None:
        return {"tracked": False}
    return {
        "tracked": True,
        "stored.memory_mib": sum(u.memory_mib for u in stored.usage),
        "stored.core_percent": sum(u.core_percent for u in stored.usage),
        "stored.devices": len(stored.usage),
        "init_released": stored.init_released,
        "init_progress": stored.init_progress,
    }


def tell_recorded(span: trace.Span, pod: Pod, belief: Belief, outcome: RecordOutcome) -> None:
    """A RecordPod on its span (named usage.shrink or usage.release when it did that) and, when
    the allocation was not taken as sent or devices are overcommitted after it, in the log."""
    if belief.distrusted:
        telemetry.set_attributes(span, {"distrusted": list(belief.distrusted)})
        _LOG.warning(
            "pod %s: allocation not taken as sent", pod.key,
            extra={"pod_uid": pod.uid, "distrusted": list(belief.distrusted),
                   "decision": outcome.decision.value},
        )
    # Building the attributes costs on every call; a no-op span drops them anyway.
    if span.is_recording():
        if outcome.decision in (Decision.SHRUNK, Decision.PARTIALLY_RELEASED):
            span.update_name("usage.shrink")
        elif outcome.decision is Decision.RELEASED:
            span.update_name("usage.release")
        telemetry.set_attributes(
            span,
            {
                "decision": outcome.decision,
                "message": outcome.message,
                **stored_attributes(outcome.stored),
            },
        )
    if outcome.overcommitted:
        # An init re-run reclaimed capacity handed out meanwhile: recorded because it is
        # real, but an operator must know the devices are oversubscribed.
        telemetry.set_attributes(span, {"overcommitted": list(outcome.overcommitted)})
        _LOG.warning(
            "devices overcommitted after recording pod %s", pod.key,
            extra={"pod_uid": pod.uid, "devices": list(outcome.overcommitted),
                   "decision": outcome.decision.value},
        )


def tell_forgotten(span: trace.Span, released: StoredPod | None) -> None:
    """A ForgetPod on its span: what it released, or that the pod was not tracked."""
    if released is not None:
        telemetry.set_attributes(
            span,
            {
                telemetry.ATTR_POD_NAMESPACE: released.namespace,
                telemetry.ATTR_POD_NAME: released.name,
                "decision": "Forgotten",
                **stored_attributes(released),
            },
        )
    else:
        telemetry.set_attributes(span, {"decision": Decision.NOT_TRACKED})


def tell_reserved(span: trace.Span, outcome: ReserveOutcome) -> None:
    """A Reserve on its span: reserved (with what is stored) or refused, and why."""
    telemetry.set_attributes(
        span,
        {
            "decision": "reserved" if outcome.reserved else "refused",
            "reason": outcome.reason,
            **(stored_attributes(outcome.stored) if outcome.reserved else {}),
        },
    )


def log_refused_for_deleted(pod: Pod, outcome: ReserveOutcome) -> None:
    """The log line of a Reserve refused because the pod was deleted (after its span)."""
    if outcome.reason == ReserveReason.POD_FORGOTTEN:
        _LOG.info("refused to reserve for deleted pod %s", pod.key, extra={"pod_uid": pod.uid})
