"""The usage recorder's Kubernetes source: list, then watch, pods, nodes and ResourceQuotas.

Layer: services/usage (adapter). This module and the Leases' (services/usage/k8s_lease.py) are
the only ones that import the ``kubernetes`` client. It turns API objects into accounting values
with the pure parsers (``accounting.kube.pod_json``, ``accounting.kube.node_json``) and hands
them to a ``UsageSink`` (the store); it applies no accounting rule itself. This module is the
list/watch reader; what is done with each object it reads is services/usage/k8s_objects.py's.

Per kind, one thread runs the reflector loop client-go users know: list (paginated), reconcile
the sink against the list, then watch from the list's resourceVersion, resuming each watch from
the last resourceVersion seen (bookmarks included) when the server closes it at
``timeoutSeconds``; a ``410 Expired`` (the version was compacted away) means list again and
reconcile. The sink is told it is synced once all three kinds have been listed and applied.

Objects are read as the JSON the API server sent (what Go's ``json.Marshal`` writes, the input
the pure parsers take) rather than as the client's generated models: a model that fails the
client's own validation would otherwise poison a watch, raising on the same event at every
resume, and skipping model construction makes a large list several times cheaper.

No object can stop the source. Each one is applied on its own: one that its reader refuses,
that the store refuses, or whose handling fails for any other reason is skipped with a warning
naming it (kind, namespace/name, uid, and what is wrong, never its content) and counted in
``hami_accounting_source_skips_total`` and ``hami_accounting_source_skipped_objects``; the list
or watch goes on with the next object, the first sync completes, and the object keeps what it
was last charged until it is read again or deleted.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import urllib3.exceptions
from kubernetes import client, watch
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from accounting import numbers
from accounting.policy import DEFAULT_POLICY, AccountingPolicy
from accounting.quota import merge_quota_limits
from services.usage.k8s_lease import (
    CONNECT_TIMEOUT_S,
    KubernetesApiError,
    LeaseClient,
    LeaseConflictError,
    LeaseRecord,
)
from services.usage.k8s_objects import (
    QUOTA_KEYS,
    ObjectRef,
    SinkFeeder,
    UsageSink,
    describe_problem,
    object_metadata,
    quota_limits,
)

__all__ = [
    "QUOTA_KEYS",
    "ApiClient",
    "KubernetesApiError",
    "KubernetesSource",
    "LeaseClient",
    "LeaseConflictError",
    "LeaseRecord",
    "UsageSink",
    "merge_quota_limits",
    "quota_limits",
]

logger = logging.getLogger(__name__)


_PODS = "pods"
_NODES = "nodes"
_QUOTAS = "resourcequotas"
_KINDS = (_PODS, _NODES, _QUOTAS)
_WHO_KINDS = {_PODS: "pod", _NODES: "node", _QUOTAS: "resourcequota"}

# Added to timeoutSeconds for the socket read timeout, so a silent server is noticed.
_WATCH_READ_GRACE_S = 30
_FIRST_BACKOFF_S = 0.5


# -- the source ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Kind:
    """One watched resource: how to list it and how to apply what arrives."""

    name: str
    list_function: Callable[..., Any]
    apply_list: Callable[[list[dict[str, Any]]], None]
    apply_event: Callable[[str, dict[str, Any]], None]


class KubernetesSource:
    """Keeps a ``UsageSink`` in step with the cluster's pods, nodes and ResourceQuotas."""

    def __init__(
        self,
        api_client: ApiClient,
        sink: UsageSink,
        *,
        policy: AccountingPolicy = DEFAULT_POLICY,
        resync_s: float = 3600.0,
        watch_timeout_s: int = 300,
        list_page_size: int = 500,
        request_timeout_s: float = 60.0,
        max_backoff_s: float = 30.0,
    ) -> None:
        """Builds a stopped source; ``start()`` runs it.

        Args:
            api_client: the official client's ApiClient, e.g. from
                ``services.common.kube_api.api_client_from_mode``.
            sink: where pods, nodes and quotas go.
            policy: the recorder's accounting policy: which resources pods are read for, and
                which ResourceQuota keys are read.
            resync_s: a full re-list and reconcile at least this often, a safety net against
                missed events; 0 disables it.
            watch_timeout_s: ``timeoutSeconds`` of each watch request (whole seconds, >= 1);
                the watch then resumes from its last resourceVersion.
            list_page_size: ``limit`` of each list page.
            request_timeout_s: read timeout of list requests.
            max_backoff_s: cap of the exponential back-off after failed requests.
        """
        if watch_timeout_s < 1:
            raise ValueError("watch_timeout_s must be at least 1")
        if resync_s < 0:
            raise ValueError("resync_s must not be negative")
        core = client.CoreV1Api(api_client)
        self._sink = sink
        self._feeder = SinkFeeder(sink, policy)
        feeder = self._feeder
        self._resync_s = resync_s
        self._watch_timeout_s = int(watch_timeout_s)
        self._list_page_size = list_page_size
        self._request_timeout_s = request_timeout_s
        self._max_backoff_s = max_backoff_s
        self._kinds = (
            _Kind(
                _PODS,
                core.list_pod_for_all_namespaces,
                feeder.apply_pod_list,
                feeder.apply_pod_event,
            ),
            _Kind(_NODES, core.list_node, feeder.apply_node_list, feeder.apply_node_event),
            _Kind(
                _QUOTAS,
                core.list_resource_quota_for_all_namespaces,
                feeder.apply_quota_list,
                feeder.apply_quota_event,
            ),
        )
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._synced = threading.Event()
        self._listed: set[str] = set()
        self._open_watches: dict[str, Any] = {}  # kind name -> its open watch.Watch
        self._threads: list[threading.Thread] = []

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """True once the first list of every kind has been applied to the sink."""
        return self._synced.is_set()

    def wait_synced(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` for the first sync; returns whether it happened."""
        return self._synced.wait(timeout_s)

    def start(self) -> None:
        """Marks the sink unsynced and starts one background thread per kind.

        A source may be started again after ``stop()`` (e.g. on regaining leadership): it lists
        and reconciles again, and the sink is synced again after that first list.
        """
        with self._lock:
            if self._threads:
                raise RuntimeError("the Kubernetes source is already started")
            self._stopping.clear()
            self._listed.clear()
            self._synced.clear()
            self._sink.set_synced(False)
            self._threads = [
                threading.Thread(
                    target=self._run, args=(kind,), name=f"k8s-source-{kind.name}", daemon=True
                )
                for kind in self._kinds
            ]
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stops the threads, interrupting open watches; returns within about ``timeout_s``.

        The sink keeps what it has and is not marked unsynced: whether stale state may still
        be served is the caller's decision.
        """
        self._stopping.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            while thread.is_alive() and time.monotonic() < deadline:
                # Repeated: a watch that opens just after one call still sees the next one.
                with self._lock:
                    open_watches = list(self._open_watches.values())
                for open_watch in open_watches:
                    open_watch.stop()
                thread.join(0.05)
            if thread.is_alive():
                logger.warning("%s did not stop within %.1f s", thread.name, timeout_s)
        with self._lock:
            self._threads = []

    # -- the reflector loop ------------------------------------------------------------------

    def _run(self, kind: _Kind) -> None:
        resource_version: str | None = None
        listed_at = 0.0
        failures = 0
        phase = "list"
        while not self._stopping.is_set():
            try:
                if resource_version is None or self._resync_due(listed_at):
                    phase = "list"
                    resource_version = self._list(kind)
                    listed_at = time.monotonic()
                    self._mark_listed(kind.name)
                phase = "watch"
                resource_version = self._watch(kind, resource_version)
                failures = 0
            except ApiException as error:
                if self._stopping.is_set():
                    return
                failures += 1
                if error.status == HTTPStatus.GONE:
                    logger.info(
                        "%s %s at resourceVersion %s expired; listing again",
                        kind.name,
                        phase,
                        resource_version,
                    )
                    resource_version = None
                    if failures > 1:
                        # Expired again straight after a fresh list: do not hammer the server.
                        self._back_off(failures - 1)
                    continue
                logger.warning(
                    "%s %s failed: %s %s",
                    kind.name,
                    phase,
                    error.status,
                    error.reason,
                )
                self._back_off(failures)
            except Exception as error:
                # Transport errors (connection refused or reset, timeouts) and malformed
                # responses: retry after a back-off, resuming the watch if it was one.
                if self._stopping.is_set():
                    return
                failures += 1
                transport = isinstance(error, urllib3.exceptions.HTTPError | OSError)
                logger.warning(
                    "%s %s failed: %s",
                    kind.name,
                    phase,
                    error if transport else describe_problem(error),
                )
                if phase == "watch" and not transport:
                    # A watch event the client itself could not decode would fail again at
                    # every resume from the same version: list again (the list reads each
                    # object on its own) and watch on from there.
                    resource_version = None
                self._back_off(failures)

    def _resync_due(self, listed_at: float) -> bool:
        return self._resync_s > 0 and time.monotonic() - listed_at >= self._resync_s

    def _back_off(self, failures: int) -> None:
        delay = min(self._max_backoff_s, _FIRST_BACKOFF_S * 2 ** min(failures - 1, 16))
        self._stopping.wait(delay)

    def _mark_listed(self, kind_name: str) -> None:
        with self._lock:
            self._listed.add(kind_name)
            if self._synced.is_set() or not self._listed.issuperset(_KINDS):
                return
            self._sink.set_synced(True)
            self._synced.set()
        logger.info("Kubernetes source synced: pods, nodes and resource quotas listed")

    def _list(self, kind: _Kind) -> str:
        """Lists every page, applies the list, and returns the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        continue_token: str | None = None
        while True:
            arguments: dict[str, Any] = {
                "limit": self._list_page_size,
                "_preload_content": False,
                "_request_timeout": (CONNECT_TIMEOUT_S, self._request_timeout_s),
            }
            if continue_token:
                arguments["_continue"] = continue_token
            response = kind.list_function(**arguments)
            try:
                # Bounded numbers: an object holding a huge integer stays one unreadable
                # object instead of a page that cannot be decoded.
                page = numbers.json_loads(response.data)
            finally:
                response.release_conn()
            if not isinstance(page, dict):
                raise ValueError(f"{kind.name} list: the response is not a JSON object")
            items.extend(item for item in page.get("items") or () if isinstance(item, dict))
            metadata = page.get("metadata") or {}
            continue_token = metadata.get("continue") or None
            if continue_token is None:
                resource_version = metadata.get("resourceVersion")
                if not resource_version:
                    raise ValueError(f"{kind.name} list: no metadata.resourceVersion")
                break
        kind.apply_list(items)
        logger.info("listed %d %s at resourceVersion %s", len(items), kind.name, resource_version)
        return str(resource_version)

    def _watch(self, kind: _Kind, resource_version: str) -> str:
        """Watches until the server closes the stream; returns the last resourceVersion seen."""
        stream = _new_watch()
        with self._lock:
            if self._stopping.is_set():
                return resource_version
            self._open_watches[kind.name] = stream
        try:
            events = stream.stream(
                kind.list_function,
                resource_version=resource_version,
                timeout_seconds=self._watch_timeout_s,
                allow_watch_bookmarks=True,
                _request_timeout=(CONNECT_TIMEOUT_S, self._watch_timeout_s + _WATCH_READ_GRACE_S),
            )
            for event in events:
                # The client yields None for a line that is not JSON.
                obj = event.get("object") if isinstance(event, dict) else None
                if not isinstance(obj, dict):
                    continue
                event_type = event.get("type")
                if event_type in ("ADDED", "MODIFIED", "DELETED"):
                    self._feeder.apply(
                        ObjectRef.of(_WHO_KINDS[kind.name], obj),
                        functools.partial(kind.apply_event, event_type, obj),
                    )
                # After applying, so a stop or crash in between replays the event, never skips it.
                seen = object_metadata(obj).get("resourceVersion")
                resource_version = str(seen or resource_version)
                if self._stopping.is_set():
                    break
        finally:
            with self._lock:
                self._open_watches.pop(kind.name, None)
        return resource_version


def _new_watch() -> Any:
    # return_type "object": events carry the JSON as sent, while the client's resourceVersion
    # tracking (bookmarks included) and its 410 handling keep working.
    return watch.Watch(return_type="object")  # type: ignore[no-untyped-call]  # unannotated
