"""HAMi wire formats: the W1–W9 vectors (docs/design.md §9), plus bad input."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accounting import hami_codec
from accounting.errors import InvalidInputError
from accounting.limits import MAX_GRANT_SLOTS
from accounting.model import Device, DeviceGrant, MigProfile

ALLOCATED = 'annotations["hami.io/vgpu-devices-allocated"]'
REGISTER = 'annotations["hami.io/node-nvidia-register"]'


def grant(uuid: str, memory_mib: int, core_percent: int, slots: int = 0) -> DeviceGrant:
    return DeviceGrant(uuid, "NVIDIA", memory_mib, core_percent, slots)


def paths(error: InvalidInputError) -> list[str]:
    return [violation.path for violation in error.violations]


# -- the W vectors --------------------------------------------------------------------------


@dataclass(frozen=True)
class EncodeCase:
    name: str
    per_container: list[list[DeviceGrant]]
    want: str


ENCODE_CASES = [
    EncodeCase(
        "W1 two app containers each on their own GPU",
        [[grant("GPU-A", 2500, 25)], [grant("GPU-B", 2500, 25)]],
        "GPU-A,NVIDIA,2500,25:;GPU-B,NVIDIA,2500,25:;",
    ),
    EncodeCase(
        "W2 a GPU-less init container still writes its semicolon",
        [[], [grant("GPU-A", 2500, 25)], [grant("GPU-B", 2500, 25)]],
        ";GPU-A,NVIDIA,2500,25:;GPU-B,NVIDIA,2500,25:;",
    ),
    EncodeCase(
        "W5 two devices in one container, then a container without a device",
        [[grant("A", 1000, 10), grant("B", 1000, 10)], []],
        "A,NVIDIA,1000,10:B,NVIDIA,1000,10:;;",
    ),
    EncodeCase(
        "W8 a collapsed entry writes its slots as the fifth field (#2877)",
        [[grant("A", 100, 10, slots=3)]],
        "A,NVIDIA,100,10,3:;",
    ),
    EncodeCase(
        "a single slot stays in HAMi's four-field form",
        [[grant("A", 100, 10, slots=1)]],
        "A,NVIDIA,100,10:;",
    ),
    EncodeCase("an empty pod encodes to the empty string", [], ""),
    EncodeCase("one container without a device is a lone semicolon", [[]], ";"),
]


@pytest.mark.parametrize("case", ENCODE_CASES, ids=lambda case: case.name)
def test_encode_pod_devices(case: EncodeCase) -> None:
    assert hami_codec.encode_pod_devices(case.per_container) == case.want


def test_encode_has_no_padding_bug_w7() -> None:
    # HAMi v2.10.0 on model-typed nodes wrote W7, which hands the init container GPU-A.
    w7_shifted = "GPU-A,NVIDIA,2500,25:;GPU-B,NVIDIA,2500,25:;"
    encoded = hami_codec.encode_pod_devices(
        [[], [grant("GPU-A", 2500, 25)], [grant("GPU-B", 2500, 25)]]
    )
    assert encoded != w7_shifted
    assert hami_codec.decode_container_grants(encoded, 3)[0] == ()


@dataclass(frozen=True)
class DecodeCase:
    name: str
    value: str
    want: tuple[tuple[DeviceGrant, ...], ...]


DECODE_CASES = [
    DecodeCase(
        "W3 the trailing semicolon gives one extra empty entry",
        "GPU-8dcd,NVIDIA,500,3:;GPU-ebe7,NVIDIA,500,3:;",
        ((grant("GPU-8dcd", 500, 3),), (grant("GPU-ebe7", 500, 3),), ()),
    ),
    DecodeCase("W6 the empty string is one empty entry", "", ((),)),
    DecodeCase(
        "W8 a fifth field is read as slots",
        "A,NVIDIA,100,10,3:;",
        ((grant("A", 100, 10, slots=3),), ()),
    ),
    DecodeCase(
        "W2 a leading empty entry keeps the init container's position",
        ";GPU-A,NVIDIA,2500,25:;GPU-B,NVIDIA,2500,25:;",
        ((), (grant("GPU-A", 2500, 25),), (grant("GPU-B", 2500, 25),), ()),
    ),
    DecodeCase(
        "W5 two devices in one entry",
        "A,NVIDIA,1000,10:B,NVIDIA,1000,10:;;",
        ((grant("A", 1000, 10), grant("B", 1000, 10)), (), ()),
    ),
    DecodeCase(
        "empty colon pieces are skipped as HAMi does",
        "A,NVIDIA,1,1::;",
        ((grant("A", 1, 1),), ()),
    ),
    DecodeCase(
        "the type is kept as written",
        "GPU-0,Tesla T4,3000,0:;",
        ((DeviceGrant("GPU-0", "Tesla T4", 3000, 0),), ()),
    ),
]


@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda case: case.name)
def test_decode_pod_devices(case: DecodeCase) -> None:
    assert hami_codec.decode_pod_devices(case.value) == case.want


def test_decode_w4_too_few_fields_is_an_error_naming_the_entry() -> None:
    with pytest.raises(InvalidInputError) as raised:
        hami_codec.decode_pod_devices("uuid,type,100:;")
    assert str(raised.value) == (
        f"{ALLOCATED}[0][0]: expected UUID,TYPE,MEMORY_MIB,CORE_PERCENT[,SLOTS], "
        'got "uuid,type,100"'
    )


@dataclass(frozen=True)
class BadDecodeCase:
    name: str
    value: str
    want_paths: list[str]


BAD_DECODE_CASES = [
    BadDecodeCase(
        "every malformed entry is named, not just the first",
        "uuid,type,100:;A,NVIDIA,x,10:B,NVIDIA,1,10,1,1:;",
        [f"{ALLOCATED}[0][0]", f"{ALLOCATED}[1][0].memory_mib", f"{ALLOCATED}[1][1]"],
    ),
    BadDecodeCase(
        "negative memory and cores are errors",
        "A,NVIDIA,-5,-1:;",
        [f"{ALLOCATED}[0][0].memory_mib", f"{ALLOCATED}[0][0].core_percent"],
    ),
    BadDecodeCase(
        "memory above int32 is an error",
        "A,NVIDIA,2147483648,10:;",
        [f"{ALLOCATED}[0][0].memory_mib"],
    ),
    BadDecodeCase(
        "cores above one whole device are an error",
        "A,NVIDIA,10,101:;",
        [f"{ALLOCATED}[0][0].core_percent"],
    ),
    BadDecodeCase(
        "slots beyond the documented maximum are rejected",
        "A,NVIDIA,1,1,65537:;",
        [f"{ALLOCATED}[0][0].slots"],
    ),
    BadDecodeCase(
        "a negative or non-numeric fifth field is rejected (#2877)",
        "A,NVIDIA,1,1,-3:;B,NVIDIA,1,1,x:;",
        [f"{ALLOCATED}[0][0].slots", f"{ALLOCATED}[1][0].slots"],
    ),
    BadDecodeCase(
        "spaces are not digits, as in Go's ParseInt",
        "A,NVIDIA, 100,10:;",
        [f"{ALLOCATED}[0][0].memory_mib"],
    ),
    BadDecodeCase("an empty uuid is an error", ",NVIDIA,1,1:;", [f"{ALLOCATED}[0][0].uuid"]),
    BadDecodeCase(
        "a piece without commas is not silently dropped",
        "GPU-A:;",
        [f"{ALLOCATED}[0][0]"],
    ),
]


@pytest.mark.parametrize("case", BAD_DECODE_CASES, ids=lambda case: case.name)
def test_decode_pod_devices_rejects(case: BadDecodeCase) -> None:
    with pytest.raises(InvalidInputError) as raised:
        hami_codec.decode_pod_devices(case.value)
    assert paths(raised.value) == case.want_paths


def test_decode_error_messages_carry_the_numbers() -> None:
    with pytest.raises(InvalidInputError) as raised:
        hami_codec.decode_pod_devices("A,NVIDIA,-5,10:;")
    assert raised.value.violations[0].message == "must be between 0 and 2147483647, got -5"


def test_decode_of_a_huge_malformed_value_reports_a_bounded_error() -> None:
    value = "bad:" * 100_000
    with pytest.raises(InvalidInputError) as raised:
        hami_codec.decode_pod_devices(value)
    assert len(raised.value.violations) == 101
    assert raised.value.violations[-1].message == "and 99900 more problems"


# -- alignment to the pod's containers -------------------------------------------------------


@dataclass(frozen=True)
class AlignCase:
    name: str
    value: str
    container_count: int
    want: tuple[tuple[DeviceGrant, ...], ...]


ALIGN_CASES = [
    AlignCase(
        "the empty entry after the final semicolon is dropped",
        "A,NVIDIA,1,1:;B,NVIDIA,2,2:;",
        2,
        ((grant("A", 1, 1),), (grant("B", 2, 2),)),
    ),
    AlignCase(
        "a value without its final semicolon is accepted",
        "A,NVIDIA,1,1:;B,NVIDIA,2,2:",
        2,
        ((grant("A", 1, 1),), (grant("B", 2, 2),)),
    ),
    AlignCase(
        "positions the value does not reach have no device",
        "A,NVIDIA,1,1:;",
        3,
        ((grant("A", 1, 1),), (), ()),
    ),
    AlignCase("the empty value means no device anywhere", "", 2, ((), ())),
    AlignCase("extra empty entries are harmless", "A,NVIDIA,1,1:;;;", 1, ((grant("A", 1, 1),),)),
]


@pytest.mark.parametrize("case", ALIGN_CASES, ids=lambda case: case.name)
def test_decode_container_grants(case: AlignCase) -> None:
    assert hami_codec.decode_container_grants(case.value, case.container_count) == case.want


def test_a_grant_for_a_position_the_pod_does_not_have_is_an_error() -> None:
    with pytest.raises(InvalidInputError) as raised:
        hami_codec.decode_container_grants("A,NVIDIA,1,1:;B,NVIDIA,1,1:;C,NVIDIA,1,1:;", 1)
    assert [str(violation) for violation in raised.value.violations] == [
        f"{ALLOCATED}[1]: grant for container position 1 but the pod has 1 containers",
        f"{ALLOCATED}[2]: grant for container position 2 but the pod has 1 containers",
    ]


def test_alignment_and_format_errors_are_reported_together() -> None:
    with pytest.raises(InvalidInputError) as raised:
        hami_codec.decode_container_grants("x,y:;A,NVIDIA,1,1:;", 1, path="p")
    assert paths(raised.value) == ["p[0][0]", "p[1]"]


# -- encode rejects what it cannot write -------------------------------------------------------


def test_encode_rejects_every_field_that_would_break_the_format() -> None:
    with pytest.raises(InvalidInputError) as raised:
        hami_codec.encode_pod_devices(
            [[DeviceGrant("GPU;A", "NV,IDIA", -1, 10)], [DeviceGrant("", "NVIDIA", 1, 1, -2)]]
        )
    assert paths(raised.value) == [
        "grants[0][0].uuid",
        "grants[0][0].device_type",
        "grants[0][0].memory_mib",
        "grants[1][0].uuid",
        "grants[1][0].slots",
    ]


# -- round trip ---------------------------------------------------------------------------------

_WIRE_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters=",:;"), min_size=1, max_size=12
)
_GRANTS = st.builds(
    DeviceGrant,
    uuid=_WIRE_TEXT,
    vendor=st.one_of(st.just("NVIDIA"), _WIRE_TEXT),
    memory_mib=st.integers(0, 2**31 - 1),
    core_percent=st.integers(0, 100),
    slots=st.integers(0, MAX_GRANT_SLOTS),
)
_PER_CONTAINER = st.lists(st.lists(_GRANTS, max_size=4), max_size=8)


@settings(max_examples=600)
@given(_PER_CONTAINER)
def test_encode_then_decode_gives_the_same_grants_per_position(
    per_container: list[list[DeviceGrant]],
) -> None:
    encoded = hami_codec.encode_pod_devices(per_container)
    decoded = hami_codec.decode_container_grants(encoded, len(per_container))
    # One slot is written as HAMi's four fields, so it reads back as a raw grant (0), which
    # also occupies exactly one slot.
    want = tuple(
        tuple(replace(g, slots=0) if g.slots == 1 else g for g in grants)
        for grants in per_container
    )
    assert decoded == want
    assert [[g.slot_weight for g in grants] for grants in decoded] == [
        [g.slot_weight for g in grants] for grants in per_container
    ]


@settings(max_examples=200)
@given(_PER_CONTAINER)
def test_decode_pod_devices_has_one_entry_per_semicolon_plus_one(
    per_container: list[list[DeviceGrant]],
) -> None:
    encoded = hami_codec.encode_pod_devices(per_container)
    assert len(hami_codec.decode_pod_devices(encoded)) == len(per_container) + 1


# -- node registration --------------------------------------------------------------------------

W9_REGISTER = json.dumps(
    [
        {"id": "GPU-0", "count": 10, "devmem": 24576, "devcore": 100, "type": "NVIDIA A10"},
        {
            "id": "GPU-1",
            "index": 1,
            "count": 10,
            "devmem": 24576,
            "devcore": 100,
            "type": "NVIDIA A10",
            "numa": 1,
            "mode": "hami-core",
            "health": True,
            "migProfiles": [{"name": "1g.5gb", "memoryMB": 5120}],
        },
    ]
)


def test_decode_node_register_w9_omitted_keys_default_to_zero_and_unhealthy() -> None:
    assert hami_codec.decode_node_register(W9_REGISTER) == (
        Device("GPU-0", "NVIDIA A10", 0, 10, 24576, 100, numa=0, healthy=False),
        # A profile's omitted fields are zero too (a card not in MIG mode never uses them).
        Device(
            "GPU-1",
            "NVIDIA A10",
            1,
            10,
            24576,
            100,
            numa=1,
            healthy=True,
            mig_profiles=(MigProfile("1g.5gb", 5120, 0, 0),),
        ),
    )


def test_decode_node_register_reads_the_example_of_the_reference() -> None:
    value = (
        '[{"id":"GPU-x","count":10,"devmem":24576,"devcore":100,'
        '"type":"NVIDIA A10","mode":"hami-core","health":true}]'
    )
    (device,) = hami_codec.decode_node_register(value)
    assert device == Device("GPU-x", "NVIDIA A10", 0, 10, 24576, 100, mode="hami-core")
    assert hami_codec.encode_node_register([device]) == value


@pytest.mark.parametrize(
    ("value", "want"),
    [("null", ()), ("[]", ())],
    ids=["json null is no devices, like Go", "an empty array is no devices"],
)
def test_decode_node_register_empty(value: str, want: tuple[Device, ...]) -> None:
    assert hami_codec.decode_node_register(value) == want


@dataclass(frozen=True)
class BadRegisterCase:
    name: str
    value: str
    want: list[str]


BAD_REGISTER_CASES = [
    BadRegisterCase(
        "the legacy comma format is refused with a hint",
        "GPU-x,10,24576,100,NVIDIA-Tesla T4,0,true:",
        [
            f"{REGISTER}: must be a JSON array of devices; the legacy comma format "
            "(id,count,devmem,devcore,type,numa,health:) is not accepted for NVIDIA"
        ],
    ),
    BadRegisterCase(
        "an object instead of an array",
        '{"id":"GPU-x"}',
        [f"{REGISTER}: must be a JSON array of devices, got an object"],
    ),
    BadRegisterCase(
        "every bad field of every device, and duplicate ids",
        json.dumps(
            [
                {"id": "GPU-0", "devmem": 1},
                {"id": "GPU-1", "count": 1.5, "health": "yes"},
                {"id": "GPU-2", "devmem": -1, "type": 7},
                {"id": "GPU-0"},
                {"devcore": True},
                "GPU-5",
            ]
        ),
        [
            f"{REGISTER}[1].count: must be an integer between 0 and 2147483647, got 1.5",
            f"{REGISTER}[1].health: must be true or false, got a string",
            f"{REGISTER}[2].type: must be a string, got a number",
            f"{REGISTER}[2].devmem: must be an integer between 0 and 2147483647, got -1",
            f'{REGISTER}[3].id: duplicate device id "GPU-0", also {REGISTER}[0]',
            f"{REGISTER}[4].id: must not be empty",
            f"{REGISTER}[4].devcore: must be an integer between 0 and 2147483647, got true",
            f"{REGISTER}[5]: must be an object, got a string",
        ],
    ),
    BadRegisterCase(
        "memory above int32",
        '[{"id":"GPU-0","devmem":2147483648}]',
        [f"{REGISTER}[0].devmem: must be an integer between 0 and 2147483647, got 2147483648"],
    ),
    BadRegisterCase(
        "nesting deeper than the stack is refused, not a crash",
        "[" * 100_000,
        [f"{REGISTER}: not valid JSON (nested too deeply)"],
    ),
    BadRegisterCase(
        "an empty value is not a device list",
        "",
        [f"{REGISTER}: must be a JSON array of devices, got an empty value"],
    ),
    BadRegisterCase(
        "a huge array is refused by its length",
        json.dumps([{"id": f"GPU-{i}"} for i in range(10_000)]),
        [f"{REGISTER}: at most 256 devices, got 10000"],
    ),
]


@pytest.mark.parametrize("case", BAD_REGISTER_CASES, ids=lambda case: case.name)
def test_decode_node_register_rejects(case: BadRegisterCase) -> None:
    with pytest.raises(InvalidInputError) as raised:
        hami_codec.decode_node_register(case.value)
    assert [str(violation) for violation in raised.value.violations] == case.want


def test_encode_node_register_omits_zero_values_like_go() -> None:
    device = Device("GPU-0", "", 0, 0, 0, 0, numa=0, mode="", healthy=False)
    assert hami_codec.encode_node_register([device]) == '[{"id":"GPU-0"}]'


def test_encode_node_register_escapes_html_characters_like_go() -> None:
    device = Device("GPU-0", "A<B>&C", 0, 1, 1, 1)
    assert hami_codec.encode_node_register([device]) == (
        '[{"id":"GPU-0","count":1,"devmem":1,"devcore":1,'
        '"type":"A\\u003cB\\u003e\\u0026C","mode":"hami-core","health":true}]'
    )


_DEVICES = st.lists(
    st.builds(
        Device,
        uuid=_WIRE_TEXT,
        model=st.text(max_size=12),
        index=st.integers(0, 2**31 - 1),
        slots_total=st.integers(0, 2**31 - 1),
        memory_total_mib=st.integers(0, 2**31 - 1),
        core_percent_total=st.integers(0, 2**31 - 1),
        numa=st.integers(-(2**31), 2**31 - 1),
        mode=st.sampled_from(["hami-core", "mig", "mps"]),
        healthy=st.booleans(),
    ),
    max_size=8,
    unique_by=lambda device: device.uuid,
)


@settings(max_examples=300)
@given(_DEVICES)
def test_node_register_round_trips(devices: list[Device]) -> None:
    assert hami_codec.decode_node_register(hami_codec.encode_node_register(devices)) == tuple(
        devices
    )
