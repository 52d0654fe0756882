"""Keeps the leader label on the pod of the Lease's holder, on a thread of its own.

Layer: services/usage (adapter). With leader election every healthy replica reports ready on
the "readiness" health service (so a PodDisruptionBudget lets a drain evict the leader: the
standby takes over), and the recorder's Service selects the label instead. The label says
"this pod holds the Lease and has listed the cluster", so only a synced leader receives calls.

* While this replica leads and is synced, its own pod carries the label, and any other pod's
  is cleared (a leader that died holding it). When it stops leading or shuts down, its label
  is cleared; at start, a label left on its pod by a run that ended without clearing it is
  cleared.
* While it stands by, it labels the holder's pod when the holder has held the Lease for
  ``HOLDER_GRACE_S`` without labelling it: a recorder of a release that does not label its
  pod, leading during a rolling update from that release, stays reachable through the Service.
  The grace leaves a holder of this release the time to list the cluster and label itself, and
  its readiness probe the time to report it not ready meanwhile (it was ready as a standby).

The label is converged, not set once: a patch that fails (the API server away, a pod not yet
visible) is tried again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from services.usage.k8s_lease import KubernetesApiError
from services.usage.k8s_pod_label import LEADER_LABEL, PodLabelClient

logger = logging.getLogger(__name__)

RETRY_S = 2.0
"""How long a failed patch waits before it is tried again."""
HOLDER_CHECK_S = 5.0
"""How often a standby checks that the holder's pod carries the label."""
HOLDER_GRACE_S = 30.0
"""How long a holder may go unlabelled before a standby labels its pod."""


class LeaderLabel:
    """The label of this replica's pod, converged to ``want(bool)``, and, while standing by,
    the holder's (``holder``: the Lease's holder identity, a pod name, or None)."""

    def __init__(
        self,
        pods: PodLabelClient,
        pod_name: str,
        *,
        holder: Callable[[], str | None] = lambda: None,
        retry_s: float = RETRY_S,
        holder_check_s: float = HOLDER_CHECK_S,
        holder_grace_s: float = HOLDER_GRACE_S,
    ) -> None:
        self._pods = pods
        self._pod = pod_name
        self._holder = holder
        self._retry_s = retry_s
        self._holder_check_s = holder_check_s
        self._holder_grace_s = holder_grace_s
        # The holder last seen, and since when (monotonic).
        self._seen_holder: tuple[str | None, float] = (None, 0.0)
        self._cond = threading.Condition()
        self._wanted = False
        self._applied: bool | None = None  # unknown until the first patch: a stale label
        self._stopping = False
        self._failures = 0
        self._thread = threading.Thread(target=self._run, name="leader-label", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def want(self, labelled: bool) -> None:
        """Asks for the label on this replica's pod (``True``: it leads and is synced) or off;
        returns at once."""
        with self._cond:
            self._wanted = labelled
            self._cond.notify_all()

    @property
    def applied(self) -> bool | None:
        """What the last successful patch of this replica's pod left (None before the
        first)."""
        with self._cond:
            return self._applied

    def stop(self, *, timeout_s: float = 5.0) -> None:
        """Takes the label off (one attempt, at most ``timeout_s``) and ends the thread."""
        with self._cond:
            self._wanted = False
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        with self._cond:
            done = self._applied is False
        if not done:
            self._apply(False)

    def _run(self) -> None:
        while True:
            with self._cond:
                changed = self._cond.wait_for(
                    lambda: self._stopping or self._wanted != self._applied,
                    timeout=None if self._wanted else self._holder_check_s,
                )
                if self._stopping:
                    return
                wanted = self._wanted
            failed = changed and wanted != self._applied and not self._apply(wanted)
            if failed:
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping, timeout=self._retry_s)
                continue
            if not wanted:
                self._label_the_holder()

    def _apply(self, labelled: bool) -> bool:
        try:
            if labelled:
                for other in self._pods.labelled(LEADER_LABEL, "true"):
                    if other != self._pod:
                        self._pods.set(other, LEADER_LABEL, None)
                        logger.info("cleared the leader label of pod %s", other)
            self._pods.set(self._pod, LEADER_LABEL, "true" if labelled else None)
        except KubernetesApiError as error:
            self._failed(f"cannot {'set' if labelled else 'clear'} the leader label of pod "
                         f"{self._pod}: {error}")
            return False
        with self._cond:
            self._applied = labelled
            self._failures = 0
        logger.info("pod %s %s the leader label", self._pod, "carries" if labelled else "dropped")
        return True

    def _label_the_holder(self) -> None:
        try:
            holder = self._holder()
            now = time.monotonic()
            if holder != self._seen_holder[0]:
                self._seen_holder = (holder, now)
            if not holder or holder == self._pod:
                return
            if now - self._seen_holder[1] < self._holder_grace_s:
                return
            if holder not in self._pods.labelled(LEADER_LABEL, "true"):
                self._pods.set(holder, LEADER_LABEL, "true")
                logger.info("labelled pod %s, the Lease's holder, as the leader", holder)
        except KubernetesApiError as error:
            self._failed(f"cannot label the Lease holder's pod: {error}")

    def _failed(self, message: str) -> None:
        with self._cond:
            self._failures += 1
            first = self._failures == 1
        (logger.warning if first else logger.debug)(message)
