"""The fake API server speaks the wire format the official client and kube-apiserver use.

Checked twice: at the HTTP level (status, headers, chunked events, Status objects) with
``http.client``, and through the official ``kubernetes`` client the product uses.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch

from tests.support.fake_apiserver import FakeApiServer

# The client's watch module is unannotated; the models' Optional fields are always set here.
Watch: Any = watch.Watch


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as fake:
        yield fake


def pod(name: str, namespace: str = "default", **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {"containers": [{"name": "main"}]},
    }


def raw_get(server: FakeApiServer, path: str) -> tuple[http.client.HTTPResponse, list[Any]]:
    """GETs ``path`` and returns the response and its body as JSON lines."""
    host, port = server.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("GET", path)
    response = connection.getresponse()
    lines = [json.loads(line) for line in response.read().splitlines() if line.strip()]
    connection.close()
    return response, lines


def test_objects_get_uid_and_increasing_resource_versions(server: FakeApiServer) -> None:
    first = server.add("pods", pod("a"))
    second = server.add("Pod", pod("b", "other"))
    updated = server.update("pods", {**first, "spec": {"containers": [{"name": "x"}]}})

    assert first["metadata"]["uid"] and first["metadata"]["uid"] != second["metadata"]["uid"]
    assert updated["metadata"]["uid"] == first["metadata"]["uid"]
    versions = [int(o["metadata"]["resourceVersion"]) for o in (first, second, updated)]
    assert versions == sorted(versions) and len(set(versions)) == 3
    assert first["kind"] == "Pod" and first["apiVersion"] == "v1"


def test_lists_have_the_collection_version_and_filter_by_namespace(server: FakeApiServer) -> None:
    server.add("pods", pod("a"))
    server.add("pods", pod("b", "other"))
    api: Any = client.CoreV1Api(server.kube_client())

    everything = api.list_pod_for_all_namespaces()
    in_other = api.list_namespaced_pod("other")

    assert everything.metadata.resource_version == str(server.resource_version)
    assert sorted(p.metadata.name for p in everything.items) == ["a", "b"]
    assert [p.metadata.name for p in in_other.items] == ["b"]


def test_a_watch_is_a_chunked_stream_of_json_lines_closed_at_timeout(
    server: FakeApiServer,
) -> None:
    start_version = server.resource_version

    def mutate() -> None:
        time.sleep(0.2)
        added = server.add("pods", pod("a"))
        server.update("pods", added)
        server.delete("pods", "a", "default")

    threading.Thread(target=mutate).start()
    response, events = raw_get(
        server, f"/api/v1/pods?watch=true&resourceVersion={start_version}&timeoutSeconds=1"
    )

    assert response.status == 200
    assert response.getheader("Transfer-Encoding") == "chunked"
    assert response.getheader("Content-Type") == "application/json"
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert [e["object"]["metadata"]["name"] for e in events] == ["a", "a", "a"]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and versions[0] > start_version


def test_a_watch_replays_logged_events_after_its_version(server: FakeApiServer) -> None:
    before = server.resource_version
    server.add("pods", pod("a"))
    server.add("nodes", {"metadata": {"name": "n"}})
    server.add("pods", pod("b", "other"))

    _, events = raw_get(
        server, f"/api/v1/namespaces/other/pods?watch=1&resourceVersion={before}&timeoutSeconds=1"
    )

    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "b")]


def test_a_compacted_version_gets_a_410_expired_error_event(server: FakeApiServer) -> None:
    old = server.resource_version
    server.add("pods", pod("a"))
    oldest = server.compact()

    _, events = raw_get(server, f"/api/v1/pods?watch=true&resourceVersion={old}&timeoutSeconds=5")

    assert events == [
        {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"too old resource version: {old} ({oldest})",
                "reason": "Expired",
                "code": 410,
            },
        }
    ]


def test_the_official_client_raises_410_when_a_timeout_is_given(server: FakeApiServer) -> None:
    old = server.resource_version
    server.add("pods", pod("a"))
    server.compact()
    api: Any = client.CoreV1Api(server.kube_client())

    with pytest.raises(client.ApiException) as raised:
        for _ in Watch().stream(
            api.list_pod_for_all_namespaces, resource_version=str(old), timeout_seconds=5
        ):
            pass
    assert raised.value.status == 410


def test_the_event_log_is_bounded() -> None:
    with FakeApiServer(event_log_size=2) as small:
        first = small.resource_version
        for name in ("a", "b", "c"):
            small.add("pods", pod(name))
        _, expired = raw_get(
            small, f"/api/v1/pods?watch=1&resourceVersion={first}&timeoutSeconds=1"
        )
        _, served = raw_get(
            small, f"/api/v1/pods?watch=1&resourceVersion={first + 1}&timeoutSeconds=1"
        )
    assert expired[0]["type"] == "ERROR"
    assert [e["object"]["metadata"]["name"] for e in served] == ["b", "c"]


def test_bookmarks_are_sent_only_when_allowed(server: FakeApiServer) -> None:
    api: Any = client.CoreV1Api(server.kube_client())
    start_version = str(server.resource_version)
    seen: list[tuple[str, str]] = []

    def bookmark_soon() -> None:
        while server.open_watch_count() == 0:
            time.sleep(0.01)
        server.add("nodes", {"metadata": {"name": "n"}})
        server.send_bookmarks()

    threading.Thread(target=bookmark_soon).start()
    stream = Watch()
    for event in stream.stream(
        api.list_pod_for_all_namespaces,
        resource_version=start_version,
        timeout_seconds=1,
        allow_watch_bookmarks=True,
    ):
        seen.append((event["type"], event["raw_object"]["metadata"]["resourceVersion"]))

    assert seen == [("BOOKMARK", str(server.resource_version))]
    assert stream.resource_version == str(server.resource_version)

    server.send_bookmarks()
    _, events = raw_get(
        server, f"/api/v1/pods?watch=1&resourceVersion={server.resource_version}&timeoutSeconds=1"
    )
    assert events == []


def test_suspended_watches_wait_and_see_changes_made_meanwhile(server: FakeApiServer) -> None:
    start_version = server.resource_version
    results: list[list[Any]] = []

    with server.watches_suspended():
        watcher = threading.Thread(
            target=lambda: results.append(
                raw_get(
                    server,
                    f"/api/v1/pods?watch=1&resourceVersion={start_version}&timeoutSeconds=1",
                )[1]
            )
        )
        watcher.start()
        server.add("pods", pod("a"))
        time.sleep(0.1)
        assert results == []
    watcher.join(10)

    assert [e["object"]["metadata"]["name"] for e in results[0]] == ["a"]


def test_leases_support_create_read_and_conditional_replace(server: FakeApiServer) -> None:
    api: Any = client.CoordinationV1Api(server.kube_client())
    body = client.V1Lease(
        metadata=client.V1ObjectMeta(name="leader"),
        spec=client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15),
    )

    created = api.create_namespaced_lease("ns", body)
    with pytest.raises(client.ApiException) as exists:
        api.create_namespaced_lease("ns", body)
    read = api.read_namespaced_lease("leader", "ns")
    read.spec.holder_identity = "b"
    replaced = api.replace_namespaced_lease("leader", "ns", read)
    with pytest.raises(client.ApiException) as stale:
        api.replace_namespaced_lease("leader", "ns", read)
    with pytest.raises(client.ApiException) as missing:
        api.read_namespaced_lease("nobody", "ns")

    assert created.metadata.resource_version != replaced.metadata.resource_version
    assert replaced.spec.holder_identity == "b"
    assert (exists.value.status, exists.value.reason) == (409, "Conflict")
    assert json.loads(exists.value.body or "{}")["reason"] == "AlreadyExists"
    assert json.loads(stale.value.body or "{}")["reason"] == "Conflict"
    assert missing.value.status == 404


def test_unknown_paths_are_404_status_objects(server: FakeApiServer) -> None:
    response, body = raw_get(server, "/api/v1/secrets")
    assert response.status == 404
    assert body[0]["kind"] == "Status" and body[0]["code"] == 404


def test_requests_are_recorded_for_assertions(server: FakeApiServer) -> None:
    api: Any = client.CoreV1Api(server.kube_client())
    api.list_node()
    raw_get(server, "/api/v1/nodes?watch=true&resourceVersion=1000&timeoutSeconds=1")

    assert len(server.list_requests("nodes")) == 1
    [watched] = server.watch_requests("nodes")
    assert watched.resource_version == "1000"
    assert server.list_requests("pods") == []


def test_stop_drops_keep_alive_connections() -> None:
    fake = FakeApiServer()
    fake.start()
    api: Any = client.CoreV1Api(fake.kube_client())
    api.list_node()
    fake.stop()
    with pytest.raises(Exception, match=r"(?i)connect|refused|closed|aborted|reset|max retries"):
        api.list_node(_request_timeout=2)


def _ready_pod(name: str, ready: bool, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "labels": {"app": "rec", **labels}},
        "spec": {"containers": [{"name": "main"}]},
        "status": {"conditions": [{"type": "Ready", "status": str(ready)}]},
    }


def test_pods_are_merge_patched_and_listed_by_label(server: FakeApiServer) -> None:
    api: Any = client.CoreV1Api(server.kube_client())
    server.add("pods", _ready_pod("a", True))
    server.add("pods", _ready_pod("b", True))
    api.patch_namespaced_pod("a", "ns", {"metadata": {"labels": {"leader": "true"}}})
    assert [p.metadata.name for p in api.list_namespaced_pod(
        "ns", label_selector="leader=true").items] == ["a"]
    api.patch_namespaced_pod("a", "ns", {"metadata": {"labels": {"leader": None}}})
    stored = server.get("pods", "a", "ns")
    assert stored is not None and stored["metadata"]["labels"] == {"app": "rec"}
    assert api.list_namespaced_pod("ns", label_selector="leader=true").items == []
    with pytest.raises(client.ApiException) as missing:
        api.patch_namespaced_pod("nobody", "ns", {"metadata": {"labels": {"x": "y"}}})
    assert missing.value.status == 404


@pytest.mark.parametrize(
    ("budget", "ready", "evicted", "allowed"),
    [
        ({"maxUnavailable": 1}, {"a": True, "b": False}, "a", False),
        ({"maxUnavailable": 1}, {"a": True, "b": False}, "b", True),
        ({"maxUnavailable": 1}, {"a": True, "b": True}, "a", True),
        ({"maxUnavailable": 0}, {"a": True, "b": True}, "a", False),
        ({"minAvailable": 1}, {"a": True, "b": True}, "b", True),
        ({"minAvailable": 2}, {"a": True, "b": False}, "b", False),
        ({"minAvailable": 2, "unhealthyPodEvictionPolicy": "AlwaysAllow"},
         {"a": True, "b": False}, "b", True),
    ],
    ids=["the only ready pod", "an unready pod within budget", "one of two ready",
         "no disruption allowed", "min available kept", "unready below budget",
         "unready, always allowed"],
)
def test_eviction_follows_the_disruption_budget(
    server: FakeApiServer, budget: dict[str, Any], ready: dict[str, bool], evicted: str,
    allowed: bool,
) -> None:
    api: Any = client.CoreV1Api(server.kube_client())
    for name, is_ready in ready.items():
        server.add("pods", _ready_pod(name, is_ready))
    server.add("poddisruptionbudgets", {
        "metadata": {"name": "rec", "namespace": "ns"},
        "spec": {"selector": {"matchLabels": {"app": "rec"}}, **budget},
    })
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=evicted, namespace="ns"))
    if allowed:
        api.create_namespaced_pod_eviction(evicted, "ns", eviction)
        stored = server.get("pods", evicted, "ns")
        assert stored is not None and stored["metadata"]["deletionTimestamp"]
    else:
        with pytest.raises(client.ApiException) as refused:
            api.create_namespaced_pod_eviction(evicted, "ns", eviction)
        assert refused.value.status == 429
        stored = server.get("pods", evicted, "ns")
        assert stored is not None and "deletionTimestamp" not in stored["metadata"]


def test_a_pod_being_deleted_is_not_healthy_and_expected_pods_come_from_the_status(
    server: FakeApiServer,
) -> None:
    api: Any = client.CoreV1Api(server.kube_client())
    server.add("pods", _ready_pod("a", True))
    server.add("pods", _ready_pod("b", True))
    server.add("poddisruptionbudgets", {
        "metadata": {"name": "rec", "namespace": "ns"},
        "spec": {"selector": {"matchLabels": {"app": "rec"}}, "maxUnavailable": 1},
        "status": {"expectedPods": 2},
    })

    def evict(name: str) -> None:
        api.create_namespaced_pod_eviction(
            name, "ns", client.V1Eviction(metadata=client.V1ObjectMeta(name=name)))

    evict("a")
    with pytest.raises(client.ApiException) as refused:
        evict("b")  # a is going: b is the one healthy pod left
    assert refused.value.status == 429
    server.delete("pods", "a", "ns")
    with pytest.raises(client.ApiException) as still:
        evict("b")  # two expected, one there: still no disruption allowed
    assert still.value.status == 429
