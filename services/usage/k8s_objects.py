"""What the usage recorder's Kubernetes source does with the objects it reads: pods, nodes and
ResourceQuotas applied to a ``UsageSink`` (the store), one at a time.

Layer: services/usage (adapter). The list/watch reader is services/usage/k8s.py; it hands each
list and each event here. Objects are the JSON the API server sent, read with the pure parsers
(``accounting.kube.pod_json``, ``accounting.kube.node_json``); no accounting rule is applied here.

No object can stop the source: one that its reader refuses, that the store refuses, or whose
handling fails for any other reason is skipped with a warning naming it (kind,
namespace/name, uid, and what is wrong, never its content) and counted in
``hami_accounting_source_skips_total`` and ``hami_accounting_source_skipped_objects``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from accounting import numbers, received_json
from accounting.annotations import VGPU_NODE_ANNOTATION
from accounting.errors import InvalidInputError
from accounting.kube import node_json, pod_json, quantity
from accounting.limits import MAX_NODE_NAME_CHARS, MAX_QUOTA_LIMIT
from accounting.model import Device, Pod
from accounting.policy import DEFAULT_POLICY, AccountingPolicy
from accounting.quota import merge_quota_limits, quota_keys
from accounting.quoting import quote
from services.usage import metrics

# The source's log lines keep one logger name, whichever of its two modules writes them.
logger = logging.getLogger("services.usage.k8s")

QUOTA_KEYS: tuple[str, ...] = tuple(quota_keys(DEFAULT_POLICY.vendors))
"""ResourceQuota spec.hard keys read under the default policy: HAMi's two plus our device-count
extension (a source reads the keys of its recorder's policy)."""

OBJECT_KINDS = ("pod", "node", "resourcequota")
"""The kinds of object the source applies, as its log lines and skip metrics name them."""


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


# -- ResourceQuota limits ------------------------------------------------------------------------


def quota_limits(quota: Mapping[str, Any], keys: Iterable[str] = QUOTA_KEYS) -> dict[str, int]:
    """The GPU limits of one ResourceQuota object (decoded JSON), from ``spec.hard``.

    Only ``keys`` are read, as Kubernetes quantities (``accounting.kube.quantity``): a whole
    number from 0 to ``MAX_QUOTA_LIMIT`` (10^12), whatever its suffix ("24576", "24Ki", "2k");
    anything else ("1.5", "500m", "abc", a negative number, "1e15") is skipped with a warning.
    """
    who = ObjectRef.of("resourcequota", quota)
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
class ObjectRef:
    """Which object a log line and the skip metrics are about: its kind and identity, never
    its content."""

    kind: str
    """``pod``, ``node`` or ``resourcequota``."""
    namespace: str = ""
    name: str = ""
    uid: str = ""

    @classmethod
    def of(cls, kind: str, obj: Mapping[str, Any]) -> ObjectRef:
        metadata = object_metadata(obj)
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


def describe_problem(error: Exception) -> str:
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


class SinkFeeder:
    """Applies what the source's lists and watches deliver to a ``UsageSink``, one object at a
    time: a list reconciles the sink against it, an event changes one object; whatever goes
    wrong with one object skips it alone (see the module docstring)."""

    def __init__(self, sink: UsageSink, policy: AccountingPolicy) -> None:
        """Feeds ``sink``, reading pods, nodes and ResourceQuotas for ``policy``'s vendors."""
        self._sink = sink
        self._vendors = policy.vendors
        self._quota_keys = tuple(quota_keys(policy.vendors))
        # Node and quota state, each touched only by its own kind's thread.
        self._node_registrations: dict[str, str] = {}
        """Node name -> what its devices were last read from (node_json.registration_key)."""
        self._quotas: dict[str, dict[str, dict[str, int]]] = {}
        """Namespace -> ResourceQuota name -> its GPU limits."""
        self._quota_sent: dict[str, dict[str, int]] = {}
        """Namespace -> the merged limits last given to the sink (non-empty only)."""
        self._skipped: dict[str, set[str]] = {kind: set() for kind in OBJECT_KINDS}
        """Object kind -> the objects skipped and not applied since (``ObjectRef.key``), each
        set touched only by its kind's thread."""
        for kind in self._skipped:
            metrics.SOURCE_SKIPPED_OBJECTS.labels(kind).set(0)

    def apply(self, who: ObjectRef, apply: Callable[[], object]) -> None:
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

    def _skip(self, who: ObjectRef, reason: str, error: Exception) -> None:
        metrics.SOURCE_SKIPS.labels(who.kind, reason).inc()
        skipped = self._skipped[who.kind]
        skipped.add(who.key)
        metrics.SOURCE_SKIPPED_OBJECTS.labels(who.kind).set(len(skipped))
        verb = {_SKIP_UNREADABLE: "cannot be read", _SKIP_REFUSED: "was refused by the store",
                _SKIP_FAILED: "could not be applied"}[reason]
        logger.warning(
            "skipping %s: it %s: %s", who, verb, describe_problem(error),
            extra={**who.log_fields(), "skip_reason": reason},
        )

    def _readable(self, who: ObjectRef) -> None:
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

    def apply_pod_list(self, items: list[dict[str, Any]]) -> None:
        present = {uid for uid in (object_metadata(item).get("uid") for item in items)
                   if isinstance(uid, str) and uid}
        # Forget first: a pod that vanished while we were not watching may have held the very
        # devices a new pod in the list now uses.
        for uid in sorted(self._sink.tracked_pod_uids() - present):
            logger.info("forgetting pod %s: no longer in the cluster", uid, extra={"pod_uid": uid})
            self.apply(ObjectRef("pod", uid=uid),
                        functools.partial(self._deliver, functools.partial(self._sink.forget_pod,
                                                                           uid)))
        listed: set[str] = set()
        for item in items:
            who = ObjectRef.of("pod", item)
            listed.add(who.key)
            self.apply(who, functools.partial(self._list_pod, item))
        self._forget_skipped("pod", listed)

    def _list_pod(self, obj: dict[str, Any]) -> None:
        if _pod_is_tracked(obj):
            self._record_pod(obj)

    def apply_pod_event(self, event_type: str, obj: dict[str, Any]) -> None:
        if event_type == "DELETED":
            uid = object_metadata(obj).get("uid")
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
        pod = pod_json.parse_pod(obj, self._vendors)
        self._deliver(functools.partial(self._sink.record_pod, pod))

    # -- nodes ---------------------------------------------------------------------------------

    def apply_node_list(self, items: list[dict[str, Any]]) -> None:
        registered: set[str] = set()
        listed: set[str] = set()
        for item in items:
            name = object_metadata(item).get("name")
            if isinstance(name, str) and name and node_json.has_devices(item, self._vendors):
                who = ObjectRef.of("node", item)
                listed.add(who.key)
                registered.add(name)
                self.apply(who, functools.partial(self._register_node, item, unchanged_ok=False))
        self._forget_skipped("node", listed)
        # The sink's own list too: a node deleted while the recorder was down is still in its
        # journal, and this source (new since the restart) never saw it.
        known = set(self._node_registrations) | self._sink.registered_node_names()
        for name in sorted(known - registered):
            self.apply(ObjectRef("node", name=name), functools.partial(self._forget_node, name))

    def apply_node_event(self, event_type: str, obj: dict[str, Any]) -> None:
        name = object_metadata(obj).get("name")
        if not isinstance(name, str) or not name:
            return
        annotated = node_json.has_devices(obj, self._vendors)
        if event_type == "DELETED":
            if annotated or name in self._node_registrations:
                self._forget_node(name)
        elif annotated:
            self._register_node(obj, unchanged_ok=True)
        elif name in self._node_registrations:
            # The device plugin is gone from the node: its devices are no longer offered.
            self._forget_node(name)

    def _register_node(self, obj: dict[str, Any], *, unchanged_ok: bool) -> None:
        name = str(object_metadata(obj).get("name"))
        annotation = node_json.registration_key(obj, self._vendors)
        # Nodes are updated often (status, heartbeats); only a new inventory is news.
        if unchanged_ok and self._node_registrations.get(name) == annotation:
            return
        # Raises InvalidInputError for devices that do not read: the node keeps what it had.
        received_json.check_text(obj)
        registration = node_json.parse_node(obj, self._vendors)
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

    def apply_quota_list(self, items: list[dict[str, Any]]) -> None:
        quotas: dict[str, dict[str, dict[str, int]]] = {}
        listed: set[str] = set()
        for item in items:
            who = ObjectRef.of("resourcequota", item)
            listed.add(who.key)
            self.apply(who, functools.partial(self._list_quota, quotas, item))
        self._forget_skipped("resourcequota", listed)
        # As for nodes: a ResourceQuota deleted while the recorder was down is only in the journal.
        stale = (set(self._quota_sent) | self._sink.quota_namespaces()) - set(quotas)
        self._quotas = quotas
        for namespace in sorted(set(quotas) | stale):
            self.apply(ObjectRef("resourcequota", namespace=namespace),
                        functools.partial(self._send_quota, namespace, unchanged_ok=False))

    def _list_quota(
        self, quotas: dict[str, dict[str, dict[str, int]]], obj: dict[str, Any]
    ) -> None:
        metadata = object_metadata(obj)
        namespace, name = metadata.get("namespace"), metadata.get("name")
        if isinstance(namespace, str) and namespace and isinstance(name, str) and name:
            _check_quota_names(namespace, name)
            quotas.setdefault(namespace, {})[name] = quota_limits(obj, self._quota_keys)

    def apply_quota_event(self, event_type: str, obj: dict[str, Any]) -> None:
        metadata = object_metadata(obj)
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


def _check_quota_names(namespace: str, name: str) -> None:
    """Raises InvalidInputError when a ResourceQuota's namespace or name is text UTF-8 cannot
    carry (the namespace would be stored, then fail every read): skipped like any object that
    does not read."""
    received_json.check_text({"namespace": namespace, "name": name}, "metadata")


def object_metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    annotations = object_metadata(obj).get("annotations")
    return annotations if isinstance(annotations, Mapping) else {}


def _pod_is_tracked(obj: Mapping[str, Any]) -> bool:
    return bool(_annotations(obj).get(VGPU_NODE_ANNOTATION))
