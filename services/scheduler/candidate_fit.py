"""One pod fitted over a Filter's candidates: ``fit_over_candidates``.

Layer: services/scheduler (adapter). The cached candidates go to the vectorized fit
(services.scheduler.fit_kernel) when the pod's plan allows it, everything else to the reference
fit (``accounting.fit.fit_pod``); both give the same answer. A re-filtered pod's own
reservation does not count against it, on its node nor in its namespace. Beside the answer go
the score entries the node table encoded for the nodes the vectorized fit fitted, so the answer
(an accounting value) carries no wire bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from accounting.fit import (
    DeviceTables,
    FitPlan,
    FitResult,
    JoinedScores,
    NodeState,
    QuotaContext,
    answer_from_columns,
    fit_plan,
    fit_pod,
)
from accounting.model import Pod
from accounting.policy import AccountingPolicy
from services.scheduler import fit_kernel
from services.scheduler.convert import StoredReservation
from services.scheduler.node_cache import Candidates
from services.scheduler.node_table import Columns

# The scheduler's Filter lines keep the logger they have always had: operators and log
# pipelines select them by it (docs/observability.md shows one).
_LOG = logging.getLogger("services.scheduler.servicer")


@dataclass(frozen=True, slots=True, kw_only=True)
class CandidateFit:
    """The fit over a Filter's candidates, with what its answer is written from."""

    fit: FitResult
    score_entries: Sequence[bytes] = ()
    """The encoded score entries of the nodes the vectorized fit fitted, in the order of
    ``fit.scores``' columns part (``FilterOutcome.score_entries``)."""


def fit_over_candidates(
    pod: Pod,
    candidates: Candidates,
    *,
    policy: AccountingPolicy,
    stored: StoredReservation | None,
    node_policy: str,
    gpu_policy: str,
) -> CandidateFit:
    """The fit of ``pod`` over ``candidates`` under ``policy``, without ``stored`` (what is
    stored for the pod, when the Filter knows it) counted against it."""
    quota = candidates.quota
    others: Sequence[NodeState] = candidates.others
    if stored is not None:
        # A re-filter: the pod's own reservation does not count against it, on its node (read
        # directly, so never one of the columns) nor in its namespace (Reserve replaces it the
        # same way).
        others = [
            node.without(stored.usage) if node.node_name == stored.node_name else node
            for node in others
        ]
        quota = quota.without(stored.usage, policy.vendors)
    quota = QuotaContext(quota.items, enforce_gpu_count=policy.enforce_gpu_count)
    columns = candidates.columns
    if columns is not None:
        plan = fit_plan(
            pod,
            vendors=policy.vendors,
            node_policy=node_policy,
            gpu_policy=gpu_policy,
            quota=quota,
        )
        if plan is not None:
            try:
                fit = fit_columns(plan, columns, others)
            except fit_kernel.KernelDisagreementError:
                _LOG.exception(
                    "the vectorized fit disagrees with the reference fit for pod %s; "
                    "answering with the reference fit", pod.key,
                    extra={"pod_uid": pod.uid},
                )
            else:
                return CandidateFit(fit=fit, score_entries=_score_entries(fit, columns))
        # A pod asking several vendors' devices: the reference fit, over every node.
        others = (*columns.states.tolist(), *others)
    return CandidateFit(
        fit=fit_pod(
            pod,
            others,
            vendors=policy.vendors,
            node_policy=node_policy,
            gpu_policy=gpu_policy,
            quota=quota,
        )
    )


def tables_for(plan: FitPlan, columns: Columns) -> DeviceTables:
    """The plan's tables over the vocabularies of ``columns``: its (model, mode) pairs and its
    sets of (vendor, mode) pairs, each decided once however many devices share it."""
    return plan.device_tables(
        kinds=columns.kinds, signatures=[node.devices for node in columns.signatures]
    )


def fit_columns(
    plan: FitPlan, columns: Columns, others: Sequence[NodeState] = ()
) -> FitResult:
    """``fit_pod`` over the nodes of ``columns`` and ``others``: the same answer, computed in
    columns where it can be. The data goes one way: the plan's tables to the vectorized fit,
    its verdicts to ``answer_from_columns``, which fits the nodes the kernel leaves (and
    ``others``) with the reference fit, chooses, and gives the chosen node's grants. ``plan``
    is ``fit_plan``'s for the pod and the Filter's arguments, and must ask for at least one
    device.

    Raises:
        KernelDisagreementError: the reference fit refuses the node the kernel found best.
    """
    found = fit_kernel.verdicts(plan, tables_for(plan, columns), columns)
    answer = answer_from_columns(
        plan,
        node_count=len(columns) + len(others),
        scores=found.scores,
        best=found.best,
        failed=found.failed,
        unfitted=[*found.left, *others],
    )
    if answer is None:
        assert found.best is not None
        raise fit_kernel.KernelDisagreementError(
            f"the vectorized fit found node {found.best.node_name} fits pod and the reference "
            "fit refuses it"
        )
    return answer


def _score_entries(fit: FitResult, columns: Columns) -> list[bytes]:
    """The entries the node table encoded for the rows the vectorized fit fitted."""
    scores = fit.scores
    if isinstance(scores, JoinedScores):
        scores = scores.first
    if not isinstance(scores, fit_kernel.ColumnScores):
        return []
    entries: list[bytes] = columns.score_chunks.take(scores.rows).tolist()
    return entries
