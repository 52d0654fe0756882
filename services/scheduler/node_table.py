"""Every cached node's devices as columns: what the vectorized fit reads, kept per change.

Layer: services/scheduler (adapter state). ``NodeTable`` holds one row per node the scheduler's
node cache holds (``services.scheduler.node_cache``), fed by the WatchUsage events: an event
about a node rewrites that node's row in place (``put``), a dropped node frees its row
(``drop``), so a Filter never rebuilds node state. Each per-device field is one numpy array of
shape (width, rows) — device-major, so that what the fit sums or compares over a node's devices
is a handful of operations on long rows — width being the most devices a node has; nodes with
fewer are padded with absent devices. Beside them: what the fit needs ready-made per node (the
device scores, the index rank that breaks ties, the node score) and the ``NodeState`` itself,
for the reference fit where the vectorized one does not go and for the chosen node's grants.

A Filter takes a copy of its candidates' rows under the table's lock (``gather``): the watch
thread keeps writing rows meanwhile, and a Filter computes on a consistent copy.

Which rows the vectorized fit leaves to the reference fit (``kernel_ok`` false): a node with
more devices than ``MAX_WIDTH``, or with a figure that is negative or too large for a float64
to hold exactly (the device scores must be bit for bit the reference fit's), or with a
cordoned card (``Device.cordoned``).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from accounting.fit import NodeState, device_score
from accounting.model import DeviceState

IntArray = npt.NDArray[np.int64]

MAX_WIDTH = 16
"""Most devices per node the table lays out in columns; larger nodes go to the reference fit
(the vectorized fit packs per-device counts in 5 bits)."""
_EXACT = 2**53
"""Integers below this convert to float64 exactly."""
_INITIAL_ROWS = 64
_INITIAL_WIDTH = 8

DEVICE_INT_FIELDS = (
    "slots_total",
    "memory_total",
    "cores_total",
    "slots_free",
    "memory_free",
    "cores_free",
    "rank",
    "vendor_id",
    "kind_id",
)
"""Per device: capacity, what is free, the tie-break rank (0 is tried first among equal
scores), and the vocabulary ids of the vendor and of the (model, mode) pair."""
DEVICE_BOOL_FIELDS = ("present", "healthy")
NODE_FIELDS = ("node_score", "kernel_ok", "device_count", "signature", "state_id")
"""Per node: its score, whether the columns hold it, its device count, the id of the set of
(vendor, mode) pairs of its devices (what decides whether a vendor's own rules fit it), and the
id of its device state: nodes with the same id have equal columns in every field but the
UUIDs (``_StateIds``)."""


@dataclass(frozen=True, slots=True)
class Columns:
    """A Filter's copy of its candidates' rows (column i of every field is ``names[i]``)."""

    names: list[str]
    name_array: npt.NDArray[np.object_]
    """``names`` as an array (to take the names of many columns at once)."""
    states: npt.NDArray[np.object_]
    """The NodeState of each column."""
    uuids: npt.NDArray[np.object_]
    """The device UUIDs of each column (a tuple)."""
    score_chunks: npt.NDArray[np.object_]
    """Each column's score entry as the table's ``encode_score`` wrote it (the adapter's bytes:
    the table only keeps them beside the row)."""
    fields: dict[str, Any]
    """Every per-device field (width, N) and per-node field (N,) by name."""
    vendors: dict[str, int]
    """Vendor name -> id in ``vendor_id``."""
    kinds: list[tuple[str, str]]
    """(model, mode) per id of ``kind_id``."""
    signatures: list[NodeState]
    """Per id of ``signature``: a node with that set of (vendor, mode) pairs."""

    def __len__(self) -> int:
        return len(self.names)

    def take(self, rows: IntArray) -> Columns:
        """The columns ``rows`` (indexes into these columns), in that order."""
        name_array = self.name_array.take(rows)
        return Columns(
            name_array.tolist(),
            name_array,
            self.states.take(rows),
            self.uuids.take(rows),
            self.score_chunks.take(rows),
            {name: _select(array, rows) for name, array in self.fields.items()},
            self.vendors,
            self.kinds,
            self.signatures,
        )


class _StateIds:
    """A small integer per distinct device state among the rows, held while a row has that
    state (an id no row holds any more is given to the next new state), so the ids stay
    below the number of rows however the usage churns."""

    def __init__(self) -> None:
        self._ids: dict[tuple[Any, ...], int] = {}
        self._holders: dict[tuple[Any, ...], int] = {}
        """State -> how many rows have it."""
        self._row_states: dict[int, tuple[Any, ...]] = {}
        self._free: list[int] = []

    def assign(self, row: int, state: tuple[Any, ...]) -> int:
        """The id of ``state``, now ``row``'s (in place of what the row had)."""
        self.release(row)
        found = self._ids.get(state)
        if found is None:
            found = self._free.pop() if self._free else len(self._ids)
            self._ids[state] = found
            self._holders[state] = 0
        self._holders[state] += 1
        self._row_states[row] = state
        return found

    def release(self, row: int) -> None:
        """The row no longer has its state (rewritten or dropped)."""
        state = self._row_states.pop(row, None)
        if state is None:
            return
        self._holders[state] -= 1
        if not self._holders[state]:
            del self._holders[state]
            self._free.append(self._ids.pop(state))


def device_state_key(state: NodeState) -> tuple[Any, ...]:
    """What every column of a node's row is computed from, but its name and UUIDs: two nodes
    with equal keys have equal rows in every field the fit compares."""
    return tuple(
        (d.device.vendor, d.device.model, d.device.mode, d.device.healthy, d.device.index,
         d.device.numa, d.device.cordoned, *_figures(d))
        for d in state.devices
    )


def _figures(device: DeviceState) -> tuple[int, int, int, int, int, int]:
    """A device's capacity, then what is used of it (slots, memory MiB, core percent)."""
    return (
        device.device.slots_total,
        device.device.memory_total_mib,
        device.device.core_percent_total,
        device.slots_used,
        device.memory_used_mib,
        device.core_percent_used,
    )

@dataclass(frozen=True, slots=True)
class _Lookup:
    """Where a list of candidate names is in the table (valid until a row is added or
    dropped)."""

    names: tuple[str, ...]
    found: IntArray
    """The row of each name, -1 for a name the table does not hold."""
    missing: list[str]
    """The names the table does not hold, in the order given (never changed: copied)."""
    selection: slice | IntArray
    """The rows held, sorted: a slice when they are one run (the usual case, every node a
    candidate), copied faster than rows taken one by one."""


def _selection(rows: IntArray) -> slice | IntArray:
    if rows.size and rows[-1] - rows[0] + 1 == rows.size and (np.diff(rows) == 1).all():
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return rows


def _select(array: npt.NDArray[Any], selection: slice | IntArray) -> npt.NDArray[Any]:
    """A copy of the rows ``selection`` of ``array`` (rows are its last axis)."""
    if isinstance(selection, slice):
        return array[..., selection].copy()
    return np.take(array, selection, axis=array.ndim - 1)


ScoreEncoder = Callable[[str, float], bytes]
"""A node's name and score -> its entry of the answer, as the adapter writes it (kept per row,
so a Filter over thousands of nodes joins them instead of encoding each)."""


class NodeTable:
    """Columns of every node's devices, rewritten one row per change (module docstring)."""

    def __init__(self, *, encode_score: ScoreEncoder) -> None:
        self._encode_score = encode_score
        self._lock = threading.Lock()
        self._width = 0
        self._capacity = 0
        self._rows: dict[str, int] = {}
        self._free: list[int] = []
        self._names = np.empty(0, dtype=object)
        self._states = np.empty(0, dtype=object)
        self._uuids = np.empty(0, dtype=object)
        self._score_chunks = np.empty(0, dtype=object)
        self._vendors: dict[str, int] = {}
        self._kinds: dict[tuple[str, str], int] = {}
        self._kind_list: list[tuple[str, str]] = []
        self._signatures: dict[frozenset[tuple[str, str]], int] = {}
        self._signature_list: list[NodeState] = []
        self._fields: dict[str, Any] = {}
        self._state_ids = _StateIds()
        self._last_lookup: _Lookup | None = None
        """The last ``gather``'s lookup of its names; None once a row is added or dropped."""
        self._grow(_INITIAL_ROWS, _INITIAL_WIDTH)

    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)

    def nbytes(self) -> int:
        """Bytes held by the columns (not the NodeStates they were built from)."""
        with self._lock:
            return sum(array.nbytes for array in self._fields.values())

    # -- writes (the watch thread) ---------------------------------------------------------------

    def put(self, state: NodeState) -> None:
        """Adds the node, or rewrites its row."""
        with self._lock:
            row = self._rows.get(state.node_name)
            if row is None:
                row = self._free.pop() if self._free else self._next_row()
                self._rows[state.node_name] = row
                self._last_lookup = None
            count = len(state.devices)
            if self._width < count <= MAX_WIDTH:
                self._grow(self._capacity, count)
            self._write(row, state)

    def drop(self, node_name: str) -> None:
        """Forgets the node (its row is reused)."""
        with self._lock:
            row = self._rows.pop(node_name, None)
            if row is None:
                return
            self._clear(row)
            self._free.append(row)
            self._last_lookup = None

    def _next_row(self) -> int:
        row = len(self._rows) + len(self._free)
        if row >= self._capacity:
            self._grow(self._capacity * 2, self._width)
        return row

    def _grow(self, capacity: int, width: int) -> None:
        old = self._fields
        fields: dict[str, Any] = {}
        for name in DEVICE_INT_FIELDS:
            fields[name] = np.zeros((width, capacity), dtype=np.int64)
        for name in DEVICE_BOOL_FIELDS:
            fields[name] = np.zeros((width, capacity), dtype=np.bool_)
        fields["score"] = np.zeros((width, capacity), dtype=np.float64)
        fields["node_score"] = np.zeros(capacity, dtype=np.float64)
        fields["kernel_ok"] = np.zeros(capacity, dtype=np.bool_)
        fields["device_count"] = np.zeros(capacity, dtype=np.int64)
        fields["signature"] = np.zeros(capacity, dtype=np.int64)
        fields["state_id"] = np.zeros(capacity, dtype=np.int64)
        # Absent devices rank after every device of their node.
        fields["rank"][:] = np.arange(width)[:, None]
        if old:
            columns, rows = old["present"].shape
            for name, array in old.items():
                if array.ndim == 1:
                    fields[name][:rows] = array
                else:
                    fields[name][:columns, :rows] = array
        self._fields = fields
        for attribute in ("_names", "_states", "_uuids", "_score_chunks"):
            grown = np.empty(capacity, dtype=object)
            previous = getattr(self, attribute)
            grown[: len(previous)] = previous
            setattr(self, attribute, grown)
        self._capacity = capacity
        self._width = width

    def _clear(self, row: int) -> None:
        self._state_ids.release(row)
        for array in self._fields.values():
            array[..., row] = 0
        self._fields["rank"][:, row] = np.arange(self._width)
        self._names[row] = None
        self._states[row] = None
        self._uuids[row] = None
        self._score_chunks[row] = None

    def _write(self, row: int, state: NodeState) -> None:
        devices = state.devices
        count = len(devices)
        self._clear(row)
        self._names[row] = state.node_name
        self._states[row] = state
        self._uuids[row] = tuple(d.device.uuid for d in devices)
        self._score_chunks[row] = self._encode_score(state.node_name, state.score)
        fields = self._fields
        fields["device_count"][row] = count
        fields["node_score"][row] = state.score
        fields["signature"][row] = self._signature(state)
        fields["state_id"][row] = self._state_ids.assign(row, device_state_key(state))
        if count > self._width:
            return  # more than MAX_WIDTH: the reference fit takes the node
        figures = [_figures(d) for d in devices]
        exact = all(0 <= value < _EXACT for figure in figures for value in figure)
        # A node with a cordoned card (CardCordoned) is left to the reference fit: rare, and
        # the kernel's columns stay those of every other node.
        fields["kernel_ok"][row] = exact and not any(d.device.cordoned for d in devices)
        if not count or not exact:
            return
        values = np.array(figures, dtype=np.int64).T
        fields["slots_total"][:count, row] = values[0]
        fields["memory_total"][:count, row] = values[1]
        fields["cores_total"][:count, row] = values[2]
        fields["slots_free"][:count, row] = values[0] - values[3]
        fields["memory_free"][:count, row] = values[1] - values[4]
        fields["cores_free"][:count, row] = values[2] - values[5]
        fields["present"][:count, row] = True
        fields["healthy"][:count, row] = [d.device.healthy for d in devices]
        # accounting.fit's own device scores: the vectorized fit orders by them until a
        # container of the pod changes them, then computes them the same way.
        fields["score"][:count, row] = [
            device_score(f[3], f[0], f[5], f[2], f[4], f[1]) for f in figures
        ]
        fields["vendor_id"][:count, row] = [self._vendor(d.device.vendor) for d in devices]
        fields["kind_id"][:count, row] = [
            self._kind(d.device.model, d.device.mode) for d in devices
        ]
        # accounting.fit's tie-break: among equal scores the higher NUMA node, then the
        # higher index, then the later position, is tried first.
        ranked = sorted(
            range(count),
            key=lambda p: (devices[p].device.numa, devices[p].device.index, p),
            reverse=True,
        )
        rank = fields["rank"]
        for place, p in enumerate(ranked):
            rank[p, row] = place

    def _vendor(self, vendor: str) -> int:
        found = self._vendors.get(vendor)
        if found is None:
            found = self._vendors[vendor] = len(self._vendors) + 1
        return found

    def _signature(self, state: NodeState) -> int:
        key = frozenset((d.device.vendor, d.device.mode) for d in state.devices)
        found = self._signatures.get(key)
        if found is None:
            found = self._signatures[key] = len(self._signature_list)
            self._signature_list.append(state)
        return found

    def _kind(self, model: str, mode: str) -> int:
        key = (model, mode)
        found = self._kinds.get(key)
        if found is None:
            found = self._kinds[key] = len(self._kind_list)
            self._kind_list.append(key)
        return found

    # -- reads (Filters) --------------------------------------------------------------------------

    def gather(
        self, names: Sequence[str], skip: Collection[str] = ()
    ) -> tuple[Columns, list[str]]:
        """A copy of the rows of ``names`` the table holds (minus ``skip``), and the names it
        does not hold (or skips), in the order given."""
        with self._lock:
            lookup = self._lookup_of(tuple(names))
            missing = list(lookup.missing)
            selection: slice | IntArray = lookup.selection
            if skip:
                selection = self._without(lookup, skip, missing)
            fields = {name: _select(array, selection) for name, array in self._fields.items()}
            name_array = _select(self._names, selection)
            states = _select(self._states, selection)
            uuids = _select(self._uuids, selection)
            chunks = _select(self._score_chunks, selection)
            vendors = dict(self._vendors)
            kinds = list(self._kind_list)
            signatures = list(self._signature_list)
        columns = Columns(
            name_array.tolist(), name_array, states, uuids, chunks, fields, vendors, kinds,
            signatures,
        )
        return columns, missing

    def _lookup_of(self, names: tuple[str, ...]) -> _Lookup:
        """Where ``names`` are, from the last lookup when the list is the same: the extender
        sends every Filter the same candidates, and a row is only added or dropped when a node
        is, so the lookup over thousands of names is done once per change of the node set
        rather than once per Filter (comparing the lists costs a fraction of it)."""
        last = self._last_lookup
        if last is not None and last.names == names:
            return last
        found = np.fromiter(map(self._rows.get, names, itertools.repeat(-1)), np.int64, len(names))
        absent = found < 0
        rows = found[~absent]
        # Sorted rows read the arrays in memory order; the fit does not depend on the order.
        rows.sort()
        lookup = _Lookup(
            names,
            found,
            [names[i] for i in np.flatnonzero(absent).tolist()],
            _selection(rows),
        )
        self._last_lookup = lookup
        return lookup

    def _without(self, lookup: _Lookup, skip: Collection[str], missing: list[str]) -> IntArray:
        """The rows of ``lookup`` minus those of ``skip``, whose names join ``missing``."""
        found = lookup.found
        absent = found < 0
        for name in skip:
            row = self._rows.get(name, -1)
            if row >= 0:
                hit = found == row
                if hit.any():
                    absent |= hit
                    missing.append(name)
        rows = found[~absent]
        rows.sort()
        return rows
