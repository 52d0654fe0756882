"""The usage recorder's Kubernetes source: list, then watch, pods, nodes and ResourceQuotas.

Layer: services/usage (adapter). This module and the Leases' (services/usage/k8s_lease.py) are
the only ones that import the ``kubernetes`` client. It turns API objects into accounting values
with the pure parsers (``accounting.kube_pod``, ``accounting.kube_node``) and hands them to a
``UsageSink`` (the store); it applies no accounting rule itself.

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Protocol

import urllib3.exceptions
from kubernetes import client, config, watch
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from accounting import kube_node, kube_pod, numbers, quantity, received_json
from accounting.annotations import VGPU_NODE_ANNOTATION
from accounting.errors import InvalidInputError
from accounting.limits import MAX_NODE_NAME_CHARS, MAX_QUOTA_LIMIT
from accounting.model import Device, Pod
from accounting.policy import DEFAULT_POLICY, AccountingPolicy
from accounting.quota import merge_quota_limits, quota_keys
from accounting.quoting import quote
from services.usage import metrics
from services.usage.k8s_lease import (
    CONNECT_TIMEOUT_S,
    KubernetesApiError,
    LeaseClient,
    LeaseConflictError,
    LeaseRecord,
)

__all__ = [
    "QUOTA_KEYS",
    "ApiClient",
    "KubernetesApiError",
    "KubernetesConfigError",
    "KubernetesSource",
    "LeaseClient",
    "LeaseConflictError",
    "LeaseRecord",
    "UsageSink",
    "api_client_from_mode",
    "merge_quota_limits",
    "quota_limits",
]

logger = logging.getLogger(__name__)

QUOTA_KEYS: tuple[str, ...] = tuple(quota_keys(DEFAULT_POLICY.vendors))
"""ResourceQuota spec.hard keys read under the default policy: HAMi's two plus our device-count
extension (a source reads the keys of its recorder's policy)."""

_PODS = "pods"
_NODES = "nodes"
_QUOTAS = "resourcequotas"
_KINDS = (_PODS, _NODES, _QUOTAS)
_WHO_KINDS = {_PODS: "pod", _NODES: "node", _QUOTAS: "resourcequota"}

# Added to timeoutSeconds for the socket read timeout, so a silent server is noticed.
_WATCH_READ_GRACE_S = 30
_FIRST_BACKOFF_S = 0.5


class UsageSink(Protocol):
    """Where the source applies what it sees; the usage store implements it.

    Every method is an idempotent upsert or removal, so replaying an event changes nothing.
    Calls come from the source's threads, up to three at once.
    """

    def record_pod(self, pod: Pod) -> object:
        """Records (or updates) a tracked pod's current state."""
        ...

    def forget_pod(self, pod_uid: str) -> object:
        """Removes a pod and everything it was charged; an unknown uid is a no-op."""
        ...

    def register_node(self, node_name: str, devices: Sequence[Device]) -> object:
        """Sets a node's device inventory (replacing the previous one)."""
        ...

    def forget_node(self, node_name: str) -> object:
        """Removes a node's inventory; an unknown node is a no-op."""
        ...

    def set_quota(self, namespace: str, limits: Mapping[str, int]) -> object:
        """Makes the namespace's limits exactly these keys (an empty mapping clears them)."""
        ...

    def tracked_pod_uids(self) -> frozenset[str]:
        """Every pod uid the sink holds, journal included."""
        ...

    def registered_node_names(self) -> frozenset[str]:
        """Every node with an inventory in the sink, journal included."""
        ...

    def quota_namespaces(self) -> frozenset[str]:
        """Every namespace with limits in the sink, journal included."""
        ...

    def set_synced(self, synced: bool) -> None:
        """Tells the sink whether its state reflects the cluster (gates gRPC health)."""
        ...


class KubernetesConfigError(Exception):
    """No usable Kubernetes client configuration (in-cluster or kubeconfig)."""


def api_client_from_mode(mode: str, kubeconfig: str | None) -> ApiClient | None:
    """Builds the API client for a configured source mode.

    Args:
        mode: ``off`` (no Kubernetes source), ``in-cluster`` (the pod's service account) or
            ``kubeconfig`` (the file at ``kubeconfig``; None means ``$KUBECONFIG`` or
            ``~/.kube/config``).
        kubeconfig: path of the kubeconfig file, used with ``mode="kubeconfig"``.

    Raises:
        ValueError: an unknown mode.
        KubernetesConfigError: the configuration could not be loaded.
    """
    if mode == "off":
        return None
    configuration = client.Configuration()
    try:
        # The client's config module is unannotated.
        if mode == "in-cluster":
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        elif mode == "kubeconfig":
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=configuration
            )
        else:
            raise ValueError(f"unknown Kubernetes mode {mode!r}: use off, in-cluster or kubeconfig")
    except config.ConfigException as error:
        raise KubernetesConfigError(
            f"cannot load the {mode} Kubernetes configuration: {error}"
        ) from error
    return ApiClient(configuration)


