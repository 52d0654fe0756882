"""Leader election between recorder replicas on a Lease served by the fake API server.

Short leases (2 s, renewed every 0.2 s) keep the tests quick; every wait is a bounded poll for
the expected state.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest

from services.usage.k8s import LeaseClient, LeaseConflictError, LeaseRecord
from services.usage.leader import LeaderElector
from tests.support.fake_apiserver import FakeApiServer

NAMESPACE = "hami-system"
LEASE = "hami-usage-recorder"
WAIT_S = 15.0


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


class Transitions:
    """Counts the callbacks of one elector."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[str] = []

    def started(self) -> None:
        with self._lock:
            self.events.append("started")

    def stopped(self) -> None:
        with self._lock:
            self.events.append("stopped")


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as fake:
        yield fake


@pytest.fixture
def elector(server: FakeApiServer) -> Iterator[Callable[[str], tuple[LeaderElector, Transitions]]]:
    started: list[LeaderElector] = []

    def make(identity: str) -> tuple[LeaderElector, Transitions]:
        transitions = Transitions()
        candidate = LeaderElector(
            server.kube_client(),
            NAMESPACE,
            LEASE,
            identity,
            lease_duration_s=2,
            renew_interval_s=0.2,
            on_started_leading=transitions.started,
            on_stopped_leading=transitions.stopped,
        )
        candidate.start()
        started.append(candidate)
        return candidate, transitions

    yield make
    for candidate in started:
        candidate.stop()


def holder(server: FakeApiServer) -> str | None:
    lease = server.get("leases", LEASE, NAMESPACE)
    return None if lease is None else lease["spec"].get("holderIdentity")


def lease_version(server: FakeApiServer) -> str | None:
    lease = server.get("leases", LEASE, NAMESPACE)
    return None if lease is None else lease["metadata"]["resourceVersion"]


def test_two_candidates_elect_exactly_one_leader(
    server: FakeApiServer, elector: Callable[[str], tuple[LeaderElector, Transitions]]
) -> None:
    a, a_events = elector("replica-a")
    b, b_events = elector("replica-b")

    wait_until(lambda: a.is_leader or b.is_leader, "a leader")
    leader, follower = (a, b) if a.is_leader else (b, a)
    assert not follower.is_leader
    assert holder(server) == leader.identity
    # Several renew rounds later the same replica still leads, and the other never did.
    first_version = lease_version(server)
    wait_until(lambda: lease_version(server) != first_version, "a renewal")
    assert leader.is_leader and not follower.is_leader
    assert holder(server) == leader.identity
    follower_events = b_events if follower is b else a_events
    assert follower_events.events == []


def test_a_stopping_leader_releases_and_the_standby_takes_over(
    server: FakeApiServer, elector: Callable[[str], tuple[LeaderElector, Transitions]]
) -> None:
    a, a_events = elector("replica-a")
    wait_until(lambda: a.is_leader, "replica-a leading")
    b, b_events = elector("replica-b")

    a.stop()

    assert not a.is_leader
    assert a_events.events == ["started", "stopped"]
    wait_until(lambda: b.is_leader, "replica-b leading")
    assert holder(server) == "replica-b"
    assert b_events.events == ["started"]
    lease = server.get("leases", LEASE, NAMESPACE)
    assert lease is not None and lease["spec"]["leaseTransitions"] >= 1


def test_an_abandoned_lease_is_taken_over_after_it_expires(
    server: FakeApiServer, elector: Callable[[str], tuple[LeaderElector, Transitions]]
) -> None:
    a, _ = elector("replica-a")
    wait_until(lambda: a.is_leader, "replica-a leading")
    b, _ = elector("replica-b")

    a.stop(release=False)  # as if the process had been killed
    assert holder(server) == "replica-a"

    wait_until(lambda: b.is_leader, "replica-b leading after the lease expired")
    assert holder(server) == "replica-b"


def test_a_leader_cut_off_from_the_api_server_stops_leading(
    server: FakeApiServer, elector: Callable[[str], tuple[LeaderElector, Transitions]]
) -> None:
    a, a_events = elector("replica-a")
    wait_until(lambda: a.is_leader, "replica-a leading")

    server.stop()

    wait_until(lambda: not a.is_leader, "replica-a no longer leading")
    wait_until(lambda: a_events.events == ["started", "stopped"], "the stopped callback")


def test_a_lease_held_by_a_live_holder_is_not_taken(server: FakeApiServer) -> None:
    leases = LeaseClient(server.kube_client())
    now = datetime.now(UTC)
    leases.create(NAMESPACE, LEASE, LeaseRecord("someone-else", 1, now, now, 0))
    renewing = threading.Event()

    def keep_renewing() -> None:
        while not renewing.is_set():
            current = leases.get(NAMESPACE, LEASE)
            assert current is not None
            with contextlib.suppress(LeaseConflictError):
                leases.replace(
                    NAMESPACE,
                    LEASE,
                    LeaseRecord(
                        "someone-else", 1, current.acquire_time, now, 0, current.resource_version
                    ),
                )
            renewing.wait(0.1)

    renewer = threading.Thread(target=keep_renewing, daemon=True)
    renewer.start()
    candidate = LeaderElector(
        server.kube_client(),
        NAMESPACE,
        LEASE,
        "replica-a",
        lease_duration_s=1,
        renew_interval_s=0.2,
    )
    candidate.start()
    try:
        # Wait for several of the candidate's attempts (each is a GET of the lease).
        wait_until(
            lambda: sum(1 for r in server.requests if r.method == "GET" and r.name == LEASE) > 15,
            "the candidate's attempts",
        )
        assert not candidate.is_leader
        assert holder(server) == "someone-else"
    finally:
        renewing.set()
        renewer.join()
        candidate.stop()


def test_lease_client_detects_stale_writes_and_writes_micro_times(server: FakeApiServer) -> None:
    leases = LeaseClient(server.kube_client())
    assert leases.get(NAMESPACE, LEASE) is None
    moment = datetime(2026, 1, 1, tzinfo=UTC)
    created = leases.create(NAMESPACE, LEASE, LeaseRecord("a", 15, moment, moment, 0))
    with pytest.raises(LeaseConflictError):
        leases.create(NAMESPACE, LEASE, LeaseRecord("b", 15, moment, moment, 0))

    renewed = leases.replace(
        NAMESPACE, LEASE, LeaseRecord("a", 15, moment, moment, 0, created.resource_version)
    )
    assert renewed.resource_version != created.resource_version
    with pytest.raises(LeaseConflictError):
        leases.replace(
            NAMESPACE, LEASE, LeaseRecord("b", 15, moment, moment, 1, created.resource_version)
        )

    stored = server.get("leases", LEASE, NAMESPACE)
    assert stored is not None and stored["spec"]["holderIdentity"] == "a"
    # kube-apiserver parses MicroTime with a mandatory six-digit fraction.
    assert re.fullmatch(r"2026-01-01T00:00:00\.\d{6}(Z|\+00:00)", stored["spec"]["renewTime"])


def test_invalid_settings_are_refused(server: FakeApiServer) -> None:
    with pytest.raises(ValueError, match="identity"):
        LeaderElector(server.kube_client(), NAMESPACE, LEASE, "")
    with pytest.raises(ValueError, match="renew_interval_s"):
        LeaderElector(
            server.kube_client(), NAMESPACE, LEASE, "a", lease_duration_s=2, renew_interval_s=2
        )
