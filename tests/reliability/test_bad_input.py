"""Bad input against the three daemons: thousands of generated malformed requests.

Each input is a valid request with at least one *poison* — a mutation that makes it malformed
for certain (an empty uid, an unknown enum number, a grant of -1 MiB, a quantity "12Zi", an
allocation annotation that does not parse, 300 containers, a body that is not JSON, ...) — plus
random *noise* that may or may not be malformed on its own (odd unicode in names, extreme but
valid integers). Inputs come from a seeded generator, so a failure names a reproducible input.

For every input, on every daemon (admission CheckQuota, scheduler Filter, and each recorder
write and read that takes input):

* the answer is INVALID_ARGUMENT (RESOURCE_EXHAUSTED for an oversized message), never OK,
  never INTERNAL or UNKNOWN;
* an INVALID_ARGUMENT names a field: its message contains a path such as
  ``pod.containers[1].grants[0].memory_mib`` and its google.rpc.BadRequest detail lists the
  same paths;
* the daemons keep running and answer health;
* nothing changes: a WatchUsage stream opened before the first input receives no event, and
  the node, namespace and pod figures read before and after are identical.
"""

from __future__ import annotations

import http.client
import json
import random
import re
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status

from accounting.owned_annotations import scheduler_owned_annotations
from hami.accounting.v1 import (
    admission_pb2,
    admission_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    types_pb2,
    usage_pb2,
    usage_pb2_grpc,
)
from tests.reliability.daemons import Daemon, Pki, free_port, running_stack
from tests.reliability.model import (
    APP,
    INIT,
    SIDECAR,
    ContainerSpec,
    GrantSpec,
    PodSpec,
    Snapshot,
    Status,
    device_message,
    pod_json_object,
    pod_message,
)
from tests.reliability.sizes import report, sized

pytestmark = [pytest.mark.slow, pytest.mark.timeout(sized(300, 1800))]

INPUTS = sized(2_000, 50_000)
WEBHOOK_INPUTS = sized(300, 5_000)
SEED = 9_001
RPC_TIMEOUT_S = 20.0
NODE = "bad-node"
UUIDS = ("GPU-bad-0", "GPU-bad-1")
NAMESPACE = "bad-ns"
INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
ALLOCATED = "hami.io/vgpu-devices-allocated"
REGISTER = "hami.io/node-nvidia-register"
# A field path: an identifier, then .names and [indices] / ["keys"].
PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*|\[[^\]]*\])*")

ODD_TEXT = (
    "\u202ertl-override", "zero\u200bwidth", "emoji-\U0001f680", "nul\x00byte", "e\u0301\u0301",
    "x" * 5000, "\ufeffbom", "tab\tand\nnewline", "CJK-\u4e2d\u6587", "\U0010fffd",
)
MAX_MESSAGE_CHARS = 1_500
"""docs/security.md: an error's message (and its BadRequest violations) is at most this many
printable ASCII characters."""
LONE_SURROGATE = "\ud800"
_HOSTILE_ALPHABETS = (
    "x", "%", "\u4e2d\u6587", "\U0001f680", "\\\"", "\x00\n\t", "\u00e9%\U0010fffd\u202e",
)


