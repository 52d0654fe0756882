"""HAMI_ACCOUNTING_USAGE_CACHE=watch: a local copy fed by WatchUsage, direct reads while the
stream is down, and the same decisions as direct reads.
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

from hami.accounting.v1 import admission_pb2, usage_pb2_grpc
from services.admission.__main__ import AdmissionDaemon
from services.admission.usage_source import WatchedUsageSource
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


def test_a_namespace_the_cache_has_not_seen_is_read_directly_and_kept(
    start_admission_daemon: StartAdmission, recorder: Recorder
) -> None:
    recorder.set_quota("cache-seed", mib=1)
    daemon = start_admission_daemon(usage_cache="watch")
    source = _source(daemon)
    assert source.wait_connected(10)

    with client_channel(daemon.target) as channel:
        response = checker(channel)(_pod("cache-never-seen", 100))

    assert response.allowed
    assert "cache-never-seen" in source.cached_namespaces()


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
