"""Whole numbers written as text, read the one bounded way.

Layer: accounting (pure, standard library only). Every integer read from text that came from
outside — the fields of HAMi's annotations (every vendor's register and allocation formats),
JSON documents, the exponent of a Kubernetes quantity, environment variables and flags — is
read here, because Python's own readers accept far more than the writers of that text mean:

* ``int()`` reads other scripts' decimal digits (``"١٢"`` is 12), underscores (``"1_0"``),
  and white space around the number; ``str.isdigit()`` is true for ``"²"``, which ``int()``
  then refuses with a ``ValueError``; ``str.isdecimal()`` still takes every script's digits.
  Go's ``strconv.ParseInt``, with which HAMi reads the same fields, takes an optional sign and
  ASCII digits only, and so do we.
* ``int()`` of a long text takes time quadratic in its length, and past 4,300 digits raises a
  ``ValueError`` of its own (CPython's guard against exactly that); a ``Decimal`` such as
  ``1e1000000`` (a 64-character quantity) converts to an integer of a million digits. So a
  number is refused by its length (``MAX_INTEGER_DIGITS``) or its magnitude before any
  conversion, and no ``ValueError`` ever leaves a reader.

These functions only read; the field-naming errors (``InvalidInputError`` with the request's
path) are built by ``accounting.validate`` and ``accounting.received_json`` around them.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation
from typing import Any

MAX_INTEGER_DIGITS = 32
"""The most significant digits an integer read from text may have (leading zeros aside, which
Go's reader skips too): an int64 has 19, so a longer number is out of every range the
accounting has, and is refused before any conversion."""

_DECIMAL_INTEGER = re.compile(r"([+-]?)0*([1-9][0-9]*)?")
"""Go's strconv.ParseInt(s, 10, …): an optional sign and ASCII digits, nothing else (``re``'s
``[0-9]`` is ASCII only, unlike ``\\d``); the second group skips the leading zeros (and
starts with a non-zero digit, so a long text that fails to match fails in linear time)."""


def decimal_integer(text: str) -> int | None:
    """The integer ``text`` writes in ASCII decimal (``"42"``, ``"-7"``, ``"+5"``, ``"007"``),
    or None: another character anywhere (white space, ``"²"``, ``"١"``, ``"1_0"``,
    ``"0x10"``), no digit at all, or more than ``MAX_INTEGER_DIGITS`` significant digits."""
    match = _DECIMAL_INTEGER.fullmatch(text)
    if match is None or len(text) == len(match[1]):
        return None
    significant = match[2] or ""
    if len(significant) > MAX_INTEGER_DIGITS:
        return None
    return int(match[1] + (significant or "0"))


def in_range(value: int | None, low: int, high: int) -> int | None:
    """``value`` when it is an integer from ``low`` to ``high``, else None."""
    return value if value is not None and low <= value <= high else None


def whole_decimal(value: Decimal, low: int, high: int) -> int | None:
    """An exact ``Decimal`` (a Kubernetes quantity's value) as an ``int`` when it is a whole
    number from ``low`` to ``high``, else None; compared as a ``Decimal`` first, so a value
    such as ``1e1000000`` is never converted to its million digits."""
    if not value.is_finite() or not low <= value <= high or value != value.to_integral_value():
        return None
    return int(value)


def saturated_whole(value: Decimal, high: int) -> int:
    """A non-negative ``Decimal`` as an ``int`` (its whole part), ``high`` when it is larger:
    for readers that bound the number further and quote the reading itself, so any value past
    ``high`` gives the same answer and is never converted to its digits."""
    return int(min(value, Decimal(high)))


def json_integer_text(text: str) -> int | Decimal:
    """``json.loads``' ``parse_int``: an integer of at most ``MAX_INTEGER_DIGITS`` digits (JSON
    writes no leading zeros) as an ``int``, a longer one as its exact ``Decimal`` (which every
    integer field refuses as out of range, and which costs no quadratic conversion and raises
    no ``ValueError`` from inside the decoder)."""
    if len(text) <= MAX_INTEGER_DIGITS + 1:
        return int(text)
    return Decimal(text)


def json_fraction_text(text: str) -> Decimal:
    """``json.loads``' ``parse_float``: a fraction or exponent as its exact ``Decimal``. An
    exponent past what a ``Decimal`` holds (``1e-999999999999999999999``, 26 characters) makes
    ``Decimal`` raise ``InvalidOperation``, which is no ``ValueError``; it is raised as one
    here, so the text is refused as JSON that cannot be read, like any other."""
    try:
        return Decimal(text)
    except InvalidOperation:
        raise ValueError(f"the number {text[:40]!r} is out of range") from None


def json_loads(raw: str | bytes) -> Any:
    """``json.loads`` with numbers read exactly and boundedly: integers by
    ``json_integer_text``, fractions and exponents as ``Decimal`` by ``json_fraction_text``
    (``1e400`` is no float).

    Raises:
        ValueError: not JSON (``UnicodeDecodeError`` included), as ``json.loads`` does.
        RecursionError: nested deeper than the interpreter's stack.
    """
    return json.loads(raw, parse_int=json_integer_text, parse_float=json_fraction_text)

