"""Kubernetes quantities read exactly as the API server reads them: Kubernetes' own test table,
Go's readings of the texts that matter here, and agreement with the Kubernetes Python client."""

from __future__ import annotations

import decimal
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity as kubernetes_parse_quantity

from accounting.kube.quantity import (
    MAX_QUANTITY_CHARS,
    QuantityError,
    describe,
    is_whole,
    parse_quantity,
)
from tests.accounting.quantity_cases import API_SERVER_READINGS, INVALID, PARSE_TABLE

_WIDE = decimal.Context(prec=500, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)


def _negated(text: str) -> str:
    return text[1:] if text.startswith("-") else f"-{text}"


@pytest.mark.parametrize(("text", "want"), PARSE_TABLE, ids=[t for t, _ in PARSE_TABLE])
def test_kubernetes_parse_table(text: str, want: str) -> None:
    assert parse_quantity(text) == Decimal(want)
    # TestQuantityParse parses every entry again with a "-" and a "+" in front.
    assert parse_quantity(f"-{text}") == -Decimal(want)
    assert parse_quantity(f"+{text}") == Decimal(want)


@pytest.mark.parametrize("text", [t for t in INVALID if t.strip() == t])
def test_kubernetes_invalid_list_is_refused(text: str) -> None:
    with pytest.raises(QuantityError, match="must be a Kubernetes quantity"):
        parse_quantity(text)


@pytest.mark.parametrize("text", [t for t in INVALID if t.strip() != t])
def test_white_space_is_trimmed_as_json_decoding_does(text: str) -> None:
    assert parse_quantity(text) == 1


@pytest.mark.parametrize(
    ("text", "want"), API_SERVER_READINGS, ids=[repr(t) for t, _ in API_SERVER_READINGS]
)
def test_reads_what_the_api_server_reads(text: str, want: str | None) -> None:
    if want is None:
        with pytest.raises(QuantityError):
            parse_quantity(text)
    else:
        assert parse_quantity(text) == Decimal(want)


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (4096, Decimal(4096)),
        (10**30, Decimal(10**30)),
        (1.5e3, Decimal(1500)),
        (Decimal("1E+400"), Decimal("1E+400")),
        (Decimal("1.5"), Decimal("1.5")),
    ],
    ids=repr,
)
def test_json_numbers_are_quantities(value: object, want: Decimal) -> None:
    assert parse_quantity(value) == want


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (True, "got a boolean"),
        (None, "got null"),
        ({"value": 1}, "got an object"),
        (float("inf"), "got the number inf"),
        (Decimal("NaN"), "got the number NaN"),
        ("1" * (MAX_QUANTITY_CHARS + 1), f"at most {MAX_QUANTITY_CHARS} characters"),
        ("\t5", 'got "\\t5"'),
    ],
    ids=repr,
)
def test_what_is_not_a_quantity(value: object, message: str) -> None:
    with pytest.raises(QuantityError, match="must be a Kubernetes quantity") as raised:
        parse_quantity(value)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("value", "whole", "text"),
    [
        ("2Gi", True, "2147483648"),
        ("1500m", False, "1.5"),
        ("1e400", True, "1e+400"),
        ("0.5e-9", False, "0.000000001"),
        ("-0", True, "0"),
        ("1e-40", False, "0.000000001"),
        ("9999999999999Gi", True, "9223372036854775807"),
    ],
)
def test_whole_and_described(value: str, whole: bool, text: str) -> None:
    quantity = parse_quantity(value)
    assert is_whole(quantity) is whole
    assert describe(quantity) == text


_SUFFIXES = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E"]
_INT64_MAX = 2**63 - 1


@settings(max_examples=500)
@given(
    sign=st.sampled_from(["", "-", "+"]),
    whole=st.integers(0, 10**20),
    fraction=st.one_of(st.none(), st.integers(0, 999_999).map(str)),
    suffix=st.sampled_from(_SUFFIXES),
)
def test_agrees_with_the_kubernetes_client(
    sign: str, whole: int, fraction: str | None, suffix: str
) -> None:
    """The client (kubernetes.utils.parse_quantity) reads the number and suffix exactly but
    neither rounds to nano units nor caps binary values: those two Go rules are applied to its
    reading before comparing."""
    text = f"{sign}{whole}" + (f".{fraction}" if fraction is not None else "") + suffix
    with decimal.localcontext(_WIDE):
        want = Decimal(kubernetes_parse_quantity(text))
        if want and want.as_tuple().exponent < -9:  # type: ignore[operator]
            want = want.quantize(Decimal("1e-9"), rounding=decimal.ROUND_UP)
        if suffix.endswith("i") and abs(want) > _INT64_MAX:
            want = Decimal(_INT64_MAX).copy_sign(want)
    assert parse_quantity(text) == want
