"""What each way a Filter ends answers: one ``FilterOutcome`` builder per ending.

Layer: services/scheduler (adapter). The placer (services.scheduler.placer) decides how a
Filter ends; these say it: the reason, the message the extender shows, the failed nodes and
the attempts. Nothing here reads or writes the recorder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from accounting.fit import FitResult, no_device_asked
from accounting.model import Pod
from accounting.reasons import (
    NO_GPU_REQUEST,
    NO_NODE_FITS,
    POD_FORGOTTEN,
    RESERVATION_CHANGED,
    RESERVATION_CONFLICT,
    SCHEDULED,
)
from services.scheduler import convert
from services.scheduler.convert import FilterOutcome, Reservation, StoredReservation


def pass_through(pod: Pod, policy_id: str) -> FilterOutcome:
    """The pod asks for no GPU: nothing read or reserved, every candidate kept."""
    fit = no_device_asked(pod)
    return FilterOutcome(
        fit=fit,
        reason=NO_GPU_REQUEST,
        message=f"{fit.message}; the extender keeps every candidate node",
        policy_id=policy_id,
    )


def scheduled(
    fit: FitResult,
    reservation: Reservation,
    *,
    unknown: tuple[str, ...],
    attempts: int,
    annotations: Mapping[str, str],
    policy_id: str,
) -> FilterOutcome:
    """The recorder stored the placement."""
    message = fit.message
    if unknown:
        message += f"; {len(unknown)} candidate(s) unregistered"
    return FilterOutcome(
        fit=fit,
        reason=SCHEDULED,
        message=message,
        unregistered=unknown,
        reservation=reservation,
        attempts=attempts,
        annotations=annotations,
        policy_id=policy_id,
    )


def no_node_fits(
    fit: FitResult,
    *,
    candidates: int,
    unknown: tuple[str, ...],
    dropped: Mapping[str, str],
    attempts: int,
    policy_id: str,
) -> FilterOutcome:
    """No candidate fits (``dropped``: candidates left out after a refusal, with its reason)."""
    failed = convert.failed_nodes(fit, unknown)
    if dropped:
        failed = dict(sorted({**failed, **dropped}.items()))
        fit = dataclasses.replace(fit, failed_nodes=failed)
    return FilterOutcome(
        fit=fit,
        reason=NO_NODE_FITS,
        message=convert.no_fit_message(candidates, failed),
        unregistered=unknown,
        attempts=attempts,
        policy_id=policy_id,
    )


def rival_stored(pod: Pod, now: StoredReservation) -> Reservation:
    """The refusal a Filter that read nothing stored gives itself when it finds the pod stored
    after all: another Filter for the same pod placed it meanwhile."""
    return Reservation(
        reserved=False,
        reason=RESERVATION_CHANGED,
        message=f"pod {pod.uid} was read with nothing stored and is now stored on "
        f"{now.node_name}: another Filter for the same pod placed it meanwhile, and that "
        "stands",
        stored=now.usage,
        stored_node_name=now.node_name,
    )


def lost(
    pod: Pod,
    fit: FitResult,
    refusal: Reservation,
    *,
    unknown: tuple[str, ...],
    attempts: int,
    policy_id: str,
) -> FilterOutcome:
    """This Filter reserves nothing: the pod was deleted meanwhile (PodForgotten), or another
    Filter for the same pod (on another scheduler replica) stored its placement first
    (ReservationConflict), and that placement is the one that stands."""
    if refusal.reason == POD_FORGOTTEN:
        return FilterOutcome(
            fit=fit,
            reason=POD_FORGOTTEN,
            message=f"pod {pod.key} was deleted while it was being placed: nothing reserved "
            f"({refusal.reason}: {refusal.message})",
            unregistered=unknown,
            reservation=refusal,
            attempts=attempts,
            policy_id=policy_id,
        )
    where = f" on {refusal.stored_node_name}" if refusal.stored_node_name else ""
    return FilterOutcome(
        fit=fit,
        reason=RESERVATION_CONFLICT,
        message=f"another Filter for pod {pod.key} placed it{where} at the same moment; its "
        f"placement stands and this answer reserves nothing ({refusal.message})",
        unregistered=unknown,
        reservation=refusal,
        attempts=attempts,
        policy_id=policy_id,
    )


def out_of_attempts(
    fit: FitResult,
    last_refusal: Reservation,
    *,
    node_names: Sequence[str],
    unknown: tuple[str, ...],
    dropped: Mapping[str, str],
    attempts: int,
    reserve_attempts: int,
    policy_id: str,
) -> FilterOutcome:
    """Every attempt's Reserve was refused (``attempts`` counted, of ``reserve_attempts``)."""
    if len(dropped) == len(set(node_names)):
        # Every candidate changed under this Filter: no node fits now (the extender asks
        # again later, on what the nodes are then), and no rival is to blame.
        failed = dict(sorted(dropped.items()))
        message = (
            convert.no_fit_message(len(node_names), failed)
            + f"; last refusal on {fit.node_name}: {last_refusal.message}"
        )
        return FilterOutcome(
            fit=FitResult(
                node_name=None,
                grants=(),
                failed_nodes=failed,
                scores={},
                reason=NO_NODE_FITS,
                message=message,
            ),
            reason=NO_NODE_FITS,
            message=message,
            attempts=attempts,
            policy_id=policy_id,
        )
    return FilterOutcome(
        fit=fit,
        reason=RESERVATION_CONFLICT,
        message=f"another scheduler took the capacity first {reserve_attempts} time(s) in a "
        f"row; last refusal on {fit.node_name}: {last_refusal.reason}: "
        f"{last_refusal.message}",
        unregistered=unknown,
        reservation=last_refusal,
        attempts=reserve_attempts,
        policy_id=policy_id,
    )
