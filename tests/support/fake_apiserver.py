"""A fake kube-apiserver for tests, speaking the real wire format over HTTP/1.1.

Layer: test support; standard library only on the server side (the official client appears only
in ``kube_client()``). It serves list, get, create, replace, merge patch (its ``metadata.uid`` a
precondition, as kube-apiserver takes it), delete and watch for core/v1 pods, nodes and
resourcequotas, coordination.k8s.io/v1 leases and policy/v1 poddisruptionbudgets, a list's
equality ``labelSelector``, a pod's ``binding`` subresource (sets ``spec.nodeName`` once, as a
scheduler's Bind does) and its ``eviction`` subresource with the PodDisruptionBudget arithmetic
(below), with one resourceVersion counter shared by every kind (as etcd has), a bounded event
log, and the failure modes a watcher must survive: ``410 Expired`` for a resourceVersion older
than the log, ``409 Conflict`` for a stale update, and BOOKMARK events. Watch streams are
``Transfer-Encoding: chunked``, one JSON event per
line, closed at ``timeoutSeconds`` with the zero-length chunk, as kube-apiserver does.

Test API: ``add/update/delete/get`` mutate the store as a controller would; ``compact()``
forgets the event log so that older watches get 410; ``suspend_watches()`` parks new watch
requests (and ends open ones) so changes can happen "while the watcher is disconnected";
``send_bookmarks()`` makes every bookmark-enabled watch emit the current resourceVersion;
``send_raw_watch_line()`` streams a line as is (a damaged event no real server sends);
``patch()`` merge-patches one part of an object atomically (a kubelet's status);
``requests`` records every request for assertions.

Eviction (``POST .../pods/NAME/eviction``) decides as kube-apiserver does with the budget's
status computed at that moment, the disruption controller's part done inline: a pod is healthy
when its ``Ready`` condition is ``True`` and it is not being deleted; expected pods are the
budget's ``status.expectedPods`` when a test sets it (the controller reads it from the
workload's replicas), else the pods it selects; desired healthy is ``minAvailable`` or expected
minus ``maxUnavailable`` (integers). A healthy pod may go while healthy pods exceed desired; an
unhealthy one while they reach it (``unhealthyPodEvictionPolicy: IfHealthyBudget``, the
default; ``AlwaysAllow`` always). Refused: ``429 TooManyRequests``; two budgets: 500. Allowed:
the pod gets a ``deletionTimestamp`` (graceful deletion: the test plays the kubelet, stops the
pod's process and ``delete``s it) and the answer is 201.
"""

from __future__ import annotations

import copy
import json
import re
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

if TYPE_CHECKING:
    from kubernetes.client import ApiClient


@dataclass(frozen=True, slots=True)
class _Resource:
    """One served resource type."""

    plural: str
    kind: str
    api_version: str
    prefix: str
    namespaced: bool


_RESOURCES: dict[str, _Resource] = {
    r.plural: r
    for r in (
        _Resource("pods", "Pod", "v1", "/api/v1", namespaced=True),
        _Resource("nodes", "Node", "v1", "/api/v1", namespaced=False),
        _Resource("resourcequotas", "ResourceQuota", "v1", "/api/v1", namespaced=True),
        _Resource(
            "leases",
            "Lease",
            "coordination.k8s.io/v1",
            "/apis/coordination.k8s.io/v1",
            namespaced=True,
        ),
        _Resource(
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            "policy/v1",
            "/apis/policy/v1",
            namespaced=True,
        ),
    )
}

_PATH = re.compile(
    r"^(?P<prefix>/api/v1|/apis/coordination\.k8s\.io/v1|/apis/policy/v1)"
    r"(?:/namespaces/(?P<namespace>[^/]+))?"
    r"/(?P<plural>[a-z]+)(?:/(?P<name>[^/]+)(?:/(?P<subresource>[a-z]+))?)?/?$"
)

# The first resourceVersion handed out; a realistic non-zero start catches "0" mix-ups.
_FIRST_RESOURCE_VERSION = 1000
# Longest a watch stays open when the client does not pass timeoutSeconds.
_DEFAULT_WATCH_TIMEOUT_S = 1800


def _resource_for(kind: str) -> _Resource:
    """Accepts a plural ("pods"), a singular ("pod") or a Kind ("Pod")."""
    key = kind.lower()
    if key in _RESOURCES:
        return _RESOURCES[key]
    for resource in _RESOURCES.values():
        if resource.kind.lower() == key:
            return resource
    raise KeyError(f"the fake apiserver does not serve {kind!r}")


