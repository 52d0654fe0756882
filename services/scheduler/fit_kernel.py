"""The scheduler's vectorized fit: ``accounting.fit.fit_pod`` over every candidate at once.

Layer: services/scheduler (adapter). The one place outside ``accounting/`` where fit rules are
written again, for speed: each container of the pod is fitted on every candidate node at once,
over the columns of ``services.scheduler.node_table`` (numpy arrays, one row per node), instead
of node by node. Its answer is ``fit_pod``'s answer, exactly — chosen node, grants, every failed
node's reason and every fitting node's score — which tests/scheduler/test_fit_kernel.py pins
with a differential property test; the readable definition stays ``accounting.fit``.

What it computes, per container in fitting order (``FitPlan.asks``), on all live rows (one
row per distinct device state: nodes alike get one verdict, ``_run_per_state``):

* the devices that may take the container: healthy, of the vendor, not refused by the pod's
  type, mode or UUID annotations, with a slot, the memory (a share sized per card) and cores
  left, and the exclusive and share-only rules (CardNotHealth … CardComputeUnitsExhausted);
* HAMi's walk, as a prefix count in each node's device order: a node fits the container when
  enough devices pass, and the first ``count`` of them in that order are the ones it takes;
* a steady container (sidecar or app) charges what it takes; the devices it charged are
  re-scored and the device order is sorted again (binpack busiest first, spread least busy
  first, ties by the NUMA-and-index rank) before the next container; an init container charges
  nothing;
* a node where a container fits nowhere is refused with the reason of ``accounting.fit``:
  every device of the vendor counted under the first rule that stops it, those that passed as
  AllocatedCardsInsufficientRequest (without a quota to price, whether a device passes does
  not depend on the walk order), or NodeInsufficientDevice.

What the plan decides of devices comes as tables, once per Filter over the columns'
vocabularies (``FitPlan.device_tables``, asked by ``candidate_fit.tables_for``): whether the
pod's type and mode annotations refuse each (model, mode), whether it may use each UUID it
names, and which sets of (vendor, mode) are fitted by the vendor's own rules; the kernel reads
them through the columns' ids. It imports the plan's types and calls nothing of
``accounting.fit``: its verdicts (``ColumnVerdicts``) go on to
``accounting.fit.answer_from_columns``, by way of ``candidate_fit.fit_columns``.

What it leaves to the reference fit (``fit_node``, node by node), so the answer stays exact:
rows the table does not lay out in columns (``NodeTable`` ``kernel_ok``), the nodes a caller
hands in as ``NodeState`` (read directly from the recorder), and nodes where the namespace
quota could refuse a card (``FitPlan.always_within_quota`` is false: the quota is priced per
card in walk order, which the reference does), and every node for a pod the kernel's one
device order does not serve (``FitPlan.kernel_may_fit`` is false: a GPU policy naming mutex,
or topology-aware for NVIDIA cards, ordering by anything but the score first, or with
nvidia.com/numa-bind, or hami.io/device-scoring-weights of its own). The chosen node's grants
are always the reference fit's, computed on that one node by ``answer_from_columns``: the
kernel decides which nodes fit and which of them is best, and ``fit_node`` says how.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from accounting.fit import BINPACK, DeviceTables, FitPlan, NodeState
from accounting.pod import EXCLUSIVE_CORE_PERCENT
from accounting.reasons import (
    ALLOCATED_CARDS_INSUFFICIENT_REQUEST,
    CARD_COMPUTE_UNITS_EXHAUSTED,
    CARD_INSUFFICIENT_CORE,
    CARD_INSUFFICIENT_MEMORY,
    CARD_NOT_HEALTH,
    CARD_TIME_SLICING_EXHAUSTED,
    CARD_TYPE_MISMATCH,
    CARD_UUID_MISMATCH,
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT,
    NODE_INSUFFICIENT_DEVICE,
    format_reasons,
)
from services.scheduler.node_table import Columns

BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

# Per-device reason codes, in the order accounting.fit checks them (the first one wins).
_PASSES = 0
_CODES = (
    CARD_NOT_HEALTH,
    CARD_TYPE_MISMATCH,
    CARD_UUID_MISMATCH,
    CARD_TIME_SLICING_EXHAUSTED,
    CARD_INSUFFICIENT_MEMORY,
    CARD_INSUFFICIENT_CORE,
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT,
    CARD_COMPUTE_UNITS_EXHAUSTED,
)
_ABSENT = len(_CODES) + 1
"""A padding column: not a device of the node, counted nowhere."""
_BITS = 5
"""Bits per count in a reason key: the table lays out at most 31 devices per node."""
_INSUFFICIENT = -1
"""The reason key of NodeInsufficientDevice."""
_TOO_LARGE = 2**62
_NO_RANK = 2**31


class KernelResult:
    """What the kernel found for its rows, before the answer is written."""

    __slots__ = ("fits", "reason_keys")

    def __init__(self, fits: BoolArray, reason_keys: IntArray) -> None:
        self.fits = fits
        """Per row: the pod fits the node."""
        self.reason_keys = reason_keys
        """Per row that does not fit: its reason, packed (``_reason_text``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ColumnVerdicts:
    """What the kernel found over a Filter's columns, for ``answer_from_columns`` to finish."""

    scores: ColumnScores
    """The rows it fitted, with their node scores."""
    best: NodeState | None
    """The row among them ``fit_pod`` prefers (binpack the highest node score, spread the
    lowest, ties the smaller name); None when it fitted none."""
    failed: dict[str, str]
    """Node name -> reason for the rows it refused."""
    left: list[NodeState]
    """The rows it leaves to the reference fit (module docstring)."""


def verdicts(plan: FitPlan, tables: DeviceTables, columns: Columns) -> ColumnVerdicts:
    """The kernel over the nodes of ``columns`` (module docstring). ``plan`` is ``fit_plan``'s
    for the pod and the Filter's arguments, and must ask for at least one device; ``tables``
    are its tables over these columns (``candidate_fit.tables_for``)."""
    fields = columns.fields
    kernel_rows = fields["kernel_ok"].copy()
    if not plan.kernel_may_fit:
        # Idle cards only (mutex) or a device order of its own (scoring weights): rare pods,
        # every row to the reference fit.
        kernel_rows[:] = False
    # Nodes the vendor's own rules fit (MIG-mode cards...) go to the reference fit: decided
    # once per set of (vendor, mode) pairs, which is all the decision reads.
    needs_rules = np.array(tables.rules_needed or (False,))
    kernel_rows &= ~needs_rules[fields["signature"]]
    if plan.quota_room is not None and kernel_rows.any():
        kernel_rows &= _within_quota(plan, fields)
    result = _run_per_state(plan, tables, columns, kernel_rows)

    failed: dict[str, str] = {}
    fitting = np.flatnonzero(result.fits)
    node_scores = fields["node_score"][fitting]
    refused = np.flatnonzero(kernel_rows & ~result.fits)
    if refused.size:
        failed = _reasons(columns.names, refused, result.reason_keys)
    best: NodeState | None = None
    if fitting.size:
        top = node_scores.max() if plan.node_policy == BINPACK else node_scores.min()
        tied = fitting[node_scores == top]
        name = min(columns.name_array.take(tied).tolist())
        best = columns.states[columns.names.index(name)]
    return ColumnVerdicts(
        scores=ColumnScores(
            columns.name_array.take(fitting).tolist(), node_scores.tolist(), fitting
        ),
        best=best,
        failed=failed,
        left=columns.states[~kernel_rows].tolist(),
    )


class ColumnScores(Mapping[str, float]):
    """Node name -> score of the nodes that fit (``FitResult.scores``), kept as the columns
    give them: a dict is built only when something reads it as one. ``rows`` says which
    columns the kernel's part came from, so the adapter can join the entries its node table
    encoded for them (``Columns.score_chunks``) instead of building messages."""

    __slots__ = ("_mapping", "_names", "_values", "rows")

    def __init__(self, names: list[str], values: list[float], rows: IntArray) -> None:
        self._names = names
        self._values = values
        self.rows = rows
        """The columns of ``names``, in order (indexes into the Columns fitted)."""
        self._mapping: dict[str, float] | None = None

    def _dict(self) -> dict[str, float]:
        if self._mapping is None:
            self._mapping = dict(zip(self._names, self._values, strict=True))
        return self._mapping

    def __getitem__(self, name: str) -> float:
        return self._dict()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dict())

    def __len__(self) -> int:
        return len(self._names)


