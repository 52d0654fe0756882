"""Kubernetes ``resource.Quantity`` values, read exactly as the API server reads them.

Layer: accounting (pure, standard library only). The pod parser and the ResourceQuota reader
turn the quantities they find into exact ``Decimal`` values here; what a value *means* (whole
devices, MiB, percent) is decided by the caller.

The reading follows apimachinery's ``ParseQuantity`` and ``Quantity.UnmarshalJSON``
(k8s.io/apimachinery pkg/api/resource/quantity.go), so a value reads here as it reads in the
API server and in HAMi:

* white space around the value is dropped (UnmarshalJSON trims it); an empty value is refused;
* a signed decimal number whose digits may be missing on either side of the point ("5.",
  ".5", and even "", "+" or "." before a suffix, which read as 0), then a suffix: binary SI
  (Ki Mi Gi Ti Pi Ei), decimal SI (n u m k M G T P E), or an exponent ``e``/``E`` with a signed
  integer that fits int64 — truncated to 32 bits, as Go's conversion does ("1e4294967296"
  reads as 1);
* a non-zero value is rounded up, away from zero, to a whole nano unit ("0.5e-9" reads as 1n);
* a binary-SI value beyond ±(2^63 − 1) is capped there ("9999999999999Gi" reads as
  9223372036854775807); decimal values are not capped ("1e400" reads as 10^400).

A JSON number is a quantity too (UnmarshalJSON accepts one): an int, a ``Decimal`` (from
``json.loads(..., parse_float=Decimal)``) or a finite float.
"""

from __future__ import annotations

import decimal
import re
from decimal import Decimal

from accounting import numbers
from accounting.quoting import json_kind, quote

MAX_QUANTITY_CHARS = 64
"""A quantity longer than this is refused (the API server would keep a canonical form far
shorter; a long one is only a way to make every reader work harder)."""

_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)

# Sign, digits before and after an optional point, then a suffix: letters from the set Go's
# parser collects, an optional sign and digits. The suffix is interpreted separately.
_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<whole>[0-9]*)(?:\.(?P<fraction>[0-9]*))?"
    r"(?P<suffix>[eEinumkKMGTP]*[+-]?[0-9]*)"
)
_DECIMAL_SUFFIXES = {
    "": 0, "n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
}
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
# A number without digits ("", "+", ".") reads as 0 where ParseQuantity takes its int64 fast
# path, and is refused where it falls back to parsing the text as a decimal: below nano for
# decimal suffixes and exponents, from Pi up for binary ones ("e-9" and "Ti" read as 0, "e-10"
# and "Pi" are refused).
_DIGITLESS_MIN_DECIMAL_EXPONENT = -9
_DIGITLESS_MAX_BINARY_EXPONENT = 40

# Go's unicode.IsSpace (the White_Space property), which UnmarshalJSON trims from the raw bytes
# between the quotes: only the characters a JSON string holds unescaped count (an escaped tab,
# "\\t5", is not trimmed there and is refused; Go's json.Marshal escapes U+2028 and U+2029).
_GO_SPACE = " \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u202f\u205f\u3000"

# Exact arithmetic: a 64-character mantissa times 2^60 has fewer than 90 digits, and exponents
# up to 2^31 in either direction are only an exponent field to Decimal. Inexact or Rounded
# would mean a bug here, so they raise instead of passing silently.
_EXACT = decimal.Context(
    prec=120,
    Emax=decimal.MAX_EMAX,
    Emin=decimal.MIN_EMIN,
    traps=[decimal.InvalidOperation, decimal.Inexact, decimal.Rounded, decimal.Overflow],
)
_NANO = Decimal("1e-9")
_ROUND_UP = decimal.Context(prec=120, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN,
                            rounding=decimal.ROUND_UP, traps=[decimal.InvalidOperation])


class QuantityError(ValueError):
    """The value is not a Kubernetes quantity; the message says what was received."""


