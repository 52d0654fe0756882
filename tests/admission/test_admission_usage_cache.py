"""HAMI_ACCOUNTING_USAGE_CACHE=watch (the default): a local copy fed by WatchUsage, direct reads
while the stream is down, read-your-writes for a check that passes a write's revision, and
denials confirmed against the recorder.
"""

from __future__ import annotations

import grpc
import pytest
from admission_support import (
    MEMORY,
    Recorder,
    StartAdmission,
    StartRecorder,
    checker,
    free_port,
    item,
    typed_request,
    wait_until,
)
from prometheus_client import REGISTRY

from accounting.model import QuotaItem
from hami.accounting.v1 import admission_pb2, usage_pb2_grpc
from services.admission.__main__ import AdmissionDaemon
from services.admission.servicer import QuotaChecker
from services.admission.usage_source import (
    MAX_REVISION_LEAD,
    WatchedUsageSource,
    should_wait_for_revision,
)
from services.common.server import client_channel
from tests.builders import PodBuilder, req


def _pod(namespace: str, mib: int) -> admission_pb2.CheckQuotaRequest:
    return typed_request(PodBuilder("p", namespace=namespace).app("a", req(1, mib=mib)).build())


def _source(daemon: AdmissionDaemon) -> WatchedUsageSource:
    source = daemon.usage
    assert isinstance(source, WatchedUsageSource)
    return source


def test_the_cache_follows_the_recorders_changes(
    start_admission_daemon: StartAdmission, recorder: Recorder
) -> None:
    recorder.set_quota("cache-a", mib=10000)
    daemon = start_admission_daemon(usage_cache="watch")
    source = _source(daemon)
    wait_until(lambda: "cache-a" in source.cached_namespaces(), "the snapshot of cache-a")

    with client_channel(daemon.target) as channel:
        check = checker(channel)
        assert check(_pod("cache-a", 6000)).allowed

        recorder.use("cache-a", 5000)
        # One event's propagation delay later the cache has the new usage.
        wait_until(lambda: not check(_pod("cache-a", 6000)).allowed,
                   "the recorded usage to reach the cache")
        response = check(_pod("cache-a", 6000))
        assert item(response, MEMORY).used == 5000

        recorder.set_quota("cache-a", mib=20000)
        wait_until(lambda: check(_pod("cache-a", 6000)).allowed,
                   "the new limit to reach the cache")


def _direct_reads() -> float:
    """GetNamespaceUsage calls answered so far by the recorders of this test process."""
    return REGISTRY.get_sample_value("hami_accounting_rpc_duration_seconds_count", {
        "service": "usage", "method": "/hami.accounting.v1.UsageRecorder/GetNamespaceUsage",
        "code": "OK"}) or 0.0


def test_a_namespace_the_cache_lacks_is_read_directly_once_and_kept(
    start_admission_daemon: StartAdmission, recorder: Recorder
) -> None:
    recorder.set_quota("cache-seed", mib=1)
    daemon = start_admission_daemon(usage_cache="watch")
    source = _source(daemon)
    wait_until(lambda: source.complete, "the end of the initial state")
    reads = _direct_reads()

    with client_channel(daemon.target) as channel:
        check = checker(channel)
        assert check(_pod("cache-never-seen", 100)).allowed
        assert check(_pod("cache-never-seen", 100)).allowed

    assert _direct_reads() == reads + 1  # the first check read it, the second the copy
    assert "cache-never-seen" in source.cached_namespaces()


