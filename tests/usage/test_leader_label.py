"""The leader label and the elector's contact with the Lease, on the fake API server: the label
converges to what is wanted (a stale one cleared at start, another pod's cleared when taking
it, a failed patch tried again), and a standby is in contact while it reads the Lease.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from services.usage.k8s_pod_label import LEADER_LABEL, PodLabelClient
from services.usage.leader import LeaderElector
from services.usage.leader_label import LeaderLabel
from tests.support.fake_apiserver import FakeApiServer

NAMESPACE = "hami-system"
WAIT_S = 15.0


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as fake:
        yield fake


def add_pod(server: FakeApiServer, name: str, **labels: str) -> None:
    server.add("pods", {"metadata": {"name": name, "namespace": NAMESPACE,
                                     "labels": {"app": "usage", **labels}},
                        "spec": {"containers": [{"name": "usage"}]}})


def label_of(server: FakeApiServer, name: str) -> str | None:
    pod: Any = server.get("pods", name, NAMESPACE)
    return (pod["metadata"].get("labels") or {}).get(LEADER_LABEL) if pod else None


def test_a_stale_label_is_cleared_at_start_and_another_pods_when_taking_it(
    server: FakeApiServer,
) -> None:
    add_pod(server, "usage-0", **{LEADER_LABEL: "true"})  # a previous run died holding it
    add_pod(server, "usage-1", **{LEADER_LABEL: "true"})
    label = LeaderLabel(PodLabelClient(server.kube_client(), NAMESPACE), "usage-0", retry_s=0.1)
    label.start()
    try:
        wait_until(lambda: label.applied is False, "the stale label to be cleared")
        assert label_of(server, "usage-0") is None
        assert label_of(server, "usage-1") == "true"
        label.want(True)
        wait_until(lambda: label.applied is True, "the label to be set")
        assert (label_of(server, "usage-0"), label_of(server, "usage-1")) == ("true", None)
        label.want(False)
        wait_until(lambda: label.applied is False, "the label to be cleared")
        assert label_of(server, "usage-0") is None
    finally:
        label.stop()


def test_a_failed_patch_is_tried_again_and_stop_clears_the_label(server: FakeApiServer) -> None:
    label = LeaderLabel(PodLabelClient(server.kube_client(), NAMESPACE), "usage-0", retry_s=0.1)
    label.start()
    try:
        label.want(True)
        time.sleep(0.3)
        assert label.applied is None  # no such pod yet: 404, tried again
        add_pod(server, "usage-0")
        wait_until(lambda: label.applied is True, "the label once the pod exists")
        assert label_of(server, "usage-0") == "true"
    finally:
        label.stop()
    assert label_of(server, "usage-0") is None


def test_a_standby_is_in_contact_while_it_reads_the_lease(server: FakeApiServer) -> None:
    seen: list[bool] = []
    leader = LeaderElector(server.kube_client(), NAMESPACE, "lease", "a",
                           lease_duration_s=1, renew_interval_s=0.2)
    standby = LeaderElector(server.kube_client(), NAMESPACE, "lease", "b",
                            lease_duration_s=1, renew_interval_s=0.2,
                            on_contact_changed=seen.append)
    leader.start()
    wait_until(lambda: leader.is_leader, "a to lead")
    standby.start()
    try:
        wait_until(lambda: standby.in_contact, "b to be in contact")
        assert not standby.is_leader and seen == [True]
        server.stop()  # the API server goes away: no read succeeds any more
        wait_until(lambda: not standby.in_contact, "b to lose contact", timeout_s=10)
        assert seen == [True, False]
    finally:
        standby.stop(release=False, timeout_s=2)
        leader.stop(release=False, timeout_s=2)


def test_a_standby_labels_the_holders_pod_when_the_holder_does_not(
    server: FakeApiServer,
) -> None:
    """A leader of a release that labels nothing, during a rolling update: the standby labels
    its pod once the holder has had its grace, and clears nothing of its own."""
    add_pod(server, "usage-0")  # the holder, labelling nothing
    add_pod(server, "usage-1")
    holder: list[str | None] = [None]
    label = LeaderLabel(PodLabelClient(server.kube_client(), NAMESPACE), "usage-1",
                        holder=lambda: holder[0], retry_s=0.1, holder_check_s=0.1,
                        holder_grace_s=0.5)
    label.start()
    try:
        wait_until(lambda: label.applied is False, "the standby's own label cleared")
        time.sleep(0.3)
        assert label_of(server, "usage-0") is None  # nobody known to hold the Lease
        holder[0] = "usage-0"
        time.sleep(0.2)
        assert label_of(server, "usage-0") is None  # within the grace: it may label itself
        wait_until(lambda: label_of(server, "usage-0") == "true", "the holder labelled")
        assert label_of(server, "usage-1") is None
        # It takes over: its own pod carries the label, the old holder's is cleared.
        holder[0] = "usage-1"
        label.want(True)
        wait_until(lambda: label.applied is True, "the new leader labelled")
        assert (label_of(server, "usage-0"), label_of(server, "usage-1")) == (None, "true")
    finally:
        label.stop()
