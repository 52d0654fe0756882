"""Mutations of annotation text for the fuzzers: the valid text of a vendor's annotation with a
few of its tokens replaced, doubled, dropped or joined by hostile ones.

Test support. A text is split into tokens (runs of ASCII digits, runs of letters, and single
other characters), so a mutation keeps most of the format around it and reaches the reader of
one field: a grant's memory becomes 4,301 nines, a JSON ``"index": "0"`` becomes ``"²"``, a
``devmem`` of 24576 becomes ``-1`` or ``1_0``, a separator disappears. ``HOSTILE`` lists what
Python's readers take differently from Go's (and from what HAMi writes).
"""

from __future__ import annotations

import random
import re

HOSTILE: tuple[str, ...] = (
    "9" * 4301, "9" * 5000, "9" * 33, "0" * 40 + "1", "2147483648", "4294967296",
    "9223372036854775808", "-1", "-0", "+1", "00", "0x10", "1e5", "1.5", "1_0", " 5", "5 ",
    "\u00b2", "\u00b2\u00b3", "\u0661\u0662", "\uff15", "\u0e51", "\u2167", "",
    "null", "true", "[]", "{}", '"x"', '"', "\\", ",", ":", ";", ",,", "::", ";;",
    "G" * 400, "G" * 100_000, "\x00", "\u202e", "e", "Ki", "1e1000000",
)
"""Hostile tokens: huge and long numbers, other scripts' digits (``int()`` reads some of them,
``isdigit()`` more), signs and separators, JSON of other types, long ids."""

_TOKEN = re.compile(r"[0-9]+|[A-Za-z]+|.", re.DOTALL)
_OPERATIONS = ("replace", "replace", "replace", "insert", "delete", "double")


def mutate(text: str, rng: random.Random, *, hostile: tuple[str, ...] = HOSTILE) -> str:
    """``text`` with one to three tokens changed (the empty text gets a hostile token)."""
    tokens = _TOKEN.findall(text) or [""]
    for _ in range(rng.randint(1, 3)):
        index = rng.randrange(len(tokens))
        operation = rng.choice(_OPERATIONS)
        if rng.random() < 0.8:
            token = rng.choice(hostile)
        else:
            token = "".join(rng.choice("0123456789,:;-\"{}[]ab ") for _ in range(rng.randint(1, 4)))
        if operation == "replace":
            tokens[index] = token
        elif operation == "insert":
            tokens.insert(index, token)
        elif operation == "delete" and len(tokens) > 1:
            del tokens[index]
        else:
            tokens.insert(index, tokens[index])
    return "".join(tokens)