def parse_quantity(value: object) -> Decimal:
    """The exact value of a Kubernetes quantity (a JSON string such as "24Gi", or a number).

    Raises:
        QuantityError: not a quantity the API server would accept (or longer than
            ``MAX_QUANTITY_CHARS``); the message quotes (a bounded part of) the value.
    """
    if isinstance(value, str):
        text = value
    elif isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise QuantityError(f"must be a Kubernetes quantity, got {json_kind(value)}")
    elif isinstance(value, int):
        return Decimal(value)
    elif not Decimal(value).is_finite():
        raise QuantityError(f"must be a Kubernetes quantity, got the number {value}")
    else:
        # A float's repr is the shortest text that reads back as it; a Decimal's str is exact.
        text = repr(value) if isinstance(value, float) else str(value)
    if len(text) > MAX_QUANTITY_CHARS:
        raise QuantityError(
            f"must be a Kubernetes quantity of at most {MAX_QUANTITY_CHARS} characters, "
            f"got {len(text)} characters"
        )
    text = text.strip(_GO_SPACE)
    # The common case, a plain whole number ("4096", "100"), needs none of the rules below.
    if text.isdigit() and text.isascii():
        return Decimal(text)
    match = _QUANTITY.fullmatch(text) if text else None
    scaled = _interpret(match) if match is not None else None
    if scaled is None:
        shown = quote(value) if isinstance(value, str) else text
        raise QuantityError(
            f"must be a Kubernetes quantity such as 4096, 24Gi or 1500m, got {shown}"
        )
    return scaled


def _interpret(match: re.Match[str]) -> Decimal | None:
    suffix = match["suffix"]
    digitless = not match["whole"] and not match["fraction"]
    mantissa = Decimal(f"{match['sign']}{match['whole'] or '0'}.{match['fraction'] or '0'}")
    if suffix in _BINARY_SUFFIXES:
        if digitless and _BINARY_SUFFIXES[suffix] > _DIGITLESS_MAX_BINARY_EXPONENT:
            return None
        value = _EXACT.multiply(mantissa, Decimal(2 ** _BINARY_SUFFIXES[suffix]))
        value = _round_up_to_nano(value)
        # ParseQuantity caps binary-SI values at the largest int64, keeping the sign.
        if value > _INT64_MAX:
            return Decimal(_INT64_MAX)
        if value < -_INT64_MAX:
            return Decimal(-_INT64_MAX)
        return value
    if suffix in _DECIMAL_SUFFIXES:
        exponent = _DECIMAL_SUFFIXES[suffix]
    elif len(suffix) > 1 and suffix[0] in "eE":
        parsed = numbers.decimal_integer(suffix[1:])
        if parsed is None or not _INT64_MIN <= parsed <= _INT64_MAX:
            return None  # strconv.ParseInt fails
        # Go keeps the exponent in an int32: int32(parsed) keeps the low 32 bits, signed.
        exponent = (parsed + 2**31) % 2**32 - 2**31
    else:
        return None
    if digitless and exponent < _DIGITLESS_MIN_DECIMAL_EXPONENT:
        return None
    return _round_up_to_nano(mantissa.scaleb(exponent, _EXACT))


def _round_up_to_nano(value: Decimal) -> Decimal:
    """ParseQuantity rounds a non-zero value up (away from zero) to a whole nano unit."""
    if value and value.as_tuple().exponent < -9:  # type: ignore[operator]  # finite here
        return value.quantize(_NANO, context=_ROUND_UP)
    return value


def is_whole(value: Decimal) -> bool:
    """True when the value is an integer (a whole number of devices, MiB or percent)."""
    return value == value.to_integral_value()


def describe(value: Decimal) -> str:
    """The value as a short exact text for messages: "2147483648", "1.5", "1e+400"."""
    normal = value.normalize(_ROUND_UP) if value else Decimal(0)
    adjusted = normal.adjusted()
    if -12 <= adjusted <= 30:
        return format(normal, "f")
    return format(normal, "e")
