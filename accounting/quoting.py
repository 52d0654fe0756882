"""How an error message shows a value it received: quoted, shortened and escaped to printable
ASCII, so hostile input stays small whatever its alphabet; a decoded JSON value by its kind.

Layer: accounting (pure).
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring_ascii


def json_kind(value: object) -> str:
    """What a decoded JSON value is, for messages: "an object", "a string", "null"..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    return "a number"


MAX_QUOTED_CHARS = 80
"""Characters of a received value an error quotes back (``quote``), escapes included."""


def quote(text: str, limit: int = MAX_QUOTED_CHARS) -> str:
    r"""Quotes a received value for an error message as a JSON string of printable ASCII (any
    other character as its JSON escape, ``"\u00e9"``), at most ``limit`` characters between
    the quotes, then ``... (N characters)`` when it was longer: hostile input stays small
    whatever its alphabet."""
    quoted = json.dumps(text[:limit])
    if len(quoted) <= limit + 2 and len(text) <= limit:
        return quoted
    # Character by character, so no escape is cut in two (at most ``limit`` of them).
    kept: list[str] = []
    size = 0
    for character in text[:limit]:
        escaped = encode_basestring_ascii(character)[1:-1]
        if size + len(escaped) > limit:
            break
        kept.append(escaped)
        size += len(escaped)
    return f'"{"".join(kept)}"... ({len(text)} characters)'


def shown(value: object) -> str:
    """A received JSON value for a message, kept short: strings quoted and shortened, numbers,
    booleans and null as JSON writes them, objects and arrays by their kind only."""
    if isinstance(value, str):
        return quote(value)
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, dict | list):
        return json_kind(value)
    number = str(value)
    if len(number) <= MAX_QUOTED_CHARS:
        return number
    return f"{number[:MAX_QUOTED_CHARS]}... ({len(number)} characters)"