def long_text(rng: random.Random, low: int = 300) -> str:
    """A long value errors might quote back: thousands of characters of an alphabet that
    costs the most on the wire (multi-byte characters, "%", escapes, control characters)."""
    alphabet = rng.choice(_HOSTILE_ALPHABETS)
    return (alphabet * (rng.randint(low, 40_000) // len(alphabet) + 1))[: rng.randint(low, 40_000)]


# -- valid bases -------------------------------------------------------------------------------


def base_pod(rng: random.Random, uid: str) -> PodSpec:
    containers: list[ContainerSpec] = []
    for index in range(rng.randint(0, 3)):
        kind = SIDECAR if rng.random() < 0.4 else INIT
        containers.append(ContainerSpec(f"{kind}-{index}", kind, _grants(rng)))
    for index in range(rng.randint(1, 3)):
        containers.append(ContainerSpec(f"app-{index}", APP, _grants(rng)))
    return PodSpec(uid, NAMESPACE, f"bad-{uid}", NODE, tuple(containers))


def _grants(rng: random.Random) -> tuple[GrantSpec, ...]:
    return tuple(GrantSpec(uuid, rng.randint(0, 8) * 1024, rng.randint(0, 10) * 10)
                 for uuid in UUIDS[:rng.randint(0, 2)])


def base_snapshot(rng: random.Random, pod: PodSpec) -> Snapshot:
    phase = rng.choice(("Pending", "Running"))
    inits = tuple(Status(c.name, rng.choice(("running", "waiting", "terminated")),
                         rng.choice((0, 0, 1)), rng.randint(0, 3)) for c in pod.init_list)
    apps = tuple(Status(c.name, "running" if phase == "Running" else "waiting")
                 for c in pod.apps)
    return Snapshot(phase, inits, apps)


# -- poisons of the typed pod ------------------------------------------------------------------

Poison = Callable[[random.Random, Any], str]


def _some_container(rng: random.Random, pod: types_pb2.Pod) -> types_pb2.Container:
    return pod.containers[rng.randrange(len(pod.containers))]


def _add_grant(rng: random.Random, pod: types_pb2.Pod, **fields: Any) -> None:
    grant = _some_container(rng, pod).grants.add(uuid=UUIDS[0], device_type="NVIDIA",
                                                 memory_mib=1024)
    for key, value in fields.items():
        setattr(grant, key, value)


def _add_status(rng: random.Random, pod: types_pb2.Pod, **fields: Any) -> None:
    statuses = rng.choice((pod.status.init_container_statuses, pod.status.container_statuses))
    status = statuses.add(name=_some_container(rng, pod).name,
                          state=types_pb2.CONTAINER_STATE_RUNNING)
    for key, value in fields.items():
        setattr(status, key, value)


def _long_duplicate_names(rng: random.Random, pairs: int) -> list[str]:
    """Each long name twice (every pair a problem the error must name and bound): one text
    per pair, since two texts drawn apart are the same only by chance, and a pod whose
    pairs all differ is no malformed pod."""
    names = [f"{long_text(rng, 100)[:300]}{pair}" for pair in range(pairs)]
    return [name for name in names for _ in range(2)]


TYPED_POISONS: dict[str, Poison] = {
    "empty uid": lambda rng, pod: setattr(pod, "uid", ""),
    "empty namespace": lambda rng, pod: setattr(pod, "namespace", ""),
    "empty container name": lambda rng, pod: setattr(_some_container(rng, pod), "name", ""),
    "duplicate container name": lambda rng, pod: pod.containers.add(
        name=pod.containers[0].name, container_class=types_pb2.CONTAINER_CLASS_APP),
    "container class": lambda rng, pod: setattr(
        _some_container(rng, pod), "container_class", rng.choice((0, 4, 99, -1, INT32_MAX))),
    "grant uuid": lambda rng, pod: _add_grant(
        rng, pod, uuid=rng.choice(("", "a,b", "x:y", "u;v", "GPU-0;GPU-1,"))),
    "grant memory": lambda rng, pod: _add_grant(
        rng, pod, memory_mib=rng.choice((-1, -(2**63), INT32_MAX + 1, INT64_MAX))),
    "grant cores": lambda rng, pod: _add_grant(
        rng, pod, core_percent=rng.choice((-1, 101, INT32_MAX, -(2**31)))),
    "grant slots": lambda rng, pod: _add_grant(
        rng, pod, slots=rng.choice((-1, -(2**31), 65_537, INT32_MAX))),
    "request count": lambda rng, pod: _some_container(rng, pod).requests.add(
        vendor="NVIDIA", count=rng.choice((-1, -(2**31), 257, INT32_MAX))),
    "request memory": lambda rng, pod: _some_container(rng, pod).requests.add(
        vendor="NVIDIA", count=1, memory_mib=rng.choice((-1, INT64_MAX, INT32_MAX + 1))),
    "request percent": lambda rng, pod: _some_container(rng, pod).requests.add(
        vendor="NVIDIA", count=1, memory_percent=rng.choice((101, -5, INT32_MAX))),
    "request cores": lambda rng, pod: _some_container(rng, pod).requests.add(
        vendor="NVIDIA", count=1, core_percent=rng.choice((101, -1))),
    "request vendor": lambda rng, pod: _some_container(rng, pod).requests.add(vendor="", count=1),
    "duplicate request vendor": lambda rng, pod: _some_container(rng, pod).requests.extend(
        [types_pb2.DeviceRequest(vendor="NVIDIA", count=1)] * 2),
    "status name": lambda rng, pod: _add_status(rng, pod, name=""),
    "status restarts": lambda rng, pod: _add_status(rng, pod, restart_count=rng.choice(
        (-1, -(2**31)))),
    "status state": lambda rng, pod: _add_status(rng, pod, state=rng.choice((4, 9, -3))),
    "phase": lambda rng, pod: setattr(pod.status, "phase", rng.choice((6, 42, -1))),
    "too many containers": lambda rng, pod: pod.containers.extend(
        types_pb2.Container(name=f"c{i}", container_class=types_pb2.CONTAINER_CLASS_APP)
        for i in range(rng.randint(257, 2000))),
    "too many grants": lambda rng, pod: _some_container(rng, pod).grants.extend(
        [types_pb2.DeviceGrant(uuid=UUIDS[0], memory_mib=1)] * rng.randint(65, 5000)),
    "too many requests": lambda rng, pod: _some_container(rng, pod).requests.extend(
        types_pb2.DeviceRequest(vendor=f"v{i}", count=1) for i in range(rng.randint(17, 500))),
    "too many statuses": lambda rng, pod: pod.status.init_container_statuses.extend(
        types_pb2.ContainerStatus(name=f"s{i}") for i in range(rng.randint(257, 3000))),
    "empty annotation key": lambda rng, pod: pod.annotations.update({"": "x"}),
    # Long values an error quotes back: the answer must stay INVALID_ARGUMENT within bounds.
    "long grant uuid with a separator": lambda rng, pod: _add_grant(
        rng, pod, uuid=long_text(rng) + rng.choice(",:;")),
    "long duplicate container name": lambda rng, pod: pod.containers.extend(
        [types_pb2.Container(name=(name := long_text(rng)),
                             container_class=types_pb2.CONTAINER_CLASS_APP),
         types_pb2.Container(name=name, container_class=types_pb2.CONTAINER_CLASS_APP)]),
    "long duplicate request vendor": lambda rng, pod: _some_container(rng, pod).requests.extend(
        [types_pb2.DeviceRequest(vendor=long_text(rng), count=1)] * 2),
    "many long problems": lambda rng, pod: pod.containers.extend(
        types_pb2.Container(name=name, container_class=types_pb2.CONTAINER_CLASS_APP)
        for name in _long_duplicate_names(rng, rng.randint(10, 100))),
    "annotations too big": lambda rng, pod: pod.annotations.update(
        {f"k{i}": "v" * 70_000 for i in range(4)}),
}


def typed_noise(rng: random.Random, pod: types_pb2.Pod) -> None:
    """Odd but individually valid values."""
    for _ in range(rng.randint(0, 3)):
        choice = rng.randrange(5)
        if choice == 0:
            pod.name = rng.choice(ODD_TEXT)
        elif choice == 1:
            pod.annotations[rng.choice(ODD_TEXT)[:300] or "k"] = rng.choice(ODD_TEXT)
        elif choice == 2 and pod.containers:
            container = _some_container(rng, pod)
            if container.grants:
                container.grants[0].memory_mib = INT32_MAX
                container.grants[0].device_type = rng.choice(ODD_TEXT)
        elif choice == 3:
            pod.status.init_container_statuses.add(
                name=rng.choice(ODD_TEXT), state=types_pb2.CONTAINER_STATE_TERMINATED,
                exit_code=rng.choice((-(2**31), INT32_MAX)), restart_count=INT32_MAX)
        else:
            pod.terminating = True


# A pod being admitted may have no uid yet (the API server assigns it after the webhooks).
NOT_MALFORMED_AT_ADMISSION = frozenset({"empty uid", "uid missing", "uid empty"})


def _poison(rng: random.Random, poisons: dict[str, Any], admission: bool) -> tuple[str, Any]:
    choices = sorted((label, poison) for label, poison in poisons.items()
                     if not (admission and label in NOT_MALFORMED_AT_ADMISSION))
    return rng.choice(choices)


def poisoned_typed_pod(
    rng: random.Random, uid: str, admission: bool = False
) -> tuple[types_pb2.Pod, str]:
    spec = base_pod(rng, uid)
    pod = pod_message(spec, base_snapshot(rng, spec))
    typed_noise(rng, pod)
    label, poison = _poison(rng, TYPED_POISONS, admission)
    poison(rng, pod)
    return pod, label


# -- poisons of the Kubernetes Pod JSON --------------------------------------------------------


def _allocation_garbage(rng: random.Random, containers: int) -> str:
    bad_entries = (
        "GPU-bad-0,NVIDIA,abc,0:", "GPU-bad-0,NVIDIA,100:", "GPU-bad-0,NVIDIA,-5,0:",
        "GPU-bad-0,NVIDIA,100,101:", "GPU-bad-0,NVIDIA,99999999999,0:", ",NVIDIA,1,1:",
        "GPU-bad-0,NVIDIA,1,1,x:", "GPU-bad-0,NVIDIA, 1,1:", "GPU-bad-0,NVIDIA,1,1,2,3:",
        "GPU-bad-0,NVIDIA,0x10,1:", "GPU-bad-0,NVIDIA,1\u0660,1:",
    )
    choice = rng.randrange(3)
    if choice == 0:
        # A grant at a position the pod does not have.
        return ";" * (containers + rng.randint(0, 3)) + "GPU-bad-0,NVIDIA,1,1:;"
    pieces = [rng.choice(bad_entries)]
    for _ in range(rng.randint(0, 6)):
        pieces.append(rng.choice(("GPU-bad-1,NVIDIA,1024,10:", ";", ":", rng.choice(ODD_TEXT)[:20]
                                  .replace(",", "").replace(":", "").replace(";", ""))))
    rng.shuffle(pieces)
    # The malformed entry must stay one entry: keep separators around it.
    return ";".join(pieces) if choice == 1 else ":".join(pieces)


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["metadata"]


def _spec_containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return obj["spec"]["containers"]


def _json_status(rng: random.Random, obj: dict[str, Any], entry: dict[str, Any]) -> None:
    status = obj.setdefault("status", {})
    status.setdefault(rng.choice(("initContainerStatuses", "containerStatuses")), []).append(entry)


JsonPoison = Callable[[random.Random, dict[str, Any]], str | bytes | None]

JSON_POISONS: dict[str, JsonPoison] = {
    "uid missing": lambda rng, obj: _meta(obj).pop("uid") and None,
    "uid empty": lambda rng, obj: _meta(obj).update(uid="") or None,
    "uid not a string": lambda rng, obj: _meta(obj).update(
        uid=rng.choice((123, [], {}, True, 1.5))) or None,
    "metadata not an object": lambda rng, obj: obj.update(
        metadata=rng.choice(("x", [], 5, True))) or None,
    "annotation not a string": lambda rng, obj: _meta(obj)["annotations"].update(
        {"hami.io/x": rng.choice((1, None, [], {"a": 1}, False))}) or None,
    "allocation garbage": lambda rng, obj: _meta(obj)["annotations"].update(
        {ALLOCATED: _allocation_garbage(rng, len(_spec_containers(obj)) + len(
            obj["spec"].get("initContainers", [])))}) or None,
    "containers not a list": lambda rng, obj: obj["spec"].update(
        containers=rng.choice(({"a": 1}, "x", 7))) or None,
    "too many containers": lambda rng, obj: obj["spec"].update(containers=[
        {"name": f"c{i}"} for i in range(rng.randint(257, 1500))]) or None,
    "container not an object": lambda rng, obj: _spec_containers(obj).append(
        rng.choice(("x", 1, [], None))) and None,
    "container without a name": lambda rng, obj: _spec_containers(obj).append(
        {"image": "x"}) and None,
    "duplicate container name": lambda rng, obj: _spec_containers(obj).append(
        {"name": _spec_containers(obj)[0]["name"]}) and None,
    "phase unknown": lambda rng, obj: obj.setdefault("status", {}).update(
        phase=rng.choice(("Exploded", "running", "\u0000", "Succeeded "))) or None,
    "status restartCount": lambda rng, obj: _json_status(rng, obj, {
        "name": "app-0", "restartCount": rng.choice((-1, "3", 2**40, 1.5, True))}),
    "status without a name": lambda rng, obj: _json_status(rng, obj, {"restartCount": 1}),
    "status exitCode": lambda rng, obj: _json_status(rng, obj, {
        "name": "app-0", "state": {"terminated": {"exitCode": rng.choice(
            ("0", 2**40, -(2**40), 0.5))}}}),
    "status state not an object": lambda rng, obj: _json_status(rng, obj, {
        "name": "app-0", "state": rng.choice(("running", 1, []))}),
    "bad quantity": lambda rng, obj: _spec_containers(obj)[0].setdefault(
        "resources", {}).setdefault("limits", {}).update({
            rng.choice(("nvidia.com/gpumem", "nvidia.com/gpu", "nvidia.com/gpucores")):
            rng.choice(("12Zi", "--1", "NaN", "1e", "0x10", "", "1 Gi", [], {"v": 1}, True))})
        or None,
    # Quantities that once read as 0 cores or as no GPU (issue 15): refused with their reading.
    "cores not a whole percent": lambda rng, obj: _spec_containers(obj)[0].update(resources={
        "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024",
                   "nvidia.com/gpucores": rng.choice(("1500m", "1.5", "-5", "0.5e0", "1n"))}})
        or None,
    "memory beyond any device": lambda rng, obj: _spec_containers(obj)[0].update(resources={
        "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": rng.choice(
            ("2Gi", "1e10", "9999999999999Gi", "2147483648", "-1", "1.5"))}}) or None,
    "count not whole devices": lambda rng, obj: _spec_containers(obj)[0].update(resources={
        "limits": {"nvidia.com/gpu": rng.choice(("500m", "1.5", "-1", "257", "1e400"))}})
        or None,
    "not json": lambda rng, obj: rng.choice((
        b"", b"{", b"null", b"[]", b"123", b'"pod"', b"\xff\xfe\xfd",
        b'{"metadata":{"uid":"\xff"}}',
        json.dumps(obj).encode()[: rng.randint(1, 200)], bytes(rng.randrange(256)
                                                              for _ in range(rng.randint(1, 300))),
    )),
    "deeply nested": lambda rng, obj: b"[" * rng.randint(10_000, 200_000),
    "long phase": lambda rng, obj: obj.setdefault("status", {}).update(
        phase=long_text(rng)) or None,
    "long quantity": lambda rng, obj: _spec_containers(obj)[0].update(resources={
        "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": long_text(rng)}}) or None,
    "long duplicate container name": lambda rng, obj: _spec_containers(obj).extend(
        [{"name": (name := long_text(rng))}, {"name": name}]) and None,
    "long allocation garbage": lambda rng, obj: _meta(obj)["annotations"].update(
        {ALLOCATED: f"GPU-bad-0,NVIDIA,{long_text(rng)},0:;"}) or None,
    "lone surrogate in a string": lambda rng, obj: _with_lone_surrogate(rng, obj),
    "nested object": lambda rng, obj: json.dumps(obj)[:-1].encode()
    + b',"x":' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}",
}