class KernelDisagreementError(AssertionError):
    """The vectorized fit and the reference fit disagree: a bug (the scheduler then answers
    with the reference fit alone)."""


def _take(names: Sequence[str], rows: IntArray) -> list[str]:
    return [names[row] for row in rows.tolist()]


def _within_quota(plan: FitPlan, fields: dict[str, npt.NDArray[np.generic]]) -> BoolArray:
    """Rows where no card could be refused by the quota (``FitPlan.always_within_quota``, on
    each row's largest card): the others are priced card by card by the reference fit."""
    room = plan.quota_room
    assert room is not None
    largest = np.where(fields["present"], fields["memory_total"], 0).max(axis=0, initial=0)
    memory = np.zeros(largest.shape, dtype=np.int64)
    cores = devices = 0
    for ask in plan.asks:
        if ask.memory_mib is None:
            memory += ask.count * (largest * ask.memory_percent // 100)
        else:
            memory += ask.count * min(ask.memory_mib, _TOO_LARGE)
        cores += ask.count * ask.core_percent
        devices += ask.count
    within = np.ones(largest.shape, dtype=np.bool_)
    if room.memory_mib is not None:
        within &= memory <= room.memory_mib
    if room.core_percent is not None and cores > room.core_percent:
        within[:] = False
    if room.devices is not None:
        within &= np.minimum(devices, fields["device_count"]) <= room.devices
    return within


def _allowed(
    plan: FitPlan, tables: DeviceTables, columns: Columns
) -> tuple[BoolArray, BoolArray, BoolArray]:
    """(type allowed, UUID allowed, of the vendor) per device, for the pod."""
    fields = columns.fields
    vendor_id = columns.vendors.get(plan.vendor_name, -1)
    of_vendor = fields["vendor_id"] == vendor_id
    shape = of_vendor.shape
    if not plan.selects_devices:
        everywhere = np.ones(shape, dtype=np.bool_)
        return everywhere, everywhere, of_vendor
    # The pod's type and mode annotations, decided once per (model, mode) the table knows.
    refused_kinds = np.array(tables.type_refused or (False,))
    type_ok = ~refused_kinds[fields["kind_id"]]
    listed = tables.uuid_allowed
    uuid_ok = np.full(shape, tables.unlisted_uuid_allowed, dtype=np.bool_)
    if listed:
        for row, uuids in enumerate(columns.uuids.tolist()):
            for position, uuid in enumerate(uuids):
                allowed = listed.get(uuid)
                if allowed is not None:
                    uuid_ok[position, row] = allowed
    return type_ok, uuid_ok, of_vendor


def _run_per_state(
    plan: FitPlan, tables: DeviceTables, columns: Columns, rows: BoolArray
) -> KernelResult:
    """``_run`` on one row per distinct device state (NodeTable ``state_id``), each verdict
    then given to every row of that state: nodes alike (the same cards with the same usage, as
    most of a cluster is) get the same verdict, so the kernel's cost follows the number of
    distinct states rather than of nodes. ``rows`` must be the same on rows of one state (the
    kernel rows are: every test that picks them reads the state). Not when the pod names
    UUIDs, the one thing alike nodes do not share, nor when few rows are alike."""
    ids = columns.fields["state_id"]
    if tables.uuid_allowed or not ids.size:
        return _run(plan, tables, columns, rows)
    seen = np.zeros(int(ids.max()) + 1, dtype=np.bool_)
    seen[ids] = True
    distinct = np.flatnonzero(seen)
    if distinct.size * 2 > ids.size:
        return _run(plan, tables, columns, rows)
    place = np.zeros(seen.shape, dtype=np.int64)
    place[distinct] = np.arange(distinct.size)
    state_of_row = place[ids]
    # Any row of a state stands for it (whichever one the assignment keeps).
    sample = np.empty(distinct.size, dtype=np.int64)
    sample[state_of_row] = np.arange(ids.size)
    result = _run(plan, tables, columns.take(sample), rows[sample])
    return KernelResult(result.fits[state_of_row], result.reason_keys[state_of_row])


Picks = list[list[BoolArray]]
"""Per ask: the devices taken, one mask per device in the order they were taken."""


def _run(
    plan: FitPlan,
    tables: DeviceTables,
    columns: Columns,
    rows: BoolArray,
    picks: Picks | None = None,
) -> KernelResult:
    """Fits every container of the pod on every row of ``rows`` (the module docstring);
    ``picks``, when given, gets every ask's picks (the tests compare them with the grants)."""
    fields = columns.fields
    present = fields["present"]
    healthy = fields["healthy"]
    type_ok, uuid_ok, of_vendor = _allowed(plan, tables, columns)
    allowed = present & healthy & of_vendor & type_ok & uuid_ok
    vendor_devices = np.add.reduce(present & of_vendor, axis=0, dtype=np.int16)
    slots_total = fields["slots_total"]
    memory_total = fields["memory_total"]
    cores_total = fields["cores_total"]
    # The steady copy: what is free, changed in place by the steady containers' charges.
    slots_free = fields["slots_free"].copy()
    memory_free = fields["memory_free"].copy()
    cores_free = fields["cores_free"].copy()
    rank = fields["rank"]
    # The walk order's key, ascending: binpack tries the highest score first.
    key = -fields["score"] if plan.gpu_binpack else fields["score"].copy()
    sign = -1.0 if plan.gpu_binpack else 1.0
    alive = rows.copy()
    reason_keys = np.zeros(alive.shape, dtype=np.int64)
    shares: dict[int, IntArray] = {}
    asks = plan.asks
    for number, ask in enumerate(asks):
        if not alive.any():
            break
        short = alive & (ask.count > vendor_devices)
        if short.any():
            reason_keys[short] = _INSUFFICIENT
            alive &= ~short
        need: IntArray | int
        if ask.memory_mib is not None:
            # No card holds 2**62 MiB (the table's figures are below 2**53): a request that
            # large fits nowhere either way, and stays an int64.
            need = min(ask.memory_mib, _TOO_LARGE)
        else:
            percent = ask.memory_percent
            if percent not in shares:
                shares[percent] = memory_total * percent // 100
            need = shares[percent]
        cores = ask.core_percent
        has_slot = slots_free > 0
        memory_ok = memory_free >= need
        cores_ok = cores_free >= cores
        ok = allowed & has_slot
        ok &= memory_ok
        ok &= cores_ok
        exclusive_conflict: BoolArray | None = None
        if ask.exclusive:
            exclusive_conflict = (cores_total == EXCLUSIVE_CORE_PERCENT) & (
                slots_free != slots_total
            )
            ok &= ~exclusive_conflict
        exhausted: BoolArray | None = None
        if ask.share_only:
            exhausted = (cores_free == 0) & (cores_total != 0)
            ok &= ~exhausted
        # Without a quota to price, whether a device passes does not depend on the walk: the
        # node fits the container when enough devices pass.
        passing = np.add.reduce(ok, axis=0, dtype=np.int16)
        fits = passing >= ask.count
        lost = alive & ~fits
        if lost.any():
            at = np.flatnonzero(lost)
            codes = _codes(
                at, present & of_vendor, healthy, type_ok, uuid_ok, has_slot, memory_ok,
                cores_ok, exclusive_conflict, exhausted,
            )
            reason_keys[at] = _reason_keys(codes, passing[at], vendor_devices[at])
            alive &= fits
        charges = not ask.is_init and number < len(asks) - 1 and alive.any()
        if not charges and picks is None:
            continue
        # The devices taken: the first ``count`` passing ones in walk order, on the rows still
        # alive; a steady container charges them.
        ok &= alive
        taken = _first_in_walk(ok, key, rank, ask.count)
        if picks is not None:
            picks.append(taken)
        if not charges:
            continue
        picked = taken[0] if len(taken) == 1 else np.logical_or.reduce(taken)
        at = np.flatnonzero(picked)
        # Flat views of the C-ordered columns: only the picked devices change.
        slots_flat, memory_flat, cores_flat = (
            slots_free.ravel(), memory_free.ravel(), cores_free.ravel()
        )
        slots_flat[at] -= 1
        memory_flat[at] -= need if isinstance(need, int) else need.take(at)
        cores_flat[at] -= cores
        key.ravel()[at] = sign * _device_scores(
            slots_total.take(at), memory_total.take(at), cores_total.take(at),
            slots_flat.take(at), memory_flat.take(at), cores_flat.take(at),
        )
    return KernelResult(alive, reason_keys)


def _first_in_walk(
    available: BoolArray, key: npt.NDArray[np.float64], rank: IntArray, count: int
) -> list[BoolArray]:
    """The first ``count`` available devices of every row in walk order (ascending key, then
    rank: accounting.fit's device order), one mask per place in that order."""
    taken: list[BoolArray] = []
    for place in range(count):
        if place:
            available = available & ~taken[-1]
        keyed = np.where(available, key, np.inf)
        tied = keyed == keyed.min(axis=0)
        tied &= available
        ranked = np.where(tied, rank, _NO_RANK)
        first = ranked == ranked.min(axis=0)
        first &= tied
        taken.append(first)
    return taken


def _device_scores(
    slots_total: IntArray,
    memory_total: IntArray,
    cores_total: IntArray,
    slots_free: IntArray,
    memory_free: IntArray,
    cores_free: IntArray,
) -> npt.NDArray[np.float64]:
    """``accounting.fit.device_score`` of devices: the same float operations in the same order
    on the same integers (all below 2**53), so the same values and the same ties."""
    with np.errstate(divide="ignore", invalid="ignore"):
        scores = 10 * (
            (slots_total - slots_free) / slots_total
            + (cores_total - cores_free) / cores_total
            + (memory_total - memory_free) / memory_total
        )
    scores[(slots_total == 0) | (cores_total == 0) | (memory_total == 0)] = 0.0
    return scores


def _codes(
    at: IntArray,
    present: BoolArray,
    healthy: BoolArray,
    type_ok: BoolArray,
    uuid_ok: BoolArray,
    has_slot: BoolArray,
    memory_ok: BoolArray,
    cores_ok: BoolArray,
    exclusive_conflict: BoolArray | None,
    exhausted: BoolArray | None,
) -> npt.NDArray[np.int8]:
    """Each device's first refusal on the rows ``at``, in accounting.fit's order; devices
    not ``present`` (padding, and other vendors' devices: HAMi hands a vendor only its own)
    are counted nowhere."""
    codes = np.zeros((present.shape[0], at.size), dtype=np.int8)
    # From the last rule to the first, so the first that applies is the one left.
    checks: list[tuple[int, BoolArray | None, bool]] = [
        (8, exhausted, True),
        (7, exclusive_conflict, True),
        (6, cores_ok, False),
        (5, memory_ok, False),
        (4, has_slot, False),
        (3, uuid_ok, False),
        (2, type_ok, False),
        (1, healthy, False),
        (_ABSENT, present, False),
    ]
    for code, mask, refuses_when in checks:
        if mask is None:
            continue
        columns = mask[:, at]
        codes[columns if refuses_when else ~columns] = code
    return codes


def _reason_keys(
    codes: npt.NDArray[np.int8], passing: IntArray, devices: IntArray
) -> IntArray:
    """Each row's reason packed in one integer: a count per reason, the devices that passed
    (AllocatedCardsInsufficientRequest) and the node's number of the vendor's devices."""
    keys = devices.astype(np.int64) << (_BITS * (len(_CODES) + 1))
    keys |= passing.astype(np.int64)
    for code in range(1, len(_CODES) + 1):
        counts = (codes == code).sum(axis=0).astype(np.int64)
        keys |= counts << (_BITS * code)
    return keys


def _reasons(names: Sequence[str], rows: IntArray, keys: IntArray) -> dict[str, str]:
    """Node name -> reason for the refused ``rows``; each distinct reason is written once."""
    distinct, which = np.unique(keys[rows], return_inverse=True)
    texts = [_reason_text(int(key)) for key in distinct.tolist()]
    return dict(zip(_take(names, rows), [texts[i] for i in which.tolist()], strict=True))


def _reason_text(key: int) -> str:
    if key == _INSUFFICIENT:
        return NODE_INSUFFICIENT_DEVICE
    mask = (1 << _BITS) - 1
    counts: dict[str, int] = {}
    for code, reason in enumerate(_CODES, start=1):
        count = (key >> (_BITS * code)) & mask
        if count:
            counts[reason] = count
    passed = key & mask
    if passed:
        counts[ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = passed
    return format_reasons(counts, key >> (_BITS * (len(_CODES) + 1)))
