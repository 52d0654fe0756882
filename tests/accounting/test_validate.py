"""Domain validation: every offending field named at once, huge inputs refused by length."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.errors import InvalidInputError
from accounting.limits import MAX_DEVICES_PER_CONTAINER, MAX_GRANT_SLOTS
from accounting.model import (
    Container,
    ContainerClass,
    ContainerState,
    ContainerStatus,
    Device,
    DeviceGrant,
    DeviceRequest,
    Pod,
)
from accounting.received_json import check_text, decode_json
from accounting.validate import validate_devices, validate_pod

INT32_MAX = 2_147_483_647


def good_pod() -> Pod:
    return Pod(
        uid="uid-1",
        namespace="team-a",
        name="trainer-0",
        containers=(
            Container(
                "fetch",
                ContainerClass.INIT,
                (DeviceRequest("NVIDIA", 1, 20480, 0, 10),),
                (DeviceGrant("GPU-0", "NVIDIA", 20480, 10),),
            ),
            Container("proxy", ContainerClass.SIDECAR),
            Container(
                "main",
                ContainerClass.APP,
                (DeviceRequest("NVIDIA", 1, 0, 50, 100),),
                (DeviceGrant("GPU-0", "NVIDIA", 12288, 100, slots=2),),
            ),
        ),
        init_container_statuses=(ContainerStatus("fetch", ContainerState.TERMINATED, 0),),
    )


def with_container(pod: Pod, index: int, **changes: object) -> Pod:
    containers = list(pod.containers)
    containers[index] = replace(containers[index], **changes)
    return replace(pod, containers=tuple(containers))


def test_a_valid_pod_passes() -> None:
    validate_pod(good_pod())


@dataclass(frozen=True)
class BadPodCase:
    name: str
    pod: Pod
    want: list[str]


BAD_POD_CASES = [
    BadPodCase(
        "empty uid and namespace",
        replace(good_pod(), uid="", namespace=""),
        ["pod.uid: must not be empty", "pod.namespace: must not be empty"],
    ),
    BadPodCase(
        "a namespace longer than a DNS label, a name and a uid longer than a DNS subdomain",
        replace(good_pod(), uid="u" * 254, namespace="n" * 64, name="p" * 254),
        [
            "pod.uid: at most 253 characters, got 254",
            "pod.namespace: at most 63 characters (a Kubernetes namespace is a DNS label), got 64",
            "pod.name: at most 253 characters (a pod's name is a DNS subdomain), got 254",
        ],
    ),
    BadPodCase(
        "negative grant memory",
        with_container(good_pod(), 0, grants=(DeviceGrant("GPU-0", "NVIDIA", -5, 10),)),
        ["pod.containers[0].grants[0].memory_mib: must be between 0 and 2147483647, got -5"],
    ),
    BadPodCase(
        "every int32 overflow of a request and a grant",
        with_container(
            good_pod(),
            2,
            requests=(DeviceRequest("NVIDIA", INT32_MAX + 1, INT32_MAX + 1, 101, 101),),
            grants=(DeviceGrant("GPU-0", "NVIDIA", INT32_MAX + 1, 101, INT32_MAX + 1),),
        ),
        [
            f"pod.containers[2].requests[0].count: must be between 0 and "
            f"{MAX_DEVICES_PER_CONTAINER}, got {INT32_MAX + 1}",
            f"pod.containers[2].requests[0].memory_mib: must be between 0 and {INT32_MAX}, "
            f"got {INT32_MAX + 1}",
            "pod.containers[2].requests[0].memory_percent: must be between 0 and 100, got 101",
            "pod.containers[2].requests[0].core_percent: must be between 0 and 100, got 101",
            f"pod.containers[2].grants[0].memory_mib: must be between 0 and {INT32_MAX}, "
            f"got {INT32_MAX + 1}",
            "pod.containers[2].grants[0].core_percent: must be between 0 and 100, got 101",
            f"pod.containers[2].grants[0].slots: must be between 0 and {MAX_GRANT_SLOTS}, "
            f"got {INT32_MAX + 1}",
        ],
    ),
    BadPodCase(
        "empty and duplicate container names",
        with_container(with_container(good_pod(), 1, name=""), 2, name="fetch"),
        [
            "pod.containers[1].name: must not be empty",
            'pod.containers[2].name: duplicate container name "fetch", also pod.containers[0]',
        ],
    ),
    BadPodCase(
        "a grant without a uuid and a uuid that would break the annotation",
        with_container(
            good_pod(),
            0,
            grants=(DeviceGrant("", "NVIDIA", 1, 1), DeviceGrant("GPU:0", "NVIDIA", 1, 1)),
        ),
        [
            "pod.containers[0].grants[0].uuid: must not be empty",
            "pod.containers[0].grants[1].uuid: must not contain any of ',:;', got \"GPU:0\"",
        ],
    ),
    BadPodCase(
        "two requests for one vendor and one without a vendor",
        with_container(
            good_pod(),
            0,
            requests=(
                DeviceRequest("NVIDIA", 1),
                DeviceRequest("NVIDIA", 1),
                DeviceRequest("", 1),
            ),
        ),
        [
            'pod.containers[0].requests[1].vendor: duplicate request for vendor "NVIDIA"',
            "pod.containers[0].requests[2].vendor: must not be empty",
        ],
    ),
    BadPodCase(
        "a negative restart count and a nameless status",
        replace(
            good_pod(), container_statuses=(ContainerStatus("", ContainerState.RUNNING, 0, -1),)
        ),
        [
            "pod.container_statuses[0].name: must not be empty",
            f"pod.container_statuses[0].restart_count: must be between 0 and {INT32_MAX}, got -1",
        ],
    ),
    BadPodCase(
        "a huge container list is refused by its length alone",
        replace(good_pod(), containers=(Container("", ContainerClass.APP),) * 100_000),
        ["pod.containers: at most 256 containers, got 100000"],
    ),
    BadPodCase(
        "a huge grant list is refused by its length alone",
        with_container(good_pod(), 0, grants=(DeviceGrant("", "NVIDIA", -1, -1),) * 10_000),
        ["pod.containers[0].grants: at most 64 grants, got 10000"],
    ),
    BadPodCase(
        "annotations larger than Kubernetes allows",
        replace(good_pod(), annotations={"big": "x" * 300_000}),
        ["pod.annotations: total size must be at most 262144 bytes, got 300003"],
    ),
]


@pytest.mark.parametrize("case", BAD_POD_CASES, ids=lambda case: case.name)
def test_validate_pod_names_every_offending_field(case: BadPodCase) -> None:
    with pytest.raises(InvalidInputError) as raised:
        validate_pod(case.pod)
    assert [str(violation) for violation in raised.value.violations] == case.want


def test_the_path_prefix_is_the_caller_s() -> None:
    with pytest.raises(InvalidInputError) as raised:
        validate_pod(replace(good_pod(), uid=""), path="kubernetes_pod_json")
    assert [v.path for v in raised.value.violations] == ["kubernetes_pod_json.uid"]


def test_a_pod_with_many_bad_fields_gives_a_bounded_error() -> None:
    bad = Container("", ContainerClass.APP, grants=(DeviceGrant("", "NVIDIA", -1, -1, -1),) * 64)
    with pytest.raises(InvalidInputError) as raised:
        validate_pod(replace(good_pod(), containers=(bad,) * 256))
    assert len(raised.value.violations) == 101
    assert raised.value.violations[-1].message.startswith("and ")


def test_valid_devices_pass() -> None:
    validate_devices([Device("GPU-0", "NVIDIA A10", 0, 10, 24576, 100)], "devices")


def test_validate_devices_names_every_offending_field() -> None:
    devices = [
        Device("GPU-0", "NVIDIA A10", 0, 10, 24576, 100),
        Device("GPU-0", "NVIDIA A10", -1, -10, INT32_MAX + 1, -100, vendor=""),
        Device("", "NVIDIA A10", 2, 10, 24576, 100),
    ]
    with pytest.raises(InvalidInputError) as raised:
        validate_devices(devices, "inventory.devices")
    assert [str(violation) for violation in raised.value.violations] == [
        'inventory.devices[1].uuid: duplicate device uuid "GPU-0", also inventory.devices[0]',
        f"inventory.devices[1].index: must be between 0 and {INT32_MAX}, got -1",
        f"inventory.devices[1].slots_total: must be between 0 and {INT32_MAX}, got -10",
        f"inventory.devices[1].memory_total_mib: must be between 0 and {INT32_MAX}, "
        f"got {INT32_MAX + 1}",
        f"inventory.devices[1].cores_total: must be between 0 and {INT32_MAX}, got -100",
        "inventory.devices[1].vendor: must not be empty",
        "inventory.devices[2].uuid: must not be empty",
    ]


def test_a_huge_inventory_is_refused_by_its_length() -> None:
    devices = [Device(f"GPU-{i}", "", 0, 0, 0, 0) for i in range(1000)]
    with pytest.raises(InvalidInputError) as raised:
        validate_devices(devices, "devices")
    assert str(raised.value) == "devices: at most 256 devices, got 1000"


_VALID_GRANTS = st.builds(
    DeviceGrant,
    uuid=st.from_regex(r"GPU-[0-9a-f]{1,8}", fullmatch=True),
    vendor=st.just("NVIDIA"),
    memory_mib=st.integers(0, INT32_MAX),
    core_percent=st.integers(0, 100),
    slots=st.integers(0, MAX_GRANT_SLOTS),
)


@settings(max_examples=200)
@given(st.lists(_VALID_GRANTS, max_size=63), st.integers(-(2**40), -1))
def test_one_negative_number_is_always_caught_at_its_path(
    grants: list[DeviceGrant], negative: int
) -> None:
    pod = with_container(
        good_pod(), 2, grants=(*grants, DeviceGrant("GPU-x", "NVIDIA", negative, 0))
    )
    with pytest.raises(InvalidInputError) as raised:
        validate_pod(pod)
    assert [v.path for v in raised.value.violations] == [
        f"pod.containers[2].grants[{len(grants)}].memory_mib"
    ]


# -- JSON text from outside: every decoded string is one UTF-8 can carry -----------------------

JSON_TEXT_CASES = [
    ("a lone high surrogate in a value", b'{"a": "x\\ud800"}', "doc.a"),
    ("a lone low surrogate in an array", b'{"a": ["ok", "\\udfff"]}', "doc.a[1]"),
    ("a lone surrogate in a key", b'{"k\\ud800": 1}', 'doc["k\\ud800"]'),
    ("a high surrogate followed by a non-surrogate", b'["\\ud800\\u0041"]', "doc[0]"),
    ("two high surrogates", b'["\\ud800\\ud800"]', "doc[0]"),
    ("a reversed pair", b'["\\udc00\\ud800"]', "doc[0]"),
    ("a surrogate in str input", '{"a": "\\udbff"}', "doc.a"),
    # json.loads decodes bytes with "surrogatepass": an encoded surrogate is one too.
    ("a surrogate encoded in UTF-8 bytes", b'{"a": "x\xed\xa0\x80"}', "doc.a"),
    ("a surrogate in UTF-16", '{"a": "\ud800"}'.encode("utf-16-le", "surrogatepass"), "doc.a"),
]


@pytest.mark.parametrize(("what", "raw", "path"), JSON_TEXT_CASES, ids=[c[0] for c in
                                                                          JSON_TEXT_CASES])
def test_json_text_holding_a_lone_surrogate_is_refused_naming_the_string(
    what: str, raw: bytes | str, path: str
) -> None:
    with pytest.raises(InvalidInputError) as refused:
        decode_json(raw, "doc")
    [violation] = refused.value.violations
    assert violation.path == path
    assert "UTF-8 can encode" in violation.message and str(refused.value).isascii()


@pytest.mark.parametrize("raw", [
    b'{"emoji": "\\ud83d\\ude80"}', b'{"escaped backslash": "\\\\ud800"}',
    '{"astral": "\U0010fffd", "nul": "\\u0000"}'.encode(), b'[1.5, "\\u00e9"]',
], ids=["a valid pair", "an escaped backslash", "astral and NUL", "numbers and BMP"])
def test_json_text_that_utf8_can_carry_decodes_as_json_loads_does(raw: bytes) -> None:
    assert decode_json(raw, "doc") == json.loads(raw)


@settings(max_examples=300, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=20,
))
def test_decoded_json_either_encodes_whole_or_is_refused_naming_a_string(document: object) -> None:
    """Any JSON (strings drawn from all of Unicode, surrogates included, written as JSON
    escapes): decode_json returns exactly what json.loads does when every string encodes,
    and otherwise refuses naming at least one path."""
    raw = json.dumps(document).encode()
    try:
        json.dumps(document, ensure_ascii=False).encode("utf-8")
        encodable = True
    except UnicodeEncodeError:
        encodable = False
    if encodable:
        assert decode_json(raw, "doc") == json.loads(raw)
        check_text(document, "doc")
        return
    with pytest.raises(InvalidInputError) as refused:
        decode_json(raw, "doc")
    assert all(v.path.startswith("doc") for v in refused.value.violations)
    with pytest.raises(InvalidInputError):
        check_text(document, "doc")
