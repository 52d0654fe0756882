"""How accounting values meet message fields: a conversion as its table of (domain field,
message field) pairs, and totals saturated at what their wire field can carry.

Layer: services (adapter), beneath every conversion of ``services.common.convert``.
"""

from __future__ import annotations

from typing import Any

from accounting import limits

Fields = tuple[tuple[str, str], ...]
"""(domain field, message field) pairs of one conversion."""


def same_names(*names: str) -> Fields:
    """Fields of one name in the domain and on the wire."""
    return tuple((name, name) for name in names)


def to_wire(source: object, fields: Fields) -> dict[str, Any]:
    """The message fields of a domain value: each conversion is its list of fields."""
    return {wire: getattr(source, domain) for domain, wire in fields}


def from_wire(pb: object, fields: Fields) -> dict[str, Any]:
    """The domain fields of a message."""
    return {domain: getattr(pb, wire) for domain, wire in fields}


def saturated(value: int, high: int = limits.INT64_MAX) -> int:
    """A total over many pods as its wire field can carry it: at most ``high``.

    Every stored quantity is bounded (accounting.limits' maxima), so one pod's numbers always
    fit; a node's or a namespace's total over pods is bounded only by how many pods there are,
    and is reported saturated rather than failing the whole answer with INTERNAL. Saturating
    is the safe side: a total at the maximum leaves no room, so nothing more fits or passes.
    """
    return value if value <= high else high