# -- ResourceQuota limits ------------------------------------------------------------------------


def quota_limits(quota: Mapping[str, Any], keys: Iterable[str] = QUOTA_KEYS) -> dict[str, int]:
    """The GPU limits of one ResourceQuota object (decoded JSON), from ``spec.hard``.

    Only ``keys`` are read, as Kubernetes quantities (``accounting.quantity``): a whole
    number from 0 to ``MAX_QUOTA_LIMIT`` (10^12), whatever its suffix ("24576", "24Ki", "2k");
    anything else ("1.5", "500m", "abc", a negative number, "1e15") is skipped with a warning.
    """
    who = _Who.of("resourcequota", quota)
    spec = quota.get("spec") or {}
    hard = spec.get("hard") if isinstance(spec, Mapping) else None
    if not isinstance(hard, Mapping):
        return {}
    limits: dict[str, int] = {}
    for key in keys:
        if key not in hard:
            continue
        value = _whole_quantity(hard[key])
        if value is None:
            written = hard[key]
            logger.warning(
                "%s: %s=%s is not a whole number from 0 to %d; ignoring the key",
                who,
                key,
                quote(written if isinstance(written, str) else str(written), 40),
                MAX_QUOTA_LIMIT,
                extra=who.log_fields(),
            )
            continue
        limits[key] = value
    return limits


def _whole_quantity(written: object) -> int | None:
    """A quantity that is a whole number between 0 and ``MAX_QUOTA_LIMIT``, else None."""
    try:
        value = quantity.parse_quantity(written)
    except quantity.QuantityError:
        return None
    return numbers.whole_decimal(value, 0, MAX_QUOTA_LIMIT)


# -- who an object is ----------------------------------------------------------------------------

_SKIP_UNREADABLE = "unreadable"
_SKIP_REFUSED = "refused"
_SKIP_FAILED = "failed"


def _label(value: object) -> str:
    """A metadata field for a log line: a string as it is (shortened past a node name's
    length), anything else by its type only."""
    if isinstance(value, str):
        return value if len(value) <= MAX_NODE_NAME_CHARS else value[:MAX_NODE_NAME_CHARS] + "…"
    return "" if value is None else f"<{type(value).__name__}>"


@dataclass(frozen=True, slots=True)
class _Who:
    """Which object a log line and the skip metrics are about: its kind and identity, never
    its content."""

    kind: str
    """``pod``, ``node`` or ``resourcequota``."""
    namespace: str = ""
    name: str = ""
    uid: str = ""

    @classmethod
    def of(cls, kind: str, obj: Mapping[str, Any]) -> _Who:
        metadata = _metadata(obj)
        return cls(kind, _label(metadata.get("namespace")), _label(metadata.get("name")),
                   _label(metadata.get("uid")))

    @property
    def key(self) -> str:
        """What tells it from the other objects of its kind while it is skipped."""
        return self.uid or f"{self.namespace}/{self.name}"

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}" + (f" (uid {self.uid})" if self.uid else "")

    def log_fields(self) -> dict[str, str]:
        prefix = {"pod": "pod", "node": "node", "resourcequota": "quota"}[self.kind]
        fields = {"object_kind": self.kind, f"{prefix}_name": self.name}
        if self.namespace:
            fields[f"{prefix}_namespace"] = self.namespace
        if self.uid:
            fields[f"{prefix}_uid"] = self.uid
        return fields