def string_places(document: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Where a decoded JSON document holds text: the path of every string value, and of every
    key (a path ending in ``KEY``)."""
    if isinstance(document, str):
        yield path
    elif isinstance(document, dict):
        for key, value in document.items():
            yield (*path, key, KEY)
            yield from string_places(value, (*path, key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            yield from string_places(value, (*path, index))


KEY = object()
"""The last step of a ``string_places`` path that names a key rather than its value."""


def replace_text(document: Any, place: tuple[Any, ...], text: Callable[[str], str]) -> None:
    """Replaces the string at ``place`` (a value, or a key keeping its value and position)."""
    *parents, last = place
    if last is KEY:
        *parents, key = parents
        target = document
        for step in parents:
            target = target[step]
        items = list(target.items())
        target.clear()
        target.update((text(k) if k == key else k, v) for k, v in items)
        return
    target = document
    for step in parents:
        target = target[step]
    target[last] = text(target[last])


def _with_lone_surrogate(rng: random.Random, obj: dict[str, Any]) -> None:
    """A lone surrogate into one of the pod's strings, keys included (serialised by json.dumps
    as the six characters \\ud800, the way a client can write it)."""
    places = list(string_places(obj))
    place = places[rng.randrange(len(places))]
    cut = rng.randint(0, 3)
    replace_text(obj, place, lambda old: old[:cut] + LONE_SURROGATE + old[cut:])


def poisoned_pod_json(rng: random.Random, uid: str, admission: bool = False) -> tuple[bytes, str]:
    spec = base_pod(rng, uid)
    obj = pod_json_object(spec, base_snapshot(rng, spec))
    if rng.random() < 0.5:
        _meta(obj)["annotations"][rng.choice(ODD_TEXT)[:200] or "k"] = rng.choice(ODD_TEXT)
    label, poison = _poison(rng, JSON_POISONS, admission)
    raw = poison(rng, obj)
    if isinstance(raw, bytes):
        return raw, label
    return json.dumps(obj, ensure_ascii=rng.random() < 0.5).encode(
        "utf-8", "surrogatepass"), label


# -- nodes, quotas and the rest ----------------------------------------------------------------


def poisoned_node(rng: random.Random) -> tuple[usage_pb2.RegisterNodeRequest, str]:
    devices = [device_message(f"GPU-new-{i}", i) for i in range(rng.randint(1, 4))]
    choice = rng.randrange(9)
    if choice == 0:
        return usage_pb2.RegisterNodeRequest(
            node_name="", inventory=types_pb2.NodeInventory(devices=devices)), "node name empty"
    if choice == 1:
        return usage_pb2.RegisterNodeRequest(node_name="new-node"), "no node source"
    if choice == 2:
        devices[0].uuid = rng.choice(("", "a,b", "x:y", "p;q"))
        label = "device uuid"
    elif choice == 3:
        devices.append(device_message(devices[0].uuid, 9))
        label = "duplicate device"
    elif choice == 4:
        field = rng.choice(("memory_total_mib", "cores_total", "slots_total", "index"))
        setattr(devices[0], field, rng.choice((-1, -(2**31))) if field != "memory_total_mib"
                else rng.choice((-1, INT64_MAX, INT32_MAX + 1)))
        label = "device totals"
    elif choice == 5:
        devices = [device_message(f"GPU-many-{i}", i) for i in range(rng.randint(257, 3000))]
        label = "too many devices"
    else:
        return poisoned_node_json(rng)
    return usage_pb2.RegisterNodeRequest(
        node_name="new-node", inventory=types_pb2.NodeInventory(devices=devices)), label


def poisoned_node_json(rng: random.Random) -> tuple[usage_pb2.RegisterNodeRequest, str]:
    info = [{"id": f"GPU-json-{i}", "index": i, "count": 10, "devmem": 24576, "devcore": 100,
             "type": "NVIDIA A10", "numa": 0, "mode": "hami-core", "health": True}
            for i in range(rng.randint(1, 3))]
    node: dict[str, Any] = {"apiVersion": "v1", "kind": "Node",
                            "metadata": {"name": "json-node", "annotations": {}}}
    choice = rng.randrange(10)
    register: Any = info
    if choice == 0:
        node["metadata"].pop("name")
        label = "node json without a name"
    elif choice == 1:
        register = rng.choice(("[", "{}", "1,2,3", "GPU-0,10,24576,100,NVIDIA-A10,0,true:"))
        label = "register not a device list"
    elif choice == 2:
        info[0][rng.choice(("devmem", "count", "devcore", "index"))] = rng.choice(
            (-1, "x", 2**40, 1.5, []))
        label = "register device field"
    elif choice == 3:
        info[0]["id"] = rng.choice(("", "a,b", 5, None))
        label = "register device id"
    elif choice == 4:
        info.append(dict(info[0]))
        label = "register duplicate id"
    elif choice == 5:
        register = [dict(info[0], id=f"GPU-{i}") for i in range(rng.randint(257, 1000))]
        label = "register too many devices"
    elif choice == 6:
        node["metadata"]["annotations"] = rng.choice(("x", [1], 5))
        label = "annotations not an object"
    elif choice == 7:
        info[0][rng.choice(("id", "type", "mode"))] = rng.choice(("GPU-", "NVIDIA ", "")) + (
            LONE_SURROGATE)
        label = "register lone surrogate"
    elif choice == 8:
        info[0].update(type=long_text(rng), devmem=long_text(rng))
        label = "register long values"
    else:
        raw = rng.choice((b"", b"[]", b"{", b"\xff", b"[" * 100_000, b'"node"'))
        return usage_pb2.RegisterNodeRequest(kubernetes_node_json=raw), "node not json"
    if choice != 6:
        node["metadata"]["annotations"][REGISTER] = (
            register if isinstance(register, str) else json.dumps(register))
    return usage_pb2.RegisterNodeRequest(kubernetes_node_json=json.dumps(node).encode()), label


def poisoned_quota(rng: random.Random) -> tuple[usage_pb2.SetQuotaRequest, str]:
    limits = {"limits.nvidia.com/gpumem": rng.randint(0, 10**6)}
    choice = rng.randrange(3)
    if choice == 0:
        return usage_pb2.SetQuotaRequest(namespace="", limits=limits), "quota namespace empty"
    if choice == 1:
        limits[rng.choice(("limits.nvidia.com/gpumemory", "requests.nvidia.com/gpu", "",
                           *ODD_TEXT))[:300] if rng.random() < 0.7 else long_text(rng)] = 1
        return usage_pb2.SetQuotaRequest(namespace=NAMESPACE, limits=limits), "quota key"
    if rng.random() < 0.5:
        limits[rng.choice(sorted(limits))] = rng.choice((10**12 + 1, 2**62, INT64_MAX))
        return usage_pb2.SetQuotaRequest(namespace=NAMESPACE, limits=limits), "quota too large"
    limits[rng.choice(sorted(limits))] = rng.choice((-1, -(2**63)))
    return usage_pb2.SetQuotaRequest(namespace=NAMESPACE, limits=limits), "quota negative"


# -- one input ---------------------------------------------------------------------------------


class Stubs:
    def __init__(self, daemons: dict[str, Daemon]) -> None:
        options = {"max_message_bytes": 64 * 1024 * 1024}  # let oversized requests leave
        self.channels = [daemons[name].channel(**options)
                         for name in ("usage", "admission", "scheduler")]
        self.usage = usage_pb2_grpc.UsageRecorderStub(self.channels[0])
        self.admission = admission_pb2_grpc.AdmissionStub(self.channels[1])
        self.scheduler = scheduler_pb2_grpc.SchedulerStub(self.channels[2])

    def close(self) -> None:
        for channel in self.channels:
            channel.close()


def _pod_source(
    rng: random.Random, uid: str, admission: bool = False
) -> tuple[dict[str, Any], str]:
    if rng.random() < 0.5:
        pod, label = poisoned_typed_pod(rng, uid, admission)
        return {"pod": pod}, f"typed pod: {label}"
    raw, label = poisoned_pod_json(rng, uid, admission)
    return {"kubernetes_pod_json": raw}, f"pod json: {label}"


def make_input(rng: random.Random, stubs: Stubs, number: int) -> tuple[str, Any, Any, str]:
    """(daemon.method, callable, request, label) of one malformed input."""
    uid = f"bad-uid-{number}"
    roll = rng.randrange(100)
    if roll < 22:
        source, label = _pod_source(rng, uid)
        if rng.random() < 0.1:
            # Only the recorder knows the node's devices: a grant of another device is bad there.
            spec = base_pod(rng, uid)
            pod = pod_message(spec, base_snapshot(rng, spec))
            pod.containers[0].grants.add(uuid="GPU-not-there", device_type="NVIDIA")
            source, label = {"pod": pod}, "typed pod: grant on an unknown device"
        return "usage.RecordPod", stubs.usage.RecordPod, usage_pb2.RecordPodRequest(
            **source), label
    if roll < 40:
        source, label = _pod_source(rng, uid, admission=True)
        return "admission.CheckQuota", stubs.admission.CheckQuota, \
            admission_pb2.CheckQuotaRequest(**source), label
    if roll < 58:
        choice = rng.randrange(6)
        if choice < 4:
            source, label = _pod_source(rng, uid)
            names = [NODE]
        elif choice == 4:
            spec = base_pod(rng, uid)
            source, label = {"pod": pod_message(spec, base_snapshot(rng, spec))}, "node names"
            names = rng.choice(([""], ["x" * 254], [NODE, ""], [f"n{i}" for i in range(10_001)]))
        else:
            source, label, names = {}, "no pod source", [NODE]
        return "scheduler.Filter", stubs.scheduler.Filter, scheduler_pb2.FilterRequest(
            node_names=names, **source), label
    if roll < 72:
        choice = rng.randrange(6)
        if choice < 3:
            source, label = _pod_source(rng, uid)
            request = usage_pb2.ReserveRequest(node_name=NODE, **source)
        else:
            spec = base_pod(rng, uid)
            request = usage_pb2.ReserveRequest(
                pod=pod_message(spec, base_snapshot(rng, spec)), node_name=NODE)
            if choice == 3:
                # With something to reserve: a pod without grants is an OK "NoGrants" anywhere.
                request.pod.containers[0].grants.add(uuid=UUIDS[0], device_type="NVIDIA")
                request.node_name = rng.choice(("", "not-registered", "\u202e"))
                label = "reserve node"
            elif choice == 4:
                request.container_grants.extend(
                    [types_pb2.ContainerGrants()] * (len(spec.containers) + rng.randint(1, 300)))
                label = "reserve positions"
            else:
                request.container_grants.extend(
                    types_pb2.ContainerGrants(container_name=c.name) for c in spec.containers)
                grant = request.container_grants[0].grants.add(uuid=UUIDS[0], memory_mib=1)
                field = rng.choice(("uuid", "memory_mib", "core_percent", "container_name"))
                if field == "uuid":
                    grant.uuid = rng.choice(("", "GPU-unknown", "a;b"))
                elif field == "memory_mib":
                    grant.memory_mib = rng.choice((-1, INT64_MAX))
                elif field == "core_percent":
                    grant.core_percent = rng.choice((101, -7))
                else:
                    request.container_grants[0].container_name = "someone-else"
                label = f"reserve grant {field}"
        return "usage.Reserve", stubs.usage.Reserve, request, label
    if roll < 84:
        request, label = poisoned_node(rng)
        return "usage.RegisterNode", stubs.usage.RegisterNode, request, label
    if roll < 94:
        request, label = poisoned_quota(rng)
        return "usage.SetQuota", stubs.usage.SetQuota, request, label
    if roll < 97:
        return "usage.ForgetPod", stubs.usage.ForgetPod, usage_pb2.ForgetPodRequest(), \
            "forget without a uid"
    if roll < 99:
        return "usage.GetPodUsage", stubs.usage.GetPodUsage, usage_pb2.GetPodUsageRequest(), \
            "read without a uid"
    # An oversized message (over the 4 MiB limit) to a random daemon.
    big = b"x" * (MAX_MESSAGE_BYTES + rng.randint(1, 1024 * 1024))
    target = rng.randrange(3)
    if target == 0:
        return "usage.RecordPod", stubs.usage.RecordPod, usage_pb2.RecordPodRequest(
            kubernetes_pod_json=big), "oversized"
    if target == 1:
        return "admission.CheckQuota", stubs.admission.CheckQuota, \
            admission_pb2.CheckQuotaRequest(kubernetes_pod_json=big), "oversized"
    return "scheduler.Filter", stubs.scheduler.Filter, scheduler_pb2.FilterRequest(
        kubernetes_pod_json=big, node_names=[NODE]), "oversized"


def check_answer(method: str, label: str, request: Any, call: Any) -> str:
    """Sends one input; returns the status code name, raising AssertionError on a bad answer."""
    failure: grpc.RpcError | None = None
    try:
        call(request, timeout=RPC_TIMEOUT_S)
    except grpc.RpcError as error:
        failure = error
    if failure is None:
        raise AssertionError(f"{method} accepted a malformed input ({label}): "
                             f"{_shown(request)}")
    code, details = failure.code(), failure.details() or ""
    where = f"{method} ({label}): {code.name} {details[:300]!r}"
    if label == "oversized":
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, where
        return code.name
    assert code == grpc.StatusCode.INVALID_ARGUMENT, where
    assert len(details) <= MAX_MESSAGE_CHARS, f"{len(details)} characters: {where}"
    assert details.isascii() and details.isprintable(), where
    status = rpc_status.from_call(failure)
    assert status is not None, f"no google.rpc.Status detail: {where}"
    violations = []
    for detail in status.details:
        bad_request = error_details_pb2.BadRequest()
        if detail.Unpack(bad_request):
            violations.extend(bad_request.field_violations)
    assert violations, f"no BadRequest field violations: {where}"
    assert sum(len(v.field) + len(v.description) + 2 for v in violations) <= MAX_MESSAGE_CHARS, (
        where)
    for violation in violations:
        assert PATH.match(violation.field) and violation.description, (violation, where)
    assert violations[0].field in details, where
    return code.name


def _shown(request: Any) -> str:
    text = str(request)
    return text if len(text) < 2000 else text[:2000] + f"... ({len(text)} characters)"


# -- the AdmissionReview endpoint -------------------------------------------------------------


def _review(obj: Any, namespace: str = NAMESPACE) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "review-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE", "namespace": namespace, "object": obj}}


def malformed_review(rng: random.Random, number: int) -> tuple[bytes, str, int]:
    """(body, label, expected HTTP status): 400 for a broken review, 413 for an oversized one,
    200 with ``allowed: false`` and code 400 for a well-formed review of a malformed pod."""
    choice = rng.randrange(40)
    if choice < 4:
        return rng.choice((b"", b"{", b"[]", b"null", b"\xff\xfe", b"[" * rng.randint(
            10_000, 100_000), b'{"a":' * 3000)), "review not json", 400
    if choice < 8:
        review = _review({})
        field = rng.choice(("apiVersion", "kind", "request", "uid"))
        if field == "uid":
            review["request"]["uid"] = rng.choice(("", 5, None))
        else:
            review[field] = rng.choice(("admission.k8s.io/v2", "Pod", 5, None, []))
        return json.dumps(review).encode(), f"review {field}", 400
    if choice == 8:
        return b"{" + b" " * (1024 * 1024 + rng.randint(1, 100_000)) + b"}", "review size", 413
    spec = base_pod(rng, f"review-{number}")
    obj = pod_json_object(spec, base_snapshot(rng, spec))
    # A pod being created has not been placed: it carries none of the scheduler's annotations
    # (one that does is refused for that first; "allocation garbage" puts one back).
    for key in scheduler_owned_annotations():
        obj["metadata"]["annotations"].pop(key, None)
    # Only pods that ask for a GPU are checked; make sure this one does.
    obj["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1",
                                                            "nvidia.com/gpumem": "1024"}}
    label, poison = _poison(rng, {k: v for k, v in JSON_POISONS.items()
                                  if k not in ("not json", "deeply nested", "nested object",
                                               "metadata not an object", "too many containers",
                                               "containers not a list")}, admission=True)
    poison(rng, obj)
    # Text UTF-8 cannot carry is refused with the body's decoding (the API server, whose
    # encoder writes valid UTF-8 only, never sends it): HTTP 400 naming the string.
    expected = 400 if label == "lone surrogate in a string" else 200
    return json.dumps(_review(obj)).encode(), f"review pod: {label}", expected


class Reviewer:
    """POSTs AdmissionReviews over one kept-alive HTTPS connection (re-opened when the server
    closes it, as it does after a 413)."""

    def __init__(self, admission: Daemon) -> None:
        context = ssl.create_default_context(cafile=str(admission.webhook_ca))
        port = int(admission.env["HAMI_ACCOUNTING_WEBHOOK_ADDR"].rsplit(":", 1)[1])
        self.connection = http.client.HTTPSConnection("127.0.0.1", port, context=context,
                                                      timeout=30)

    def check(self, body: bytes, label: str, expected: int) -> None:
        try:
            self.connection.request("POST", "/validate", body=body,
                                    headers={"Content-Type": "application/json"})
            answer = self.connection.getresponse()
            data = answer.read()
        except (OSError, http.client.HTTPException) as error:
            self.connection.close()
            raise AssertionError(f"webhook ({label}): no answer: {error!r}") from None
        where = f"webhook ({label}): HTTP {answer.status} {data[:300]!r}"
        assert answer.status == expected, where
        document = json.loads(data)
        if expected != 200:
            assert document.get("error"), where
            assert len(document["error"]) <= MAX_MESSAGE_CHARS, where
            return
        response = document["response"]
        message = response["status"]["message"]
        if label.endswith("allocation garbage"):
            # A created pod that carries an allocation, readable or not, wrote it itself.
            assert response["allowed"] is False and response["status"]["code"] == 403, where
            assert response["status"]["reason"] == "SchedulerOwnedAnnotation", where
            assert ALLOCATED in message, where
            return
        assert response["allowed"] is False and response["status"]["code"] == 400, where
        assert "request.object" in message and PATH.search(message), where
        assert len(message) <= MAX_MESSAGE_CHARS and message.isascii(), where

    def close(self) -> None:
        self.connection.close()


# -- the state that must not change ------------------------------------------------------------


def figures(stubs: Stubs) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    nodes = stubs.usage.GetNodeUsage(usage_pb2.GetNodeUsageRequest(), timeout=RPC_TIMEOUT_S)
    out["nodes"] = nodes.SerializeToString(deterministic=True)
    for namespace in (NAMESPACE, "default", ""):
        response = stubs.usage.GetNamespaceUsage(
            usage_pb2.GetNamespaceUsageRequest(namespace=namespace), timeout=RPC_TIMEOUT_S)
        out[f"namespace {namespace}"] = response.SerializeToString(deterministic=True)
    for uid in ("seed-1", "seed-2"):
        response = stubs.usage.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid=uid),
                                           timeout=RPC_TIMEOUT_S)
        out[f"pod {uid}"] = response.SerializeToString(deterministic=True)
    return out


class Watcher:
    """Counts every WatchUsage event: any event is a state change."""

    def __init__(self, stub: usage_pb2_grpc.UsageRecorderStub) -> None:
        self.events: list[Any] = []
        self._stream = stub.WatchUsage(usage_pb2.WatchUsageRequest(send_initial_state=True))
        self._first = threading.Event()
        self.initial = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for event in self._stream:
                if event.kind == usage_pb2.USAGE_EVENT_KIND_SNAPSHOT:
                    self.initial += 1
                elif event.kind == usage_pb2.USAGE_EVENT_KIND_INITIAL_STATE_COMPLETE:
                    self._first.set()  # subscribed: any later event is a change
                else:
                    self.events.append(event)
        except grpc.RpcError:
            pass

    def wait_ready(self) -> None:
        assert self._first.wait(10), "no initial state from WatchUsage"

    def close(self) -> None:
        self._stream.cancel()
        self._thread.join(5)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, Daemon]]:
    # WARNING keeps the logs to what matters: a malformed input is not worth a line.
    env = {name: {"HAMI_ACCOUNTING_LOG_LEVEL": "WARNING"}
           for name in ("usage", "admission", "scheduler")}
    pki = Pki.create(tmp_path / "pki")
    webhook = pki.leaf("webhook")
    env["admission"].update({
        "HAMI_ACCOUNTING_WEBHOOK_ADDR": f"127.0.0.1:{free_port()}",
        "HAMI_ACCOUNTING_WEBHOOK_CERT_FILE": str(webhook.cert_file),
        "HAMI_ACCOUNTING_WEBHOOK_KEY_FILE": str(webhook.key_file),
    })
    with running_stack(tmp_path, extra_env=env) as daemons:
        daemons["admission"].webhook_ca = pki.ca[0]
        yield daemons


def _seed_state(stubs: Stubs) -> None:
    stubs.usage.RegisterNode(usage_pb2.RegisterNodeRequest(
        node_name=NODE, inventory=types_pb2.NodeInventory(
            devices=[device_message(uuid, i) for i, uuid in enumerate(UUIDS)])),
        timeout=RPC_TIMEOUT_S)
    stubs.usage.SetQuota(usage_pb2.SetQuotaRequest(
        namespace=NAMESPACE, limits={"limits.nvidia.com/gpumem": 500_000}), timeout=RPC_TIMEOUT_S)
    for uid in ("seed-1", "seed-2"):
        spec = PodSpec(uid, NAMESPACE, uid, NODE, (
            ContainerSpec("init", INIT, (GrantSpec(UUIDS[0], 8192, 30),)),
            ContainerSpec("app", APP, (GrantSpec(UUIDS[1], 4096, 20),))))
        stubs.usage.RecordPod(usage_pb2.RecordPodRequest(
            pod=pod_message(spec, Snapshot("Pending"))), timeout=RPC_TIMEOUT_S)


def test_malformed_inputs_are_refused_naming_a_field(stack: dict[str, Daemon]) -> None:
    stubs = Stubs(stack)
    rng = random.Random(SEED)
    _seed_state(stubs)
    before = figures(stubs)
    watcher = Watcher(stubs.usage)
    watcher.wait_ready()
    counts: Counter[str] = Counter()
    labels: Counter[str] = Counter()
    failures: list[str] = []
    started = time.perf_counter()
    try:
        for number in range(INPUTS):
            method, call, request, label = make_input(rng, stubs, number)
            try:
                counts[f"{method} {check_answer(method, label, request, call)}"] += 1
            except AssertionError as error:
                failures.append(f"input {number}: {error}")
                if len(failures) >= 20:
                    break
            labels[label.split(": ")[-1]] += 1
            if number % 250 == 0:
                dead = [d.name for d in stack.values() if not d.alive]
                assert not dead, f"crashed after input {number}: {dead}\n" + "\n".join(
                    stack[name].log_tail() for name in dead)
        grpc_s = time.perf_counter() - started
        reviewer = Reviewer(stack["admission"])
        for number in range(WEBHOOK_INPUTS):
            body, label, expected = malformed_review(rng, number)
            try:
                reviewer.check(body, label, expected)
                counts[f"admission.webhook HTTP {expected}"] += 1
            except AssertionError as error:
                failures.append(f"review {number}: {error}")
                if len(failures) >= 20:
                    break
            labels[label.split(": ")[-1]] += 1
        reviewer.close()
        elapsed = time.perf_counter() - started
        assert not failures, f"{len(failures)} bad answers:\n" + "\n".join(failures)
        for daemon in stack.values():
            assert daemon.alive and daemon.healthy(), f"{daemon.name}:\n{daemon.log_tail()}"
        time.sleep(0.2)  # a late event would still arrive
        assert not watcher.events, f"state changed: {watcher.events[:3]}"
        assert figures(stubs) == before
    finally:
        watcher.close()
        stubs.close()
    for daemon in stack.values():
        log = daemon.log_text()
        assert "Traceback" not in log and '"level": "ERROR"' not in log, daemon.log_tail()
    report(
        "bad input",
        inputs=sum(counts.values()),
        per_rpc=dict(sorted(counts.items())),
        poisons=len(labels),
        grpc_seconds=round(grpc_s, 1),
        webhook_seconds=round(elapsed - grpc_s, 1),
    )
    assert sum(counts.values()) >= INPUTS + WEBHOOK_INPUTS


def test_undecodable_bytes_are_invalid_argument(stack: dict[str, Daemon]) -> None:
    targets = {
        "usage": "/hami.accounting.v1.UsageRecorder/RecordPod",
        "admission": "/hami.accounting.v1.Admission/CheckQuota",
        "scheduler": "/hami.accounting.v1.Scheduler/Filter",
    }
    for name, method in targets.items():
        with stack[name].channel() as channel:
            call = channel.unary_unary(method, request_serializer=lambda raw: raw,
                                       response_deserializer=lambda raw: raw)
            # Field 1 (pod), length 5, then bytes that are no message; then bad UTF-8 in uid.
            for raw in (b"\x0a\x05\xff\xfe\xfd\xfc\xfb", b"\x0a\x03\x0a\x01\xff"):
                with pytest.raises(grpc.RpcError) as refused:
                    call(raw, timeout=RPC_TIMEOUT_S)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (
                    name, refused.value.code(), refused.value.details())
        assert stack[name].healthy()


# -- hostile text in every string field ---------------------------------------------------------

TEXT_ROUNDS = sized(2, 10)
"""Hostile values per string field (each of a random alphabet and length)."""


def typed_string_places(message: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every string a populated typed message holds, nested messages and maps included, as
    paths of field names, indices and ("key", k) / ("value", k) for map entries."""
    for field, value in message.ListFields():
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            for key in value:
                if field.message_type.fields_by_name["key"].type == field.TYPE_STRING:
                    yield (*path, field.name, ("key", key))
                if field.message_type.fields_by_name["value"].type == field.TYPE_STRING:
                    yield (*path, field.name, ("value", key))
        elif field.type == field.TYPE_STRING:
            if field.is_repeated:
                yield from ((*path, field.name, index) for index in range(len(value)))
            else:
                yield (*path, field.name)
        elif field.type == field.TYPE_MESSAGE:
            if field.is_repeated:
                for index, item in enumerate(value):
                    yield from typed_string_places(item, (*path, field.name, index))
            else:
                yield from typed_string_places(value, (*path, field.name))


