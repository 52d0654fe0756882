"""The one bounded reader of integers written as text (accounting.numbers).

Go's ``strconv.ParseInt(s, 10, 32)`` is how HAMi reads the same annotation fields, so its own
test table (golang/go ``src/strconv/atoi_test.go``, ``parseInt32Tests``) is the first table here,
as data: ``ErrSyntax`` is "not an integer" (None), ``ErrRange`` is "outside int32". Then what
Python's ``int()``/``str.isdigit()`` take and Go does not, and the length and magnitude bounds.
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accounting import numbers
from accounting.errors import FieldViolation, InvalidInputError, Violations
from accounting.kube import quantity
from accounting.limits import INT32_MAX, INT32_MIN
from accounting.validate import check_integer_text, check_json_integer

SYNTAX, RANGE = "syntax", "range"


def violations_of(found: Violations) -> list[FieldViolation]:
    try:
        found.raise_if_any()
    except InvalidInputError as error:
        return list(error.violations)
    return []

GO_PARSE_INT32 = [
    # (text, value or SYNTAX/RANGE): golang/go src/strconv/atoi_test.go parseInt32Tests.
    ("", SYNTAX), ("0", 0), ("-0", 0), ("1", 1), ("-1", -1), ("12345", 12345),
    ("-12345", -12345), ("012345", 12345), ("-012345", -12345), ("12345x", SYNTAX),
    ("-12345x", SYNTAX), ("987654321", 987654321), ("-987654321", -987654321),
    ("2147483647", 2**31 - 1), ("-2147483647", -(2**31 - 1)), ("2147483648", RANGE),
    ("-2147483648", -(2**31)), ("2147483649", RANGE), ("-2147483649", RANGE),
]

NOT_GO_DECIMAL = [
    # What Python's readers take and Go's ParseInt (and HAMi's writers) do not.
    pytest.param("\u00b2", id="superscript two: isdigit() is true, int() raises"),
    pytest.param("1\u00b2", id="a digit then a superscript"),
    pytest.param("\u0661\u0662", id="Arabic-Indic digits: int() reads 12"),
    pytest.param("\uff15", id="a fullwidth five: int() reads 5"),
    pytest.param("\u0e51", id="a Thai digit: isdecimal() is true"),
    pytest.param("1_000", id="an underscore: int() reads 1000"),
    pytest.param(" 5", id="a leading space: int() strips it"),
    pytest.param("5\n", id="a trailing newline: int() strips it"),
    pytest.param("0x10", id="hexadecimal"),
    pytest.param("1e3", id="an exponent"),
    pytest.param("1.0", id="a fraction"),
    pytest.param("+", id="a sign alone"),
    pytest.param("--1", id="two signs"),
    pytest.param("9" * 33, id="33 significant digits"),
    pytest.param("9" * 4301, id="4301 digits: int() raises past 4300"),
    pytest.param("0" * 100_000 + "x", id="a long run of zeros that ends badly"),
]


@pytest.mark.parametrize(("text", "want"), GO_PARSE_INT32, ids=lambda v: repr(v))
def test_decimal_integer_reads_what_go_parseint_reads(text: str, want: int | str) -> None:
    found = Violations()
    read = check_integer_text(found, "field", text, low=INT32_MIN, high=INT32_MAX)
    if want == SYNTAX:
        assert numbers.decimal_integer(text) is None
        [violation] = violations_of(found)
        assert read is None and violation.message.startswith("must be an integer between")
    elif want == RANGE:
        assert numbers.decimal_integer(text) is not None
        [violation] = violations_of(found)
        assert read is None and violation.message.startswith("must be between")
    else:
        assert numbers.decimal_integer(text) == want == read
        assert not found


@pytest.mark.parametrize("text", NOT_GO_DECIMAL)
def test_what_python_reads_and_go_does_not_is_no_integer(text: str) -> None:
    assert numbers.decimal_integer(text) is None
    found = Violations()
    assert check_integer_text(found, 'annotations["x"][0].devmem', text) is None
    [violation] = violations_of(found)
    assert violation.path == 'annotations["x"][0].devmem'
    # The received text is quoted shortened, whatever its length.
    assert len(violation.message) < 200


def test_leading_zeros_are_read_as_go_reads_them_however_many() -> None:
    assert numbers.decimal_integer("0" * 100_000 + "42") == 42
    assert numbers.decimal_integer("-" + "0" * 50 + "7") == -7
    assert numbers.decimal_integer("+" + "0" * 50) == 0


@given(st.integers(min_value=-(10**32) + 1, max_value=10**32 - 1))
def test_every_integer_of_up_to_32_digits_reads_back(value: int) -> None:
    assert numbers.decimal_integer(str(value)) == value
    assert numbers.decimal_integer(f"+{abs(value)}") == abs(value)


@pytest.mark.parametrize(("value", "low", "high", "want"), [
    pytest.param(Decimal("42"), 0, 100, 42, id="whole and in range"),
    pytest.param(Decimal("4.2E+1"), 0, 100, 42, id="whole written with an exponent"),
    pytest.param(Decimal("42.5"), 0, 100, None, id="a fraction"),
    pytest.param(Decimal("-1"), 0, 100, None, id="below the range"),
    pytest.param(Decimal("101"), 0, 100, None, id="above the range"),
    pytest.param(Decimal("1e1000000"), 0, 10**12, None, id="a million digits, not converted"),
    pytest.param(Decimal("1e2147483647"), 0, 10**12, None, id="two billion digits"),
    pytest.param(Decimal("Infinity"), 0, 10**12, None, id="infinity"),
])
@pytest.mark.timeout(30)
def test_whole_decimal_compares_before_it_converts(
    value: Decimal, low: int, high: int, want: int | None
) -> None:
    assert numbers.whole_decimal(value, low, high) == want


@pytest.mark.timeout(30)
def test_a_quantity_of_two_billion_digits_saturates_without_converting() -> None:
    value = quantity.parse_quantity("1e2147483647")
    assert numbers.saturated_whole(value, 2**63 - 1) == 2**63 - 1
    assert numbers.saturated_whole(Decimal(1536), 2**63 - 1) == 1536


@pytest.mark.parametrize(("text", "want"), [
    pytest.param('{"n": 12}', {"n": 12}, id="a small integer is an int"),
    pytest.param('{"n": ' + "9" * 33 + "}", {"n": Decimal("9" * 33)},
                 id="33 digits stay an exact Decimal"),
    pytest.param('{"n": ' + "9" * 5000 + "}", {"n": Decimal("9" * 5000)},
                 id="5000 digits: json.loads would raise ValueError"),
    pytest.param('{"n": 1.5}', {"n": Decimal("1.5")}, id="a fraction is exact"),
    pytest.param('{"n": 1e400}', {"n": Decimal("1e400")}, id="no float overflow"),
])
def test_json_loads_reads_numbers_exactly_and_boundedly(text: str, want: object) -> None:
    assert numbers.json_loads(text) == want


@pytest.mark.parametrize("text", [
    pytest.param("1e-999999999999999999999", id="an exponent below Decimal's least"),
    pytest.param("1e999999999999999999999", id="an exponent above Decimal's greatest"),
    pytest.param("-0.5E+99999999999999999999999", id="a negative fraction, huge exponent"),
])
def test_an_exponent_past_decimal_is_a_value_error_naming_the_number(text: str) -> None:
    # decimal.InvalidOperation is no ValueError: raised as one, the readers refuse it as
    # JSON that cannot be read instead of letting it out as an internal error.
    with pytest.raises(ValueError, match="out of range"):
        numbers.json_loads('{"devmem": ' + text + "}")


def test_plain_json_loads_raises_on_the_integer_json_loads_keeps() -> None:
    text = '{"devmem": ' + "9" * 5000 + "}"
    with pytest.raises(ValueError, match="4300 digits"):
        json.loads(text)
    assert numbers.json_loads(text) == {"devmem": Decimal("9" * 5000)}


@pytest.mark.parametrize(("value", "want"), [
    pytest.param(7, 7, id="an int"),
    pytest.param(True, None, id="JSON true is a Python int: refused as Go refuses it"),
    pytest.param(Decimal("9" * 5000), None, id="a long integer kept as a Decimal"),
    pytest.param(Decimal("1.5"), None, id="a fraction"),
    pytest.param("7", None, id="a string"),
    pytest.param(None, None, id="null"),
    pytest.param(INT32_MAX + 1, None, id="beyond int32"),
])
def test_check_json_integer_names_the_field_and_quotes_briefly(value: object,
                                                               want: int | None) -> None:
    found = Violations()
    assert check_json_integer(found, "x.devmem", value) == want
    if want is None:
        [violation] = violations_of(found)
        assert violation.path == "x.devmem"
        assert violation.message.startswith(f"must be an integer between 0 and {INT32_MAX}, got")
        assert len(violation.message) < 200