class _SinkFailure(Exception):
    """The sink did not take an object (refused it, or failed); ``cause`` says why."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


_MAX_LOGGED_PROBLEM_CHARS = 600
"""How much of a refusal's message a skip's log line quotes."""


def _problem(error: Exception) -> str:
    """What is wrong, for a log line: a refusal's field violations (paths and bounded quotes),
    shortened; for any other error only its type and where it was raised, since its message
    may quote the object (``int()``'s does)."""
    if isinstance(error, InvalidInputError):
        text = str(error)
        if len(text) > _MAX_LOGGED_PROBLEM_CHARS:
            text = text[:_MAX_LOGGED_PROBLEM_CHARS] + f"… ({len(text)} characters)"
        return text
    frame = error.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    where = (
        f" at {frame.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.tb_lineno}"
        if frame is not None
        else ""
    )
    return f"{type(error).__name__}{where} (a bug: please report it)"


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
            api_client: the official client's ApiClient, e.g. from ``api_client_from_mode``.
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
        self._vendors = policy.vendors
        self._quota_keys = tuple(quota_keys(policy.vendors))
        self._resync_s = resync_s
        self._watch_timeout_s = int(watch_timeout_s)
        self._list_page_size = list_page_size
        self._request_timeout_s = request_timeout_s
        self._max_backoff_s = max_backoff_s
        self._kinds = (
            _Kind(
                _PODS,
                core.list_pod_for_all_namespaces,
                self._apply_pod_list,
                self._apply_pod_event,
            ),
            _Kind(_NODES, core.list_node, self._apply_node_list, self._apply_node_event),
            _Kind(
                _QUOTAS,
                core.list_resource_quota_for_all_namespaces,
                self._apply_quota_list,
                self._apply_quota_event,
            ),
        )
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._synced = threading.Event()
        self._listed: set[str] = set()
        self._open_watches: dict[str, Any] = {}  # kind name -> its open watch.Watch
        self._threads: list[threading.Thread] = []
        # Node and quota state, each touched only by its own kind's thread.
        self._node_registrations: dict[str, str] = {}
        """Node name -> what its devices were last read from (kube_node.registration_key)."""
        self._quotas: dict[str, dict[str, dict[str, int]]] = {}
        """Namespace -> ResourceQuota name -> its GPU limits."""
        self._quota_sent: dict[str, dict[str, int]] = {}
        """Namespace -> the merged limits last given to the sink (non-empty only)."""
        self._skipped: dict[str, set[str]] = {kind: set() for kind in _WHO_KINDS.values()}
        """Object kind -> the objects skipped and not applied since (``_Who.key``), each set
        touched only by its kind's thread."""
        for kind in self._skipped:
            metrics.SOURCE_SKIPPED_OBJECTS.labels(kind).set(0)

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
                    error if transport else _problem(error),
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
                    self._apply(
                        _Who.of(_WHO_KINDS[kind.name], obj),
                        functools.partial(kind.apply_event, event_type, obj),
                    )
                # After applying, so a stop or crash in between replays the event, never skips it.
                resource_version = str(_metadata(obj).get("resourceVersion") or resource_version)
                if self._stopping.is_set():
                    break
        finally:
            with self._lock:
                self._open_watches.pop(kind.name, None)
        return resource_version

    # -- one object at a time ----------------------------------------------------------------

    def _apply(self, who: _Who, apply: Callable[[], object]) -> None:
        """Applies one object; whatever goes wrong skips it alone (logged and counted, see the
        module docstring), so the list or watch it came in goes on."""
        try:
            apply()
        except _SinkFailure as failure:
            reason = _SKIP_REFUSED if isinstance(failure.cause, InvalidInputError) else _SKIP_FAILED
            self._skip(who, reason, failure.cause)
        except Exception as error:
            reason = _SKIP_UNREADABLE if isinstance(error, InvalidInputError) else _SKIP_FAILED
            self._skip(who, reason, error)
        else:
            self._readable(who)

    def _skip(self, who: _Who, reason: str, error: Exception) -> None:
        metrics.SOURCE_SKIPS.labels(who.kind, reason).inc()
        skipped = self._skipped[who.kind]
        skipped.add(who.key)
        metrics.SOURCE_SKIPPED_OBJECTS.labels(who.kind).set(len(skipped))
        verb = {_SKIP_UNREADABLE: "cannot be read", _SKIP_REFUSED: "was refused by the store",
                _SKIP_FAILED: "could not be applied"}[reason]
        logger.warning(
            "skipping %s: it %s: %s", who, verb, _problem(error),
            extra={**who.log_fields(), "skip_reason": reason},
        )

    def _readable(self, who: _Who) -> None:
        skipped = self._skipped[who.kind]
        if who.key in skipped:
            skipped.discard(who.key)
            metrics.SOURCE_SKIPPED_OBJECTS.labels(who.kind).set(len(skipped))

    def _forget_skipped(self, kind: str, keep: set[str]) -> None:
        """After a list: only the objects skipped in it are still skipped."""
        skipped = self._skipped[kind]
        skipped.intersection_update(keep)
        metrics.SOURCE_SKIPPED_OBJECTS.labels(kind).set(len(skipped))

    @staticmethod
    def _deliver(call: Callable[[], object]) -> None:
        """Calls the sink; a failure becomes ``_SinkFailure`` for ``_apply`` to count."""
        try:
            call()
        except Exception as error:
            raise _SinkFailure(error) from error

    # -- pods ----------------------------------------------------------------------------------

    def _apply_pod_list(self, items: list[dict[str, Any]]) -> None:
        present = {uid for uid in (_metadata(item).get("uid") for item in items)
                   if isinstance(uid, str) and uid}
        # Forget first: a pod that vanished while we were not watching may have held the very
        # devices a new pod in the list now uses.
        for uid in sorted(self._sink.tracked_pod_uids() - present):
            logger.info("forgetting pod %s: no longer in the cluster", uid, extra={"pod_uid": uid})
            self._apply(_Who("pod", uid=uid),
                        functools.partial(self._deliver, functools.partial(self._sink.forget_pod,
                                                                           uid)))
        listed: set[str] = set()
        for item in items:
            who = _Who.of("pod", item)
            listed.add(who.key)
            self._apply(who, functools.partial(self._list_pod, item))
        self._forget_skipped("pod", listed)

    def _list_pod(self, obj: dict[str, Any]) -> None:
        if _pod_is_tracked(obj):
            self._record_pod(obj)

    def _apply_pod_event(self, event_type: str, obj: dict[str, Any]) -> None:
        if event_type == "DELETED":
            uid = _metadata(obj).get("uid")
            # A pod the scheduler reserved for but never annotated is also dropped.
            if isinstance(uid, str) and uid and (
                _pod_is_tracked(obj) or uid in self._sink.tracked_pod_uids()
            ):
                self._deliver(functools.partial(self._sink.forget_pod, uid))
            return
        # HAMi ignores a pod until the scheduler has set hami.io/vgpu-node on it.
        if _pod_is_tracked(obj):
            self._record_pod(obj)

    def _record_pod(self, obj: dict[str, Any]) -> None:
        # Raises InvalidInputError for a pod that does not read: _apply logs who it is and
        # what is wrong, never the pod spec. Text UTF-8 cannot carry is such a pod: stored, it
        # would fail every read and the journal.
        received_json.check_text(obj)
        pod = kube_pod.parse_pod(obj, self._vendors)
        self._deliver(functools.partial(self._sink.record_pod, pod))

    # -- nodes ---------------------------------------------------------------------------------

    def _apply_node_list(self, items: list[dict[str, Any]]) -> None:
        registered: set[str] = set()
        listed: set[str] = set()
        for item in items:
            name = _metadata(item).get("name")
            if isinstance(name, str) and name and kube_node.has_devices(item, self._vendors):
                who = _Who.of("node", item)
                listed.add(who.key)
                registered.add(name)
                self._apply(who, functools.partial(self._register_node, item, unchanged_ok=False))
        self._forget_skipped("node", listed)
        # The sink's own list too: a node deleted while the recorder was down is still in its
        # journal, and this source (new since the restart) never saw it.
        known = set(self._node_registrations) | self._sink.registered_node_names()
        for name in sorted(known - registered):
            self._apply(_Who("node", name=name), functools.partial(self._forget_node, name))

    def _apply_node_event(self, event_type: str, obj: dict[str, Any]) -> None:
        name = _metadata(obj).get("name")
        if not isinstance(name, str) or not name:
            return
        annotated = kube_node.has_devices(obj, self._vendors)
        if event_type == "DELETED":
            if annotated or name in self._node_registrations:
                self._forget_node(name)
        elif annotated:
            self._register_node(obj, unchanged_ok=True)
        elif name in self._node_registrations:
            # The device plugin is gone from the node: its devices are no longer offered.
            self._forget_node(name)

    def _register_node(self, obj: dict[str, Any], *, unchanged_ok: bool) -> None:
        name = str(_metadata(obj).get("name"))
        annotation = kube_node.registration_key(obj, self._vendors)
        # Nodes are updated often (status, heartbeats); only a new inventory is news.
        if unchanged_ok and self._node_registrations.get(name) == annotation:
            return
        # Raises InvalidInputError for devices that do not read: the node keeps what it had.
        received_json.check_text(obj)
        registration = kube_node.parse_node(obj, self._vendors)
        self._deliver(
            functools.partial(
                self._sink.register_node, registration.node_name, registration.devices
            )
        )
        self._node_registrations[name] = annotation

    def _forget_node(self, name: str) -> None:
        self._node_registrations.pop(name, None)
        self._deliver(functools.partial(self._sink.forget_node, name))

    # -- resource quotas -----------------------------------------------------------------------

    def _apply_quota_list(self, items: list[dict[str, Any]]) -> None:
        quotas: dict[str, dict[str, dict[str, int]]] = {}
        listed: set[str] = set()
        for item in items:
            who = _Who.of("resourcequota", item)
            listed.add(who.key)
            self._apply(who, functools.partial(self._list_quota, quotas, item))
        self._forget_skipped("resourcequota", listed)
        # As for nodes: a ResourceQuota deleted while the recorder was down is only in the journal.
        stale = (set(self._quota_sent) | self._sink.quota_namespaces()) - set(quotas)
        self._quotas = quotas
        for namespace in sorted(set(quotas) | stale):
            self._apply(_Who("resourcequota", namespace=namespace),
                        functools.partial(self._send_quota, namespace, unchanged_ok=False))

    def _list_quota(
        self, quotas: dict[str, dict[str, dict[str, int]]], obj: dict[str, Any]
    ) -> None:
        metadata = _metadata(obj)
        namespace, name = metadata.get("namespace"), metadata.get("name")
        if isinstance(namespace, str) and namespace and isinstance(name, str) and name:
            _check_quota_names(namespace, name)
            quotas.setdefault(namespace, {})[name] = quota_limits(obj, self._quota_keys)

    def _apply_quota_event(self, event_type: str, obj: dict[str, Any]) -> None:
        metadata = _metadata(obj)
        namespace, name = metadata.get("namespace"), metadata.get("name")
        if not (isinstance(namespace, str) and namespace and isinstance(name, str) and name):
            return
        _check_quota_names(namespace, name)
        in_namespace = self._quotas.setdefault(namespace, {})
        if event_type == "DELETED":
            in_namespace.pop(name, None)
        else:
            in_namespace[name] = quota_limits(obj, self._quota_keys)
        if not in_namespace:
            del self._quotas[namespace]
        self._send_quota(namespace, unchanged_ok=True)

    def _send_quota(self, namespace: str, *, unchanged_ok: bool) -> None:
        merged = merge_quota_limits(self._quotas.get(namespace, {}).values())
        if unchanged_ok and self._quota_sent.get(namespace, {}) == merged:
            return
        self._deliver(functools.partial(self._sink.set_quota, namespace, dict(merged)))
        if merged:
            self._quota_sent[namespace] = merged
        else:
            self._quota_sent.pop(namespace, None)


def _new_watch() -> Any:
    # return_type "object": events carry the JSON as sent, while the client's resourceVersion
    # tracking (bookmarks included) and its 410 handling keep working.
    return watch.Watch(return_type="object")  # type: ignore[no-untyped-call]  # unannotated


def _check_quota_names(namespace: str, name: str) -> None:
    """Raises InvalidInputError when a ResourceQuota's namespace or name is text UTF-8 cannot
    carry (the namespace would be stored, then fail every read): skipped like any object that
    does not read."""
    received_json.check_text({"namespace": namespace, "name": name}, "metadata")


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    annotations = _metadata(obj).get("annotations")
    return annotations if isinstance(annotations, Mapping) else {}


def _pod_is_tracked(obj: Mapping[str, Any]) -> bool:
    return bool(_annotations(obj).get(VGPU_NODE_ANNOTATION))