def set_typed_text(message: Any, place: tuple[Any, ...], text: str) -> None:
    *parents, field_name, last = place if not isinstance(place[-1], str) else (*place, None)
    target = message
    for step in parents:
        target = target[step] if isinstance(step, int) else getattr(target, step)
    if last is None:
        setattr(target, field_name, text)
    elif isinstance(last, int):
        getattr(target, field_name)[last] = text
    else:
        kind, key = last
        entries = getattr(target, field_name)
        if kind == "value":
            entries[key] = text
        else:
            entries[text] = entries.pop(key)


def _valid_requests(rng: random.Random) -> list[tuple[str, Callable[[Stubs], Any], Any]]:
    """One valid request of each kind a client can send, every string field filled."""
    spec = PodSpec("hostile-uid", NAMESPACE, "hostile", NODE, (
        ContainerSpec("init", INIT, (GrantSpec(UUIDS[0], 1024, 10),)),
        ContainerSpec("app", APP, (GrantSpec(UUIDS[1], 1024, 10),))))
    pod = pod_message(spec, Snapshot("Running", (Status("init", "terminated", 0, 0),),
                                     (Status("app", "running"),)),
                      annotations={"example.com/note": "x"})
    pod.containers[1].requests.add(vendor="NVIDIA", count=1, memory_mib=1024)
    pod_json = pod_json_object(spec, Snapshot("Pending"), annotations={"example.com/note": "x"})
    node_json = {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": "hostile-node", "labels": {"zone": "a"}, "annotations": {REGISTER: json.dumps([
            {"id": "GPU-h-0", "index": 0, "count": 10, "devmem": 24576, "devcore": 100,
             "type": "NVIDIA A10", "numa": 0, "mode": "hami-core", "health": True}])}}}
    grants = [types_pb2.ContainerGrants(container_name=c.name, grants=list(c.grants))
              for c in pod.containers]
    return [
        ("usage.RecordPod", lambda s: s.usage.RecordPod, usage_pb2.RecordPodRequest(pod=pod)),
        ("usage.Reserve", lambda s: s.usage.Reserve, usage_pb2.ReserveRequest(
            pod=pod, node_name=NODE, container_grants=grants)),
        ("usage.RegisterNode", lambda s: s.usage.RegisterNode, usage_pb2.RegisterNodeRequest(
            node_name="hostile-node", inventory=types_pb2.NodeInventory(
                devices=[device_message("GPU-h-1", 0)]))),
        ("usage.SetQuota", lambda s: s.usage.SetQuota, usage_pb2.SetQuotaRequest(
            namespace="hostile-ns", limits={"limits.nvidia.com/gpumem": 1024})),
        ("usage.ForgetPod", lambda s: s.usage.ForgetPod,
         usage_pb2.ForgetPodRequest(pod_uid="hostile-forgotten")),
        ("usage.ReleaseReservation", lambda s: s.usage.ReleaseReservation,
         usage_pb2.ReleaseReservationRequest(pod_uid="hostile-released")),
        ("usage.GetPodUsage", lambda s: s.usage.GetPodUsage,
         usage_pb2.GetPodUsageRequest(pod_uid="seed-1")),
        ("usage.GetNodeUsage", lambda s: s.usage.GetNodeUsage,
         usage_pb2.GetNodeUsageRequest(node_names=[NODE])),
        ("usage.GetNamespaceUsage", lambda s: s.usage.GetNamespaceUsage,
         usage_pb2.GetNamespaceUsageRequest(namespace=NAMESPACE)),
        ("admission.CheckQuota", lambda s: s.admission.CheckQuota,
         admission_pb2.CheckQuotaRequest(pod=pod)),
        ("scheduler.Filter", lambda s: s.scheduler.Filter,
         scheduler_pb2.FilterRequest(pod=pod, node_names=[NODE])),
        ("usage.RecordPod json", lambda s: s.usage.RecordPod, pod_json),
        ("admission.CheckQuota json", lambda s: s.admission.CheckQuota, pod_json),
        ("scheduler.Filter json", lambda s: s.scheduler.Filter, pod_json),
        ("usage.RegisterNode json", lambda s: s.usage.RegisterNode, node_json),
    ]


