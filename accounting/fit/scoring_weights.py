"""A pod's device scoring weights: how much each of slots, cores and memory counts in the
device score that orders a node's devices for it (``hami.io/device-scoring-weights``).

Layer: accounting (pure). Read as HAMi reads it: exactly three ``key=value`` entries, one each
of ``slot``, ``core`` and ``memory`` in any order, white space around keys and values
allowed, each value a whole number in Go's ``strconv.ParseInt`` reading, none negative, not
all zero. A pod without the annotation weighs all three 1, which is the score the fit has
always used. A malformed value refuses the pod (HAMi's Filter fails it with an error instead
of placing it), naming the annotation and what is wrong, checked in HAMi's order so that the
reason given is the one HAMi gives.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from accounting.annotations import DEVICE_SCORING_WEIGHTS_ANNOTATION
from accounting.errors import InvalidInputError
from accounting.numbers import decimal_integer, in_range

_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)
_KEYS = ("slot", "core", "memory")
_PATH = f'metadata.annotations["{DEVICE_SCORING_WEIGHTS_ANNOTATION}"]'
# Go's strings.TrimSpace: the Unicode White_Space characters (Python's str.strip() would also
# take the four information separators U+001C..U+001F, which Go keeps).
_GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680"
    + "".join(map(chr, range(0x2000, 0x200B)))
    + "\u2028\u2029\u202f\u205f\u3000"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScoringWeights:
    """The weight of each used fraction in a device's score: 10 × (slot × slots used / slots
    + core × cores used / cores + memory × memory used / memory)."""

    slot: int = 1
    core: int = 1
    memory: int = 1

    @property
    def is_default(self) -> bool:
        """All three weigh 1: the score every pod without the annotation is ordered by."""
        return self.slot == 1 and self.core == 1 and self.memory == 1


DEFAULT_WEIGHTS = ScoringWeights()


def scoring_weights(annotations: Mapping[str, str]) -> ScoringWeights:
    """The pod's weights: its ``hami.io/device-scoring-weights`` annotation, or 1, 1, 1.

    Raises:
        InvalidInputError: the annotation is not three ``slot``, ``core`` and ``memory``
            entries of whole, non-negative numbers, not all zero.
    """
    value = annotations.get(DEVICE_SCORING_WEIGHTS_ANNOTATION)
    if value is None:
        return DEFAULT_WEIGHTS
    return parse_scoring_weights(value)


def _refused(value: str, problem: str) -> InvalidInputError:
    shown = value if len(value) <= 80 else value[:77] + "..."
    return InvalidInputError.single(_PATH, f"{problem} (got {shown!r})")


def parse_scoring_weights(value: str) -> ScoringWeights:
    """The weights ``value`` writes (``"slot=1,core=1,memory=3"``).

    Raises:
        InvalidInputError: as ``scoring_weights``, naming the annotation.
    """
    entries = value.split(",")
    if len(entries) != len(_KEYS):
        raise _refused(value, "expected slot, core, and memory weights (slot=N,core=N,memory=N)")
    weights: dict[str, int] = {}
    for entry in entries:
        key, equals, number = entry.strip(_GO_SPACE).partition("=")
        if not equals:
            raise _refused(value, "expected key=value entries")
        key = key.strip(_GO_SPACE)
        if key in weights:
            raise _refused(value, f"duplicate {_quoted(key)} weight")
        weight = in_range(decimal_integer(number.strip(_GO_SPACE)), _INT64_MIN, _INT64_MAX)
        if weight is None:
            raise _refused(value, f"{_quoted(key)} weight must be an integer")
        if weight < 0:
            raise _refused(value, f"{_quoted(key)} weight must not be negative")
        if key not in _KEYS:
            raise _refused(value, f"unknown weight {_quoted(key)} (slot, core or memory)")
        weights[key] = weight
    if not any(weights.values()):
        raise _refused(value, "at least one weight must be positive")
    return ScoringWeights(slot=weights["slot"], core=weights["core"], memory=weights["memory"])


def _quoted(key: str) -> str:
    """A key as Go's %q shows it, for the usual keys (printable ASCII)."""
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
