"""Leader election between usage recorder replicas, on a coordination.k8s.io/v1 Lease.

Layer: services/usage (adapter). Only the leader serves writes; the others stand by and take
over by re-listing when the leader goes away. The algorithm is client-go's ``leaderelection``:

* a candidate takes the Lease when it does not exist, when nobody holds it, or when its record
  has not changed for ``leaseDurationSeconds`` as measured on the candidate's own monotonic
  clock (so clock skew between nodes does not matter);
* the holder renews every ``renew_interval_s``; every write is conditional on the
  resourceVersion read, so of two candidates racing for the Lease exactly one wins and the
  other sees 409 Conflict, which counts as losing;
* the holder stops calling itself leader when it has not renewed for
  ``lease_duration_s - renew_interval_s`` (client-go's renew deadline), before any other
  candidate can consider the Lease expired;
* stopping releases the Lease (clears holderIdentity) so a standby takes over at once.

Beside leadership, the elector says whether it is **in contact**: it read the Lease within
the last ``lease_duration_s``. A standby in contact can take over when the leader goes away,
so it reports ready for disruption purposes (services/usage/__main__.py).

Kubernetes API access goes through ``services.usage.k8s`` (the one module importing the client).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from services.usage.k8s import (
    ApiClient,
    KubernetesApiError,
    LeaseClient,
    LeaseConflictError,
    LeaseRecord,
)

logger = logging.getLogger(__name__)

# The duration written when releasing, as client-go does: candidates may take it at once.
_RELEASED_LEASE_DURATION_S = 1


class LeaderElector:
    """Competes for one Lease on a background thread; ``is_leader`` says whether we hold it."""

    def __init__(
        self,
        api_client: ApiClient,
        namespace: str,
        lease_name: str,
        identity: str,
        *,
        lease_duration_s: int = 15,
        renew_interval_s: float = 5.0,
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
        on_contact_changed: Callable[[bool], None] | None = None,
    ) -> None:
        """Builds a stopped elector; ``start()`` runs it.

        Args:
            api_client: the official client's ApiClient.
            namespace: namespace of the Lease.
            lease_name: name of the Lease, the same for every replica.
            identity: this replica's unique name (e.g. the pod name), written as holderIdentity.
            lease_duration_s: how long a candidate waits after the last change it saw before it
                takes the Lease over (whole seconds, the Lease's leaseDurationSeconds).
            renew_interval_s: how often the holder renews and the others retry.
            on_started_leading: called on the election thread when we become leader; it must
                return quickly (start work on other threads).
            on_stopped_leading: called on the election thread (or in ``stop()``) when we stop
                being leader, also when leadership is lost without a clean release.
            on_contact_changed: called on the election thread when ``in_contact`` changes.
        """
        if not identity:
            raise ValueError("identity must not be empty")
        if lease_duration_s < 1 or int(lease_duration_s) != lease_duration_s:
            raise ValueError("lease_duration_s must be a whole number of seconds >= 1")
        if not 0 < renew_interval_s < lease_duration_s:
            raise ValueError("renew_interval_s must be positive and shorter than lease_duration_s")
        self._namespace = namespace
        self._lease_name = lease_name
        self._identity = identity
        self._lease_duration_s = int(lease_duration_s)
        self._renew_interval_s = renew_interval_s
        self._renew_deadline_s = lease_duration_s - renew_interval_s
        self._on_started_leading = on_started_leading
        self._on_stopped_leading = on_stopped_leading
        self._on_contact_changed = on_contact_changed
        self._read_at = float("-inf")
        self._in_contact = False
        self._leases = LeaseClient(api_client, request_timeout_s=max(1.0, self._renew_deadline_s))
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._leading = False
        self._renewed_at = 0.0
        # The last Lease state seen, and when (monotonic) it was first seen in that state.
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def is_leader(self) -> bool:
        """True while we hold the Lease and renewed it within the renew deadline."""
        with self._lock:
            return self._leading and time.monotonic() - self._renewed_at < self._renew_deadline_s

    @property
    def in_contact(self) -> bool:
        """True while the last successful read of the Lease is at most ``lease_duration_s``
        old: this replica could take over."""
        with self._lock:
            return self._in_contact

    @property
    def holder(self) -> str | None:
        """The Lease's holder as last read while in contact (None: nobody, or not known)."""
        with self._lock:
            observed = self._observed if self._in_contact else None
        return (observed.holder_identity or None) if observed is not None else None

    def start(self) -> None:
        """Starts competing for the Lease on a background thread."""
        if self._thread is not None:
            raise RuntimeError("the leader elector is already started")
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"leader-election-{self._lease_name}", daemon=True
        )
        self._thread.start()

    def stop(self, *, release: bool = True, timeout_s: float = 10.0) -> None:
        """Stops competing; if we hold the Lease, releases it (unless ``release`` is False).

        ``release=False`` leaves the Lease to expire, as a crashed replica would.
        """
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        with self._lock:
            was_leading = self._leading
        if was_leading and release:
            self._release()
        self._set_leading(False)

    # -- the election loop -------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._try_acquire_or_renew()
            self._update_contact()
            self._stopping.wait(self._renew_interval_s)

    def _try_acquire_or_renew(self) -> None:
        now = datetime.now(UTC)
        try:
            current = self._leases.get(self._namespace, self._lease_name)
            with self._lock:
                self._read_at = time.monotonic()
            if current is None:
                held = self._leases.create(
                    self._namespace,
                    self._lease_name,
                    LeaseRecord(
                        holder_identity=self._identity,
                        lease_duration_s=self._lease_duration_s,
                        acquire_time=now,
                        renew_time=now,
                        lease_transitions=0,
                    ),
                )
            else:
                self._observe(current)
                holder = current.holder_identity
                if holder and holder != self._identity and not self._observed_expired():
                    self._set_leading(False)
                    return
                renewing = holder == self._identity
                acquired_at = current.acquire_time if renewing and current.acquire_time else now
                held = self._leases.replace(
                    self._namespace,
                    self._lease_name,
                    LeaseRecord(
                        holder_identity=self._identity,
                        lease_duration_s=self._lease_duration_s,
                        acquire_time=acquired_at,
                        renew_time=now,
                        lease_transitions=current.lease_transitions + (0 if renewing else 1),
                        resource_version=current.resource_version,
                    ),
                )
        except LeaseConflictError:
            # Another candidate wrote the Lease between our read and our write: it won.
            logger.info("lease %s/%s: lost a write race", self._namespace, self._lease_name)
            self._set_leading(False)
            return
        except KubernetesApiError as error:
            logger.warning("lease %s/%s: %s", self._namespace, self._lease_name, error)
            with self._lock:
                overdue = time.monotonic() - self._renewed_at >= self._renew_deadline_s
            if overdue:
                self._set_leading(False)
            return
        self._observe(held)
        with self._lock:
            self._renewed_at = time.monotonic()
        self._set_leading(True)

    def _update_contact(self) -> None:
        with self._lock:
            in_contact = time.monotonic() - self._read_at <= self._lease_duration_s
            changed = in_contact != self._in_contact
            self._in_contact = in_contact
        if changed and self._on_contact_changed is not None:
            try:
                self._on_contact_changed(in_contact)
            except Exception:
                logger.exception("leader election callback failed")

    def _observe(self, record: LeaseRecord) -> None:
        if record != self._observed:
            self._observed = record
            self._observed_at = time.monotonic()

    def _observed_expired(self) -> bool:
        observed = self._observed
        if observed is None:
            return False
        duration_s = observed.lease_duration_s or self._lease_duration_s
        return time.monotonic() - self._observed_at > duration_s

    def _release(self) -> None:
        try:
            current = self._leases.get(self._namespace, self._lease_name)
            if current is None or current.holder_identity != self._identity:
                return
            now = datetime.now(UTC)
            self._leases.replace(
                self._namespace,
                self._lease_name,
                LeaseRecord(
                    holder_identity="",
                    lease_duration_s=_RELEASED_LEASE_DURATION_S,
                    acquire_time=now,
                    renew_time=now,
                    lease_transitions=current.lease_transitions,
                    resource_version=current.resource_version,
                ),
            )
            logger.info("lease %s/%s: released", self._namespace, self._lease_name)
        except KubernetesApiError as error:
            logger.warning(
                "lease %s/%s: could not release: %s", self._namespace, self._lease_name, error
            )

    def _set_leading(self, leading: bool) -> None:
        with self._lock:
            changed = self._leading != leading
            self._leading = leading
        if not changed:
            return
        logger.info(
            "lease %s/%s: %s %s",
            self._namespace,
            self._lease_name,
            self._identity,
            "is now the leader" if leading else "is no longer the leader",
        )
        callback = self._on_started_leading if leading else self._on_stopped_leading
        if callback is not None:
            try:
                callback()
            except Exception:
                logger.exception("leader election callback failed")
