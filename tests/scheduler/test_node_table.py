"""``NodeTable.gather`` answers every Filter as a fresh table would, across puts and drops.

A Filter's copy of its candidates' rows reuses the last lookup of the same candidate list
(``NodeTable._lookup_of``) until a node is added or dropped: these tests gather the same list
again after each kind of change (a node added, dropped, its row reused by another node, a
rewrite in place) and compare every column with what a table built from scratch over the same
nodes gives. A property test runs random sequences of those changes and gathers (with and
without skipped names, lists in and out of row order, duplicates) against the same reference.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.fit import NodeState
from accounting.model import Device, DeviceState
from services.scheduler.convert import score_entry
from services.scheduler.node_table import Columns, NodeTable, device_state_key

NAMES = tuple(f"node-{i}" for i in range(8))


def node(name: str, used_slots: int = 0, devices: int = 2) -> NodeState:
    return NodeState(
        name,
        tuple(
            DeviceState(Device(f"GPU-{name}-{i}", "NVIDIA A100", i, 4, 40960, 100),
                        slots_used=used_slots)
            for i in range(devices)
        ),
    )


def by_name(columns: Columns) -> dict[str, dict[str, Any]]:
    """Each gathered node's column of every field, by node name (the order of the rows is
    not part of the answer, and vocabulary ids are the table's own: they are read back as the
    vendor, the (model, mode) and the set of (vendor, mode) pairs they stand for)."""
    vendor_names = {number: name for name, number in columns.vendors.items()}
    rows: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(columns.names):
        row: dict[str, Any] = {
            field: array[..., i].tolist() for field, array in columns.fields.items()
        }
        present = row["present"]
        row["vendor_id"] = [vendor_names.get(v) for v in row["vendor_id"]]
        row["kind_id"] = [
            columns.kinds[k] if here else None
            for k, here in zip(row["kind_id"], present, strict=True)
        ]
        row["signature"] = frozenset(
            (d.device.vendor, d.device.mode)
            for d in columns.signatures[row["signature"]].devices
        )
        # Checked apart (same_states): only which rows share an id means anything.
        del row["state_id"]
        row["state"] = columns.states[i]
        row["uuids"] = columns.uuids[i]
        row["chunk"] = columns.score_chunks[i]
        row["name_array"] = columns.name_array[i]
        rows[name] = row
    return rows


def same_states(columns: Columns) -> None:
    """Rows share a state id exactly when their nodes' device states are equal."""
    ids = columns.fields["state_id"].tolist()
    keys = [device_state_key(state) for state in columns.states]
    for i in range(len(ids)):
        for j in range(len(ids)):
            assert (ids[i] == ids[j]) == (keys[i] == keys[j])


def fresh(nodes: dict[str, NodeState]) -> NodeTable:
    table = NodeTable(encode_score=score_entry)
    for state in nodes.values():
        table.put(state)
    return table


def assert_same_gather(
    table: NodeTable, nodes: dict[str, NodeState], names: list[str], skip: set[str]
) -> None:
    columns, missing = table.gather(names, skip)
    expected, expected_missing = fresh(nodes).gather(names, skip)
    assert missing == expected_missing
    assert sorted(columns.names) == sorted(expected.names)
    assert len(columns.names) == len(columns)
    assert by_name(columns) == by_name(expected)
    same_states(columns)


def test_a_repeated_list_is_gathered_again_after_each_kind_of_change() -> None:
    nodes = {name: node(name) for name in NAMES[:4]}
    table = fresh(nodes)
    names = list(NAMES[:6])  # node-4 and node-5 are not in the table yet
    assert_same_gather(table, nodes, names, set())
    assert table.gather(names)[1] == ["node-4", "node-5"]

    nodes["node-4"] = node("node-4")  # added: found now
    table.put(nodes["node-4"])
    assert_same_gather(table, nodes, names, set())
    assert table.gather(names)[1] == ["node-5"]

    del nodes["node-1"]  # dropped: missing now
    table.drop("node-1")
    assert_same_gather(table, nodes, names, set())
    assert table.gather(names)[1] == ["node-1", "node-5"]

    nodes["node-5"] = node("node-5", devices=3)  # takes node-1's row
    table.put(nodes["node-5"])
    assert_same_gather(table, nodes, names, set())
    assert table.gather(names)[1] == ["node-1"]

    nodes["node-0"] = node("node-0", used_slots=3)  # rewritten in place: same rows
    table.put(nodes["node-0"])
    assert_same_gather(table, nodes, names, set())
    assert by_name(table.gather(names)[0])["node-0"]["slots_free"][:2] == [1, 1]


def test_skipped_names_are_missing_and_the_next_gather_has_them_again() -> None:
    nodes = {name: node(name) for name in NAMES[:5]}
    table = fresh(nodes)
    names = list(NAMES[:5])

    columns, missing = table.gather(names, {"node-3", "node-9"})
    assert missing == ["node-3"]
    assert "node-3" not in columns.names and len(columns) == 4

    columns, missing = table.gather(names)
    assert missing == [] and sorted(columns.names) == names


def test_a_gathered_copy_does_not_change_with_the_table() -> None:
    nodes = {name: node(name) for name in NAMES[:3]}
    table = fresh(nodes)
    columns, _ = table.gather(list(NAMES[:3]))
    before = by_name(columns)

    table.put(node("node-1", used_slots=4))
    table.drop("node-2")
    table.put(node("node-7"))

    assert by_name(columns) == before


def test_rows_out_of_order_and_with_gaps_are_gathered_one_by_one() -> None:
    nodes = {name: node(name) for name in NAMES}
    table = fresh(nodes)
    for names in (["node-6", "node-1", "node-3"], ["node-7", "node-0"], list(NAMES[::-1])):
        assert_same_gather(table, nodes, names, set())
    # A list whose rows span a run's length but repeat one is not taken as the run.
    assert_same_gather(table, nodes, ["node-0", "node-0", "node-2"], set())


changes = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from(NAMES), st.integers(0, 4), st.integers(0, 3)),
        st.tuples(st.just("drop"), st.sampled_from(NAMES), st.just(0), st.just(0)),
        st.tuples(st.just("gather"), st.sampled_from(NAMES), st.just(0), st.just(0)),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(changes, st.lists(st.sampled_from(NAMES), min_size=1, max_size=8), st.data())
def test_gathers_between_random_changes_answer_as_a_fresh_table(
    steps: list[tuple[str, str, int, int]], names: list[str], data: st.DataObject
) -> None:
    table = NodeTable(encode_score=score_entry)
    nodes: dict[str, NodeState] = {}
    for action, name, used, devices in steps:
        if action == "put":
            nodes[name] = node(name, used_slots=used, devices=devices)
            table.put(nodes[name])
        elif action == "drop":
            nodes.pop(name, None)
            table.drop(name)
        else:
            skip = set(data.draw(st.lists(st.sampled_from(NAMES), max_size=2)))
            assert_same_gather(table, nodes, names, skip)
    assert_same_gather(table, nodes, names, set())
    assert_same_gather(table, nodes, sorted(names, reverse=True), set())
