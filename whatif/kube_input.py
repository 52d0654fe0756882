"""A what-if workload from Kubernetes objects as decoded JSON (what ``kubectl get -o json``
prints, or YAML manifests loaded into the same shapes).

Layer: the what-if simulator (accounting and the standard library only). Pods and Nodes are
read by the parsers the daemons use (accounting.kube.pod_json, accounting.kube.node_json);
ResourceQuotas by their ``spec.hard`` GPU keys.

* ``List`` objects (kind ``List`` or ``...List``) are opened and their items read in order.
* Skipped, and counted by what they are: a Pod without a GPU request, a Node without HAMi
  devices, a ResourceQuota without a GPU key, any other kind, an object without a kind (items
  of a typed list such as the API server's ``PodList`` take its kind), a Pod created after
  the window (when its length is given).
* Timing: a pod arrives at ``metadata.creationTimestamp``; a regular init container runs for
  ``finishedAt - startedAt`` of its terminated state (or last terminated state) and for
  ``DEFAULT_INIT_RUN_S`` when the status does not record it; the apps run from their first
  ``startedAt`` (else from the end of the init containers) until ``metadata.deletionTimestamp``,
  or the last ``finishedAt`` of a Succeeded or Failed pod, and otherwise until the window ends.
* The window starts at the earliest creation and ends at the latest timestamp the input holds
  (about when it was taken), unless a length is given; an input without any timestamp gets
  ``DEFAULT_WINDOW_S``, and its pods all arrive at the start, in input order.
* A malformed object is an ``InvalidInputError`` naming it (where it was, its kind, namespace and
  name) and every bad field; nothing is replayed. A pod asking for devices with a malformed
  ``hami.io/device-scoring-weights`` is one: the scheduler refuses it at every Filter.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from accounting import numbers
from accounting.errors import FieldViolation, InvalidInputError
from accounting.fit import pod_requests_devices, scoring_weights
from accounting.kube.node_json import NodeRegistration, parse_node
from accounting.kube.pod_json import DEFAULT_NAMESPACE, parse_pod
from accounting.kube.quantity import QuantityError, describe, parse_quantity
from accounting.limits import MAX_QUOTA_LIMIT
from accounting.model import ContainerClass, Pod, PodPhase
from accounting.quota import merge_quota_limits, quota_keys
from accounting.vendors import NVIDIA_RESOURCES, VendorResources
from whatif.workload import DEFAULT_INIT_RUN_S, ReplayPod, Workload

DEFAULT_WINDOW_S = 3600
"""The window of an input that holds no timestamp at all."""

SKIPPED_GPU_LESS_POD = "Pod without a GPU request"
SKIPPED_GPU_LESS_NODE = "Node without HAMi devices"
SKIPPED_GPU_LESS_QUOTA = "ResourceQuota without GPU limits"
SKIPPED_NO_KIND = "object without a kind"
SKIPPED_AFTER_WINDOW = "Pod created after the window"

Json = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class SourcedObject:
    """One decoded object and where it came from, e.g. ``cluster.json`` or ``pods/a.yaml[1]``."""

    source: str
    obj: object


@dataclass(frozen=True, slots=True)
class _TimedPod:
    """A pod with absolute times (seconds since the epoch; None when not recorded)."""

    pod: Pod
    created: int | None
    init_run_s: tuple[int, ...]
    apps_started: int | None
    ended: int | None


def read_workload(
    objects: Iterable[SourcedObject],
    *,
    window_s: int | None = None,
    default_init_run_s: int = DEFAULT_INIT_RUN_S,
    vendor: VendorResources = NVIDIA_RESOURCES,
) -> Workload:
    """Reads every object (Lists opened) into one workload.

    Raises:
        InvalidInputError: an object is malformed (the error names it), two pods share a
            namespace and name, or two nodes a name.
    """
    reader = _Reader(vendor, default_init_run_s)
    for item in objects:
        reader.read(item.source, item.obj)
    return reader.workload(window_s)


class _Reader:
    def __init__(self, vendor: VendorResources, default_init_run_s: int) -> None:
        self.vendor = vendor
        self.default_init_run_s = default_init_run_s
        self.pods: list[_TimedPod] = []
        self.pod_sources: dict[str, str] = {}
        self.nodes: dict[str, NodeRegistration] = {}
        self.node_sources: dict[str, str] = {}
        self.quotas: dict[str, dict[str, int]] = {}
        self.skipped: dict[str, int] = {}
        self.latest: int | None = None

    def skip(self, what: str) -> None:
        self.skipped[what] = self.skipped.get(what, 0) + 1

    def read(self, source: str, obj: object, item_kind: str | None = None) -> None:
        if not isinstance(obj, Mapping):
            raise InvalidInputError.single(source, "must be a Kubernetes object (a mapping)")
        kind = obj.get("kind") or item_kind
        if not isinstance(kind, str) or not kind:
            self.skip(SKIPPED_NO_KIND)
            return
        if kind == "List" or (kind.endswith("List") and "items" in obj):
            items = obj.get("items")
            if items is None:
                return
            if not isinstance(items, list):
                raise InvalidInputError.single(f"{source} ({kind})", "items: must be an array")
            # The API server's typed lists (PodList) leave the kind out of their items.
            of_kind = kind.removesuffix("List") or None
            for index, item in enumerate(items):
                self.read(f"{source} items[{index}]", item, of_kind)
            return
        if kind == "Pod":
            self.pod(source, obj)
        elif kind == "Node":
            self.node(source, obj)
        elif kind == "ResourceQuota":
            self.quota(source, obj)
        else:
            self.skip(kind)

    # -- pods ---------------------------------------------------------------------------------

    def pod(self, source: str, obj: Json) -> None:
        label = f"{source} ({_describe('Pod', obj)})"
        document = _with_uid(obj)
        try:
            pod = parse_pod(document, (self.vendor,))
        except InvalidInputError as error:
            raise _named(error, label) from None
        if not pod_requests_devices(pod, self.vendor):
            self.skip(SKIPPED_GPU_LESS_POD)
            return
        try:
            # The scheduler refuses such a pod at every Filter; the replay says so up front.
            scoring_weights(pod.annotations)
        except InvalidInputError as error:
            raise _named(error, label) from None
        found: list[FieldViolation] = []
        times = _Times(document, found)
        created = times.at(("metadata", "creationTimestamp"))
        deleted = times.at(("metadata", "deletionTimestamp"))
        init_run_s = tuple(
            self.init_run_s(times, document, c.name, found)
            for c in pod.containers
            if c.container_class is ContainerClass.INIT
        )
        apps_started = _earliest(times.all_states("containerStatuses", "startedAt"))
        ended = deleted
        if ended is None and pod.phase in (PodPhase.SUCCEEDED, PodPhase.FAILED):
            ended = _latest(times.all_states("containerStatuses", "finishedAt"))
        if found:
            raise _named(InvalidInputError(found), label)
        if times.latest is not None:
            self.latest = times.latest if self.latest is None else max(self.latest, times.latest)
        first = self.pod_sources.setdefault(pod.key, label)
        if first != label:
            raise InvalidInputError.single(label, f"pod {pod.key} appears twice, also {first}")
        self.pods.append(_TimedPod(pod, created, init_run_s, apps_started, ended))

    def init_run_s(
        self, times: _Times, document: Json, name: str, found: list[FieldViolation]
    ) -> int:
        statuses = (document.get("status") or {}).get("initContainerStatuses") or []
        for index, status in enumerate(statuses):
            if not isinstance(status, Mapping) or status.get("name") != name:
                continue
            path = ("status", "initContainerStatuses", index)
            for state in ("state", "lastState"):
                started = times.at((*path, state, "terminated", "startedAt"))
                finished = times.at((*path, state, "terminated", "finishedAt"))
                if started is not None and finished is not None:
                    if finished < started:
                        where = _path((*path, state, "terminated", "finishedAt"))
                        found.append(FieldViolation(where, "must not be before startedAt"))
                        return 0
                    return finished - started
        return self.default_init_run_s

    # -- nodes and quotas ---------------------------------------------------------------------

    def node(self, source: str, obj: Json) -> None:
        label = f"{source} ({_describe('Node', obj)})"
        try:
            node = parse_node(obj, (self.vendor,))
        except InvalidInputError as error:
            raise _named(error, label) from None
        if not any(d.vendor == self.vendor.vendor for d in node.devices):
            self.skip(SKIPPED_GPU_LESS_NODE)
            return
        first = self.node_sources.setdefault(node.node_name, label)
        if first != label:
            raise InvalidInputError.single(
                label, f"node {node.node_name} appears twice, also {first}"
            )
        self.nodes[node.node_name] = node

    def quota(self, source: str, obj: Json) -> None:
        label = f"{source} ({_describe('ResourceQuota', obj)})"
        metadata = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        hard = spec.get("hard") if isinstance(spec, Mapping) else None
        if not isinstance(metadata, Mapping) or not isinstance(hard, Mapping):
            self.skip(SKIPPED_GPU_LESS_QUOTA)
            return
        found: list[FieldViolation] = []
        limits: dict[str, int] = {}
        for key, resource in quota_keys((self.vendor,)).items():
            if key not in hard:
                continue
            where = f"spec.hard[{key!r}]"
            try:
                value = parse_quantity(hard[key])
            except QuantityError as error:
                found.append(FieldViolation(where, str(error)))
                continue
            limit = numbers.whole_decimal(value, 0, MAX_QUOTA_LIMIT)
            if limit is None:
                found.append(
                    FieldViolation(
                        where,
                        f"must be a whole number from 0 to {MAX_QUOTA_LIMIT}, "
                        f"got {describe(value)}",
                    )
                )
                continue
            limits[resource] = limit
        if found:
            raise _named(InvalidInputError(found), label)
        if not limits:
            self.skip(SKIPPED_GPU_LESS_QUOTA)
            return
        namespace = str(metadata.get("namespace") or DEFAULT_NAMESPACE)
        # Kubernetes enforces every ResourceQuota of a namespace: the tightest one binds.
        self.quotas[namespace] = merge_quota_limits((self.quotas.get(namespace, {}), limits))

    # -- the result ---------------------------------------------------------------------------

    def workload(self, window_s: int | None) -> Workload:
        created = [p.created for p in self.pods if p.created is not None]
        start = min(created) if created else (self.latest or 0)
        if window_s is None:
            window_s = self.latest - start if self.latest is not None else DEFAULT_WINDOW_S
        pods = []
        for timed in self.pods:
            replay_pod = self.replay_pod(timed, start)
            if replay_pod.arrival_s > window_s:
                self.skip(SKIPPED_AFTER_WINDOW)
            else:
                pods.append(replay_pod)
        pods.sort(key=lambda p: p.arrival_s)  # stable: equal arrivals keep the input order
        return Workload(
            pods=tuple(pods),
            nodes=tuple(self.nodes.values()),
            window_s=max(window_s, 0),
            quotas=self.quotas,
            skipped=self.skipped,
        )

    @staticmethod
    def replay_pod(timed: _TimedPod, start: int) -> ReplayPod:
        arrival = max((timed.created or start) - start, 0)
        app_run_s = None
        if timed.ended is not None:
            apps_started = timed.apps_started
            if apps_started is None:
                apps_started = start + arrival + sum(timed.init_run_s)
            app_run_s = max(timed.ended - apps_started, 0)
        # The replay decides where the pod runs: what the input says about it is dropped.
        pod = replace(
            timed.pod,
            containers=tuple(replace(c, grants=()) for c in timed.pod.containers),
            node_name="",
            phase=PodPhase.PENDING,
            init_container_statuses=(),
            container_statuses=(),
            terminating=False,
        )
        return ReplayPod(pod, arrival, timed.init_run_s, app_run_s)


class _Times:
    """Reads RFC 3339 timestamps out of one object, remembering the latest and every problem."""

    def __init__(self, document: Json, found: list[FieldViolation]) -> None:
        self.document = document
        self.found = found
        self.latest: int | None = None

    def at(self, path: tuple[str | int, ...]) -> int | None:
        value: object = self.document
        for step in path:
            if isinstance(step, int):
                if not isinstance(value, list) or step >= len(value):
                    return None
                value = value[step]
            elif isinstance(value, Mapping):
                value = value.get(step)
            else:
                return None
        if value is None:
            return None
        seconds = _seconds(value)
        if seconds is None:
            self.found.append(
                FieldViolation(_path(path), f"must be an RFC 3339 timestamp, got {value!r:.80}")
            )
            return None
        self.latest = seconds if self.latest is None else max(self.latest, seconds)
        return seconds

    def all_states(self, statuses_key: str, field: str) -> list[int]:
        """``field`` of every container state of one status list (running and terminated)."""
        statuses = (self.document.get("status") or {}).get(statuses_key) or []
        found: list[int] = []
        if not isinstance(statuses, list):
            return found
        for index in range(len(statuses)):
            for state in ("running", "terminated"):
                value = self.at(("status", statuses_key, index, "state", state, field))
                if value is not None:
                    found.append(value)
        return found


def _seconds(value: object) -> int | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp())


def _earliest(values: list[int]) -> int | None:
    return min(values) if values else None


def _latest(values: list[int]) -> int | None:
    return max(values) if values else None


def _path(path: tuple[str | int, ...]) -> str:
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text


def _describe(kind: str, obj: Json) -> str:
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        return f"{kind} without metadata"
    name = metadata.get("name") or "(no name)"
    if kind == "Node":
        return f"{kind} {name}"
    namespace = metadata.get("namespace") or DEFAULT_NAMESPACE
    return f"{kind} {namespace}/{name}"


def _with_uid(obj: Json) -> Json:
    """A hand-written manifest has no uid: namespace/name stands in (unique in one input)."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping) or metadata.get("uid"):
        return obj
    namespace = metadata.get("namespace") or DEFAULT_NAMESPACE
    uid = f"{namespace}/{metadata.get('name') or ''}"
    return {**obj, "metadata": {**metadata, "uid": uid}}


def _named(error: InvalidInputError, label: str) -> InvalidInputError:
    """The error with every field path preceded by the object it is in."""
    return InvalidInputError(
        FieldViolation(f"{label}: {v.path}", v.message) for v in error.violations
    )