def _json_request(method: str, document: dict[str, Any]) -> Any:
    raw = json.dumps(document).encode()
    if method.startswith("usage.RegisterNode"):
        return usage_pb2.RegisterNodeRequest(kubernetes_node_json=raw)
    if method.startswith("usage.RecordPod"):
        return usage_pb2.RecordPodRequest(kubernetes_pod_json=raw)
    if method.startswith("admission"):
        return admission_pb2.CheckQuotaRequest(kubernetes_pod_json=raw)
    return scheduler_pb2.FilterRequest(kubernetes_pod_json=raw, node_names=[NODE])


def _bounded_answer(where: str, call: Any, request: Any, *, refused: bool) -> str:
    """Sends one request: OK, or INVALID_ARGUMENT within the documented bounds (always that
    when ``refused``); never INTERNAL, never RESOURCE_EXHAUSTED from the status' size."""
    try:
        call(request, timeout=RPC_TIMEOUT_S)
    except grpc.RpcError as error:
        code, details = error.code(), error.details() or ""
        assert code == grpc.StatusCode.INVALID_ARGUMENT, f"{where}: {code.name} {details[:300]!r}"
        assert len(details) <= MAX_MESSAGE_CHARS and details.isascii(), where
        assert details.isprintable(), where
        status = rpc_status.from_call(error)
        assert status is not None and status.message == details, where
        return code.name
    assert not refused, f"{where}: accepted"
    return "OK"


