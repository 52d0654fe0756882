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

from accounting.fit import FitResult, NodeState, QuotaContext, fit_plan, fit_pod
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
                fit = fit_kernel.fit_candidates(plan, columns, others)
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


def _score_entries(fit: FitResult, columns: Columns) -> list[bytes]:
    """The entries the node table encoded for the rows the vectorized fit fitted."""
    scores = fit.scores
    if not isinstance(scores, fit_kernel.ColumnScores):
        return []
    entries: list[bytes] = columns.score_chunks.take(scores.rows).tolist()
    return entries
