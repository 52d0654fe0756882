"""Filter's candidate names are checked the same way whether a list is new or repeated.

``convert.NodeNameReader`` (the servicer keeps one across Filters) checks and de-duplicates a
list once and answers a repeat of the last valid list from it: these tests send lists again,
changed, invalid and valid again, through one reader and through ``filter_input``, and compare
each answer and each error with what a fresh reader gives.
"""

from __future__ import annotations

import pytest

from accounting.errors import InvalidInputError, Violations
from accounting.model import Container, ContainerClass, DeviceRequest, Pod
from accounting.quoting import quote
from accounting.vendors import NVIDIA_RESOURCES
from hami.accounting.v1 import scheduler_pb2
from services.common.convert import pod_to_pb
from services.scheduler import convert

LISTS = [
    ["node-a", "node-b", "node-a", "node-c"],
    ["node-a", "node-b", "node-a", "node-c"],  # the same again
    ["node-a", "node-b", "node-c"],  # changed
    ["node-a", "", "x" * 254],  # invalid: two problems
    ["node-a", "", "x" * 254],  # the same invalid list again
    [],  # none
    ["node-a", "node-b", "node-a", "node-c"],  # the first list, valid again
    ["node-c", "node-b"],
]


POD = pod_to_pb(
    Pod("uid-1", "team-a", "p",
        (Container("c", ContainerClass.APP, (DeviceRequest("NVIDIA", 1),)),))
)
VENDORS = (NVIDIA_RESOURCES,)
"""The vendors Filter reads the pod with (the recorder's default policy)."""


def read(reader: convert.NodeNameReader, names: list[str]) -> tuple[tuple[str, ...], list[str]]:
    found = Violations()
    unique = reader.read(found, names)
    try:
        found.raise_if_any()
    except InvalidInputError as error:
        return unique, [f"{v.path}: {v.message}" for v in error.violations]
    return unique, []


def test_every_list_read_through_one_reader_is_answered_as_by_a_fresh_one() -> None:
    reader = convert.NodeNameReader()
    for names in LISTS:
        assert read(reader, names) == read(convert.NodeNameReader(), names)


def test_a_repeated_valid_list_gets_the_same_names_and_an_invalid_one_its_errors_again() -> None:
    reader = convert.NodeNameReader()
    first, _ = read(reader, LISTS[0])
    assert first == ("node-a", "node-b", "node-c")
    assert read(reader, list(LISTS[0]))[0] is first  # answered from the last list

    _, errors = read(reader, LISTS[3])
    assert errors == [
        "node_names[1]: must not be empty",
        f"node_names[2]: at most 253 characters, got 254: {quote('x' * 254)}",
    ]
    assert read(reader, LISTS[4])[1] == errors
    assert read(reader, LISTS[0]) == (first, [])


def test_filter_input_reports_pod_and_name_problems_together_with_a_kept_reader() -> None:
    reader = convert.NodeNameReader()
    good = scheduler_pb2.FilterRequest(pod=POD, node_names=["node-a", "node-a"])
    assert convert.filter_input(good, vendors=VENDORS, names=reader).node_names == ("node-a",)

    bad = scheduler_pb2.FilterRequest(node_names=["node-a", "node-a"])  # no pod
    with pytest.raises(InvalidInputError) as raised:
        convert.filter_input(bad, vendors=VENDORS, names=reader)
    assert not any(v.path.startswith("node_names") for v in raised.value.violations)
    assert convert.filter_input(good, vendors=VENDORS, names=reader).node_names == ("node-a",)