def test_a_cache_of_an_empty_recorder_is_current_at_once(
    start_recorder: StartRecorder, start_admission_daemon: StartAdmission,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    empty = start_recorder(data_dir=tmp_path_factory.mktemp("empty-recorder"))
    daemon = start_admission_daemon(usage_cache="watch", usage_addr=empty.target)
    source = _source(daemon)
    # No node and no namespace: the INITIAL_STATE_COMPLETE event is the whole initial state.
    # Without it such a stream sent nothing until the first change, and every check read the
    # recorder until then.
    wait_until(lambda: source.complete, "the end of an empty initial state")
    reads = _direct_reads()

    with client_channel(daemon.target) as channel:
        check = checker(channel)
        for _ in range(3):
            assert check(_pod("cache-on-empty", 100)).allowed

    assert _direct_reads() == reads + 1


def test_reads_fall_back_to_the_recorder_while_the_stream_is_down_and_resume_after(
    start_recorder: StartRecorder, start_admission_daemon: StartAdmission,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    listen = f"127.0.0.1:{free_port()}"
    data_dir = tmp_path_factory.mktemp("cache-recorder")
    first = start_recorder(listen, data_dir)
    with client_channel(first.target) as channel:
        Recorder(first.target, usage_pb2_grpc.UsageRecorderStub(channel)).set_quota(
            "cache-b", mib=1000
        )
    daemon = start_admission_daemon(usage_cache="watch", usage_addr=first.target)
    source = _source(daemon)
    wait_until(lambda: source.live and "cache-b" in source.cached_namespaces(), "the snapshot")

    with client_channel(daemon.target) as channel:
        check = checker(channel)
        assert not check(_pod("cache-b", 2000)).allowed

        first.stop(grace_s=0)
        wait_until(lambda: not source.live, "the stream to be noticed down")
        # The cache is dropped, not served stale: the check reads directly, and fails closed.
        with pytest.raises(grpc.RpcError) as caught:
            check(_pod("cache-b", 2000))
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
        assert listen in caught.value.details()

        # The same recorder comes back (same journal): the stream reconnects with a snapshot.
        start_recorder(listen, data_dir)
        wait_until(lambda: source.live and "cache-b" in source.cached_namespaces(),
                   "the stream to come back")
        assert not check(_pod("cache-b", 2000)).allowed
        assert check(_pod("cache-b", 1000)).allowed


def test_a_check_that_passes_a_writes_revision_sees_that_write(
    start_admission_daemon: StartAdmission, recorder: Recorder
) -> None:
    recorder.set_quota("cache-ryw", mib=10**6)
    daemon = start_admission_daemon(usage_cache="watch")
    wait_until(lambda: "cache-ryw" in _source(daemon).cached_namespaces(), "the snapshot")

    with client_channel(daemon.target) as channel:
        check = checker(channel, after=recorder)
        used = 0
        # Each write is checked at once: without the revision the cache may not have it yet.
        for mib in range(100, 3100, 100):
            recorder.use("cache-ryw", mib)
            used += mib
            response = check(_pod("cache-ryw", 1))
            assert item(response, MEMORY).used == used
    assert "cache-ryw" in _source(daemon).cached_namespaces()  # answered from the copy


def test_a_revision_the_cache_never_reaches_is_read_directly(
    start_admission_daemon: StartAdmission, recorder: Recorder
) -> None:
    recorder.set_quota("cache-future", mib=5000)
    recorder.use("cache-future", 1200)
    daemon = start_admission_daemon(usage_cache="watch")
    assert _source(daemon).wait_connected(10)
    request = _pod("cache-future", 1000)
    request.min_usage_revision = recorder.revision + 10**9  # e.g. a token from another recorder

    with client_channel(daemon.target) as channel:
        response = checker(channel)(request)

    assert response.allowed
    assert item(response, MEMORY).used == 1200


def test_a_negative_revision_is_invalid_and_named(
    start_admission_daemon: StartAdmission,
) -> None:
    request = _pod("cache-bad", 1)
    request.min_usage_revision = -1
    with client_channel(start_admission_daemon().target) as channel, \
            pytest.raises(grpc.RpcError) as caught:
        checker(channel)(request)

    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "min_usage_revision" in caught.value.details()


class _StaleCopy:
    """A usage source whose copy says the namespace is full while the recorder has it empty."""

    may_be_stale = True

    def __init__(self) -> None:
        self.fresh_reads = 0

    def namespace_items(self, namespace: str, *, fresh: bool = False, min_revision: int = 0
                        ) -> dict[str, QuotaItem]:
        if fresh:
            self.fresh_reads += 1
        used = 0 if fresh else 900
        return {MEMORY: QuotaItem(MEMORY, used=used, limit=1000, limit_set=True)}

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("mib", "allowed", "fresh_reads"),
    [
        pytest.param(50, True, 0, id="a-cached-yes-is-answered-from-the-copy"),
        pytest.param(500, True, 1, id="a-cached-no-is-re-read-and-becomes-yes"),
        pytest.param(5000, False, 1, id="a-real-no-stays-no-after-the-re-read"),
    ],
)
def test_a_denial_from_the_copy_is_confirmed_against_the_recorder(
    mib: int, allowed: bool, fresh_reads: int
) -> None:
    source = _StaleCopy()
    outcome = QuotaChecker(source).check(
        PodBuilder("p", namespace="stale").app("a", req(1, mib=mib)).build()
    )

    assert outcome.decision.allowed is allowed
    assert source.fresh_reads == fresh_reads


@pytest.mark.parametrize(
    ("min_revision", "applied", "waits"),
    [
        pytest.param(0, -1, False, id="no-token-on-a-silent-stream-never-waits"),
        pytest.param(0, 10, False, id="no-token"),
        pytest.param(5, 10, False, id="already-applied"),
        pytest.param(10, 10, False, id="exactly-applied"),
        pytest.param(11, 10, True, id="one-event-away"),
        pytest.param(5, -1, True, id="nothing-applied-yet"),
        pytest.param(10 + MAX_REVISION_LEAD, 10, True, id="as-far-as-it-waits"),
        pytest.param(11 + MAX_REVISION_LEAD, 10, False, id="too-far-ahead-is-read-directly"),
    ],
)
def test_when_a_check_waits_for_the_stream(min_revision: int, applied: int, waits: bool) -> None:
    assert should_wait_for_revision(min_revision, applied) is waits