def test_hostile_text_in_every_string_field(stack: dict[str, Daemon]) -> None:
    """Every string field of every request a client can send (typed messages through their
    descriptors; the pod and node JSON through every string and key, the JSON annotations'
    entries included), replaced by long hostile text, and in JSON by text holding a lone
    surrogate: each answer is OK or INVALID_ARGUMENT within the documented bounds (a lone
    surrogate always INVALID_ARGUMENT), and the recorder still reads its whole state."""
    stubs = Stubs(stack)
    rng = random.Random(SEED + 1)
    _seed_state(stubs)
    counts: Counter[str] = Counter()
    places = 0
    try:
        for method, stub_of, base in _valid_requests(rng):
            call = stub_of(stubs)
            if isinstance(base, dict):
                documents = [(p, base) for p in string_places(base)]
                register = base["metadata"]["annotations"].get(REGISTER)
                for place in string_places(json.loads(register) if register else []):
                    documents.append((("register", *place), base))
                for place, document in documents:
                    places += 1
                    for round_number in range(TEXT_ROUNDS + 1):
                        mutated = json.loads(json.dumps(document))
                        lone = round_number == TEXT_ROUNDS
                        value = LONE_SURROGATE if lone else long_text(rng)
                        if place[0] == "register":
                            inner = json.loads(mutated["metadata"]["annotations"][REGISTER])
                            replace_text(inner, place[1:], lambda old, v=value: v)
                            mutated["metadata"]["annotations"][REGISTER] = json.dumps(inner)
                        else:
                            replace_text(mutated, place, lambda old, v=value: v)
                        where = f"{method} {place} {'lone surrogate' if lone else 'long'}"
                        counts[f"{method} " + _bounded_answer(
                            where, call, _json_request(method, mutated), refused=lone)] += 1
                continue
            for place in list(typed_string_places(base)):
                places += 1
                for _ in range(TEXT_ROUNDS):
                    mutated = type(base)()
                    mutated.CopyFrom(base)
                    set_typed_text(mutated, place, long_text(rng))
                    counts[f"{method} " + _bounded_answer(
                        f"{method} {place}", call, mutated, refused=False)] += 1
        # Whatever was accepted is read back: every node, every namespace, a new stream.
        figures(stubs)
        watcher = Watcher(stubs.usage)
        watcher.wait_ready()
        watcher.close()
        for daemon in stack.values():
            assert daemon.alive and daemon.healthy(), daemon.log_tail()
    finally:
        stubs.close()
    report("hostile text", places=places, answers=dict(sorted(counts.items())))
    assert places > 100