def _now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class ApiError(Exception):
    """A request the fake refuses, carrying the Status object to send."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = _status(code, reason, message)


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request the fake received, for assertions."""

    method: str
    path: str
    query: Mapping[str, str]
    plural: str
    namespace: str | None
    name: str | None

    @property
    def is_watch(self) -> bool:
        return self.query.get("watch") in ("true", "1")

    @property
    def resource_version(self) -> str | None:
        return self.query.get("resourceVersion")


@dataclass(frozen=True, slots=True)
class _Event:
    resource_version: int
    plural: str
    namespace: str
    event_type: str
    obj: dict[str, Any]
    raw: bytes | None = None
    """Sent instead of the event's JSON when set (``send_raw_watch_line``)."""


@dataclass(eq=False, slots=True)
class _WatchState:
    """What an open watch is waiting for, shared with the mutating threads."""

    bookmark_requested: bool = False
    ended: bool = False
    sent_through: int = 0


class FakeApiServer:
    """A kube-apiserver stand-in on 127.0.0.1 with a random port; use as a context manager."""

    def __init__(self, *, event_log_size: int = 1000) -> None:
        self._cond = threading.Condition()
        self._objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {
            plural: {} for plural in _RESOURCES
        }
        self._resource_version = _FIRST_RESOURCE_VERSION
        self._events: deque[_Event] = deque()
        self._event_log_size = event_log_size
        # A watch from resourceVersion R is served iff R >= this: every event after it is logged.
        self._oldest_watchable = _FIRST_RESOURCE_VERSION
        self._watches: list[_WatchState] = []
        self._watches_suspended = False
        self._closing = False
        self._requests: list[RecordedRequest] = []
        self._connections: set[socket.socket] = set()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> FakeApiServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-apiserver",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stops serving and drops every open connection, keep-alive ones included."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            connections = list(self._connections)
        self._server.shutdown()
        self._server.server_close()
        for connection in connections:
            with suppress(OSError):  # already closed by the client
                connection.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def kube_client(self) -> ApiClient:
        """An official-client ApiClient pointed at this server (plain HTTP, no auth)."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        return client.ApiClient(configuration)

    # -- test API: the store -----------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion handed out."""
        with self._cond:
            return self._resource_version

    def add(self, kind: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Creates an object (ADDED); returns the stored copy with uid and resourceVersion."""
        resource = _resource_for(kind)
        with self._cond:
            return self._create(resource, _namespace_of(resource, obj), obj)

    def update(self, kind: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Replaces an object unconditionally (MODIFIED); uid is kept."""
        resource = _resource_for(kind)
        body = copy.deepcopy(dict(obj))
        body.setdefault("metadata", {}).pop("resourceVersion", None)
        with self._cond:
            return self._replace(resource, _namespace_of(resource, obj), _name_of(obj), body)

    def patch(
        self, kind: str, name: str, patch: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """Merge-patches an object (MODIFIED) atomically, as a controller writing one part of
        it (a pod's status) does beside others writing other parts (its labels)."""
        resource = _resource_for(kind)
        with self._cond:
            return self._patch(resource, _scoped(resource, namespace), name, patch)

    def delete(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        """Deletes an object (DELETED) and returns its last state."""
        resource = _resource_for(kind)
        with self._cond:
            return self._delete(resource, _scoped(resource, namespace), name)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        resource = _resource_for(kind)
        with self._cond:
            found = self._objects[resource.plural].get((_scoped(resource, namespace), name))
            return copy.deepcopy(found) if found is not None else None

    # -- test API: watch control -------------------------------------------------------------

    def compact(self) -> int:
        """Forgets the event log: a watch from any older resourceVersion now gets 410 Expired.

        Returns the oldest resourceVersion still watchable (the current one).
        """
        with self._cond:
            self._events.clear()
            self._oldest_watchable = self._resource_version
            return self._oldest_watchable

    def send_bookmarks(self) -> None:
        """Makes each open watch that allowed bookmarks send one with the current version."""
        with self._cond:
            for watch in self._watches:
                watch.bookmark_requested = True
            self._cond.notify_all()

    def send_raw_watch_line(self, kind: str, line: bytes, namespace: str = "") -> int:
        """Streams ``line`` (anything, JSON or not) to the watches of ``kind`` as the next
        event, at a new resourceVersion it returns; a watch resumed from before it gets it
        again. No object changes: a list does not show it."""
        resource = _resource_for(kind)
        with self._cond:
            rv = self._next_resource_version()
            self._events.append(_Event(rv, resource.plural, namespace, "RAW", {}, raw=line))
            self._cond.notify_all()
            return rv

    def suspend_watches(self) -> None:
        """Ends every open watch and parks new watch requests until resume_watches()."""
        with self._cond:
            self._watches_suspended = True
            for watch in self._watches:
                watch.ended = True
            self._cond.notify_all()

    def resume_watches(self) -> None:
        with self._cond:
            self._watches_suspended = False
            self._cond.notify_all()

    @contextmanager
    def watches_suspended(self) -> Iterator[None]:
        """Changes made inside the block happen while no watcher is connected."""
        self.suspend_watches()
        try:
            yield
        finally:
            self.resume_watches()

    def open_watch_count(self) -> int:
        with self._cond:
            return len(self._watches)

    # -- test API: request log ---------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._cond:
            return list(self._requests)

    def list_requests(self, kind: str) -> list[RecordedRequest]:
        """GETs of a collection that were not watches."""
        plural = _resource_for(kind).plural
        return [
            r
            for r in self.requests
            if r.method == "GET" and r.plural == plural and r.name is None and not r.is_watch
        ]

    def watch_requests(self, kind: str) -> list[RecordedRequest]:
        plural = _resource_for(kind).plural
        return [r for r in self.requests if r.plural == plural and r.is_watch]

    # -- store internals (callers hold self._cond) -------------------------------------------

    def _next_resource_version(self) -> int:
        self._resource_version += 1
        return self._resource_version

    def _emit(
        self, resource: _Resource, namespace: str, event_type: str, obj: dict[str, Any]
    ) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        self._events.append(_Event(rv, resource.plural, namespace, event_type, copy.deepcopy(obj)))
        while len(self._events) > self._event_log_size:
            dropped = self._events.popleft()
            self._oldest_watchable = dropped.resource_version
        self._cond.notify_all()

    def _create(
        self, resource: _Resource, namespace: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        obj = copy.deepcopy(dict(body))
        metadata = obj.setdefault("metadata", {})
        name = metadata.get("name")
        if not name:
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        key = (namespace, name)
        if key in self._objects[resource.plural]:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{resource.plural} "{name}" already exists',
            )
        obj["kind"] = resource.kind
        obj["apiVersion"] = resource.api_version
        if resource.namespaced:
            metadata["namespace"] = namespace
        metadata.setdefault("uid", str(uuid.uuid4()))
        metadata.setdefault("creationTimestamp", _now_rfc3339())
        metadata["resourceVersion"] = str(self._next_resource_version())
        self._objects[resource.plural][key] = obj
        self._emit(resource, namespace, "ADDED", obj)
        return copy.deepcopy(obj)

    def _replace(
        self, resource: _Resource, namespace: str, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        key = (namespace, name)
        current = self._objects[resource.plural].get(key)
        if current is None:
            raise ApiError(404, "NotFound", f'{resource.plural} "{name}" not found')
        obj = copy.deepcopy(dict(body))
        metadata = obj.setdefault("metadata", {})
        if metadata.get("name", name) != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the URL")
        wanted_rv = metadata.get("resourceVersion")
        if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {resource.plural} "{name}": the object has '
                "been modified; please apply your changes to the latest version and try again",
            )
        obj["kind"] = resource.kind
        obj["apiVersion"] = resource.api_version
        metadata["name"] = name
        if resource.namespaced:
            metadata["namespace"] = namespace
        metadata["uid"] = current["metadata"]["uid"]
        metadata["creationTimestamp"] = current["metadata"]["creationTimestamp"]
        metadata["resourceVersion"] = str(self._next_resource_version())
        self._objects[resource.plural][key] = obj
        self._emit(resource, namespace, "MODIFIED", obj)
        return copy.deepcopy(obj)

    def _patch(
        self, resource: _Resource, namespace: str, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        # A merge patch (RFC 7386); for the maps tests patch (labels) a strategic merge patch
        # means the same.
        current = self._objects[resource.plural].get((namespace, name))
        if current is None:
            raise ApiError(404, "NotFound", f'{resource.plural} "{name}" not found')
        given_uid = (body.get("metadata") or {}).get("uid")
        if given_uid is not None and given_uid != current["metadata"].get("uid"):
            # kube-apiserver takes a patch's uid as a precondition.
            raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: "
                           f"{given_uid}, UID in object meta: {current['metadata'].get('uid')}")
        patched = _merge_patch(copy.deepcopy(current), body)
        patched["metadata"].pop("resourceVersion", None)
        return self._replace(resource, namespace, name, patched)

    def _bind(self, namespace: str, name: str, body: Any) -> tuple[int, dict[str, Any]]:
        # A Binding sets spec.nodeName once, as kube-apiserver's binding subresource does.
        target = (body.get("target") or {}) if isinstance(body, dict) else {}
        node = target.get("name") if isinstance(target, dict) else None
        if not isinstance(node, str) or not node:
            raise ApiError(400, "BadRequest", "Binding.target.name is required")
        with self._cond:
            pod = self._objects["pods"].get((namespace, name))
            if pod is None:
                raise ApiError(404, "NotFound", f'pods "{name}" not found')
            if pod.get("spec", {}).get("nodeName"):
                raise ApiError(409, "Conflict", f'pod {name} is already assigned to node '
                               f'"{pod["spec"]["nodeName"]}"')
            self._patch(_RESOURCES["pods"], namespace, name, {"spec": {"nodeName": node}})
        return 201, _status(201, "Created", "")

    def _evict(self, namespace: str, name: str) -> tuple[int, dict[str, Any]]:
        pods = self._objects["pods"]
        with self._cond:
            pod = pods.get((namespace, name))
            if pod is None:
                raise ApiError(404, "NotFound", f'pods "{name}" not found')
            if pod["metadata"].get("deletionTimestamp"):
                return 201, {**_status(201, "", ""), "status": "Success"}
            budgets = [
                budget
                for (ns, _), budget in sorted(self._objects["poddisruptionbudgets"].items())
                if ns == namespace and _selects(
                    budget["spec"].get("selector", {}).get("matchLabels", {}), pod
                )
            ]
            if len(budgets) > 1:
                raise ApiError(500, "InternalError", "This pod has more than one "
                               "PodDisruptionBudget, which the eviction subresource does not "
                               "support.")
            if budgets and not _budget_allows(budgets[0], pod, [
                other for (ns, _), other in pods.items() if ns == namespace
            ]):
                raise ApiError(429, "TooManyRequests",
                               "Cannot evict pod as it would violate the pod's disruption budget.")
            evicted = copy.deepcopy(pod)
            evicted["metadata"]["deletionTimestamp"] = _now_rfc3339()
            evicted["metadata"].pop("resourceVersion", None)
            self._replace(_RESOURCES["pods"], namespace, name, evicted)
        return 201, {**_status(201, "", ""), "status": "Success"}

    def _delete(self, resource: _Resource, namespace: str, name: str) -> dict[str, Any]:
        obj = self._objects[resource.plural].pop((namespace, name), None)
        if obj is None:
            raise ApiError(404, "NotFound", f'{resource.plural} "{name}" not found')
        # Deletion is a write too: the last state goes out with a new resourceVersion.
        obj["metadata"]["resourceVersion"] = str(self._next_resource_version())
        self._emit(resource, namespace, "DELETED", obj)
        return copy.deepcopy(obj)

    def _list(self, resource: _Resource, namespace: str | None) -> dict[str, Any]:
        items = [
            copy.deepcopy(obj)
            for (ns, _), obj in sorted(self._objects[resource.plural].items())
            if namespace is None or ns == namespace
        ]
        return {
            "kind": f"{resource.kind}List",
            "apiVersion": resource.api_version,
            "metadata": {"resourceVersion": str(self._resource_version)},
            "items": items,
        }

    # -- HTTP --------------------------------------------------------------------------------

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with fake._cond:
                    if fake._closing:
                        self.close_connection = True
                    fake._connections.add(self.connection)

            def finish(self) -> None:
                with fake._cond:
                    fake._connections.discard(self.connection)
                super().finish()

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake._handle(self, "GET")

            def do_POST(self) -> None:
                fake._handle(self, "POST")

            def do_PUT(self) -> None:
                fake._handle(self, "PUT")

            def do_DELETE(self) -> None:
                fake._handle(self, "DELETE")

            def do_PATCH(self) -> None:
                fake._handle(self, "PATCH")

        return Handler

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        if self._closing:
            handler.close_connection = True
            return
        split = urlsplit(handler.path)
        query = dict(parse_qsl(split.query))
        body = _read_body(handler)
        match = _PATH.match(split.path)
        resource = _RESOURCES.get(match["plural"]) if match else None
        if match is None or resource is None or resource.prefix != match["prefix"]:
            missing = _status(404, "NotFound", "the server could not find the resource")
            _send_json(handler, 404, missing)
            return
        namespace = match["namespace"]
        name = match["name"]
        subresource = match["subresource"]
        if subresource is not None and (
            (resource.plural, method) != ("pods", "POST")
            or subresource not in ("eviction", "binding")
        ):
            _send_json(handler, 404, _status(404, "NotFound", f"no subresource {subresource}"))
            return
        with self._cond:
            self._requests.append(
                RecordedRequest(method, split.path, query, resource.plural, namespace, name)
            )
        try:
            if namespace is not None and not resource.namespaced:
                raise ApiError(404, "NotFound", f"{resource.plural} are not namespaced")
            if method == "GET" and name is None and query.get("watch") in ("true", "1"):
                self._serve_watch(handler, resource, namespace, query)
                return
            if subresource == "eviction":
                assert name is not None
                code, payload = self._evict(_scoped(resource, namespace), name)
            elif subresource == "binding":
                assert name is not None
                code, payload = self._bind(_scoped(resource, namespace), name, body)
            else:
                code, payload = self._serve_plain(
                    method, resource, namespace, name, body, query.get("labelSelector", "")
                )
        except ApiError as error:
            code, payload = error.status["code"], error.status
        _send_json(handler, code, payload)

    def _serve_plain(
        self,
        method: str,
        resource: _Resource,
        namespace: str | None,
        name: str | None,
        body: Any,
        label_selector: str = "",
    ) -> tuple[int, dict[str, Any]]:
        scoped = _scoped(resource, namespace)
        with self._cond:
            if method == "GET" and name is None:
                listed = self._list(resource, namespace)
                if label_selector:
                    wanted = _equality_selector(label_selector)
                    listed["items"] = [
                        item for item in listed["items"] if _selects(wanted, item)
                    ]
                return 200, listed
            if method == "GET":
                assert name is not None
                obj = self._objects[resource.plural].get((scoped, name))
                if obj is None:
                    raise ApiError(404, "NotFound", f'{resource.plural} "{name}" not found')
                return 200, copy.deepcopy(obj)
            if not isinstance(body, dict):
                if method != "DELETE":
                    raise ApiError(400, "BadRequest", "the request body must be a JSON object")
                body = {}
            if method == "POST" and name is None:
                if resource.namespaced and namespace is None:
                    raise ApiError(405, "MethodNotAllowed", "create needs a namespace")
                return 201, self._create(resource, scoped, body)
            if method == "PUT" and name is not None:
                return 200, self._replace(resource, scoped, name, body)
            if method == "PATCH" and name is not None:
                return 200, self._patch(resource, scoped, name, body)
            if method == "DELETE" and name is not None:
                return 200, self._delete(resource, scoped, name)
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")

    def _serve_watch(
        self,
        handler: BaseHTTPRequestHandler,
        resource: _Resource,
        namespace: str | None,
        query: Mapping[str, str],
    ) -> None:
        timeout_s = int(query.get("timeoutSeconds", _DEFAULT_WATCH_TIMEOUT_S))
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        deadline = time.monotonic() + timeout_s
        state = _WatchState()
        with self._cond:
            # A suspended server parks the request: the client sees a slow apiserver.
            while self._watches_suspended and not self._closing:
                self._cond.wait(0.05)
            requested = query.get("resourceVersion", "")
            initial: list[dict[str, Any]] = []
            if requested in ("", "0"):
                # "Any version": synthetic ADDED events for what exists now, then changes.
                initial = [
                    {"type": "ADDED", "object": obj}
                    for obj in self._list(resource, namespace)["items"]
                ]
                state.sent_through = self._resource_version
            else:
                state.sent_through = int(requested)
            expired = state.sent_through < self._oldest_watchable
            oldest = self._oldest_watchable
            if not expired:
                self._watches.append(state)
        try:
            _start_chunked(handler)
            if expired:
                error = _status(
                    410,
                    "Expired",
                    f"too old resource version: {state.sent_through} ({oldest})",
                )
                _send_chunk(handler, {"type": "ERROR", "object": error})
            else:
                for event in initial:
                    _send_chunk(handler, event)
                self._stream_events(handler, resource, namespace, state, deadline, bookmarks)
            _end_chunked(handler)
        except OSError:  # the client went away (or stopped its watch)
            handler.close_connection = True
        finally:
            with self._cond:
                if state in self._watches:
                    self._watches.remove(state)

    def _stream_events(
        self,
        handler: BaseHTTPRequestHandler,
        resource: _Resource,
        namespace: str | None,
        state: _WatchState,
        deadline: float,
        bookmarks: bool,
    ) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closing or state.ended or time.monotonic() >= deadline:
                        return
                    pending = [
                        e
                        for e in self._events
                        if e.resource_version > state.sent_through
                        and e.plural == resource.plural
                        and (namespace is None or e.namespace == namespace)
                    ]
                    if pending or (bookmarks and state.bookmark_requested):
                        break
                    self._cond.wait(min(0.5, max(0.0, deadline - time.monotonic())))
                bookmark_rv: int | None = None
                if bookmarks and state.bookmark_requested and not pending:
                    # Sent only once caught up, so it never skips an undelivered event.
                    state.bookmark_requested = False
                    bookmark_rv = self._resource_version
                if pending:
                    state.sent_through = pending[-1].resource_version
                elif bookmark_rv is not None:
                    state.sent_through = bookmark_rv
            for event in pending:
                if event.raw is not None:
                    _send_raw_chunk(handler, event.raw)
                else:
                    _send_chunk(handler, {"type": event.event_type, "object": event.obj})
            if bookmark_rv is not None:
                bookmark = {
                    "kind": resource.kind,
                    "apiVersion": resource.api_version,
                    "metadata": {"resourceVersion": str(bookmark_rv)},
                }
                _send_chunk(handler, {"type": "BOOKMARK", "object": bookmark})


def _equality_selector(selector: str) -> dict[str, str]:
    wanted = {}
    for term in selector.split(","):
        key, sep, value = term.partition("=")
        if not sep or key.endswith("!"):
            raise ApiError(400, "BadRequest", f"the fake serves equality selectors only: {term}")
        wanted[key.strip()] = value.lstrip("=").strip()
    return wanted


def _selects(match_labels: Mapping[str, str], obj: Mapping[str, Any]) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    return all(labels.get(key) == value for key, value in match_labels.items())


def _healthy(pod: Mapping[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _budget_allows(
    budget: Mapping[str, Any], pod: Mapping[str, Any], pods: list[dict[str, Any]]
) -> bool:
    spec = budget["spec"]
    selected = [p for p in pods if _selects(spec.get("selector", {}).get("matchLabels", {}), p)]
    expected = int(budget.get("status", {}).get("expectedPods") or len(selected))
    healthy = sum(1 for p in selected if _healthy(p))
    if "minAvailable" in spec:
        desired = int(spec["minAvailable"])
    else:
        desired = expected - int(spec.get("maxUnavailable", 0))
    if _healthy(pod):
        return healthy - desired > 0
    if spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
        return True
    return healthy >= desired


def _merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _namespace_of(resource: _Resource, obj: Mapping[str, Any]) -> str:
    namespace = obj.get("metadata", {}).get("namespace")
    return _scoped(resource, namespace)


def _scoped(resource: _Resource, namespace: str | None) -> str:
    if not resource.namespaced:
        return ""
    return namespace or "default"


def _name_of(obj: Mapping[str, Any]) -> str:
    name = obj.get("metadata", {}).get("name")
    if not name:
        raise KeyError("metadata.name is required")
    return str(name)


def _read_body(handler: BaseHTTPRequestHandler) -> Any:
    length = int(handler.headers.get("Content-Length") or 0)
    if length <= 0:
        return None
    raw = handler.rfile.read(length)
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _send_json(handler: BaseHTTPRequestHandler, code: int, payload: Mapping[str, Any]) -> None:
    data = json.dumps(payload).encode()
    try:
        handler.send_response(code)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
        handler.wfile.flush()
    except (BrokenPipeError, ConnectionResetError):
        handler.close_connection = True


def _start_chunked(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    handler.wfile.flush()


def _send_chunk(handler: BaseHTTPRequestHandler, event: Mapping[str, Any]) -> None:
    data = json.dumps(event).encode() + b"\n"
    handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    handler.wfile.flush()


def _send_raw_chunk(handler: BaseHTTPRequestHandler, line: bytes) -> None:
    data = line + b"\n"
    handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    handler.wfile.flush()


def _end_chunked(handler: BaseHTTPRequestHandler) -> None:
    handler.wfile.write(b"0\r\n\r\n")
    handler.wfile.flush()
