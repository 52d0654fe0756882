"""JSON received from outside (a request, an annotation, the Kubernetes API) decoded into
values: numbers exactly and boundedly, every string one UTF-8 can carry, errors at the path
where the text was received.

Layer: accounting (pure). The one place where received JSON text becomes values
(``decode_json``); the readers of Kubernetes objects and HAMi annotations start here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from accounting import numbers
from accounting.errors import InvalidInputError, Violations
from accounting.quoting import json_kind, quote


def json_object(raw: bytes | str, path: str) -> dict[str, Any]:
    """Decodes ``raw`` as one JSON object (what Go's ``json.Marshal`` writes for a Kubernetes
    object), numbers read exactly and boundedly (``decode_json``).

    Raises:
        InvalidInputError: at ``path``: not JSON, nested too deeply, or not an object; or
            text UTF-8 cannot carry, at the string's own path.
    """
    document = decode_json(raw, path)
    if not isinstance(document, dict):
        raise InvalidInputError.single(path, f"must be a JSON object, got {json_kind(document)}")
    return document


InvalidJson = str | Callable[[ValueError], str]
"""What ``decode_json`` says of text that is not JSON: a message, or one made from the error."""


def decode_json(
    raw: bytes | str,
    path: str,
    *,
    invalid: InvalidJson | None = None,
) -> object:
    r"""Decodes JSON text received from outside (a request, an annotation, the Kubernetes API):
    the one place where such text becomes values, so every decoded string is one UTF-8 can
    carry.

    JSON may write a lone UTF-16 surrogate (``"\ud800"``) that no UTF-8 text can hold:
    Python decodes it into a string that protobuf, SQLite and every encoder after the
    decoder refuse, so it is refused here, naming the string (``check_text``).

    Args:
        raw: the text, as bytes (UTF-8) or str.
        path: where the text was received, for errors, e.g.
            ``kubernetes_node_json.metadata.annotations["hami.io/node-nvidia-register"]``.
        invalid: the message for text that is not JSON (default "not valid JSON (why)").

    Raises:
        InvalidInputError: not JSON, nested too deeply, or a string UTF-8 cannot carry.
    """
    try:
        # Exact numbers: a Kubernetes quantity may be a JSON number, and 1e400 is no float;
        # an integer of thousands of digits stays a Decimal for its field to refuse.
        document: object = numbers.json_loads(raw)
    except ValueError as error:  # UnicodeDecodeError included
        if invalid is None:
            message = f"not valid JSON ({error})"
        else:
            message = invalid if isinstance(invalid, str) else invalid(error)
        raise InvalidInputError.single(path, message) from None
    except RecursionError:
        # json.loads recurses per nesting level; hostile input can nest deeper than the stack.
        raise InvalidInputError.single(path, "not valid JSON (nested too deeply)") from None
    # Only an escape or an encoded surrogate (json.loads decodes bytes with "surrogatepass")
    # can make one: text with neither needs no walk. A valid pair matches too and is walked.
    # json.loads also reads UTF-16 and UTF-32 (zero bytes among the first four), whose
    # surrogates neither pattern sees: those are always walked.
    # Substring tests first: a C scan each, a fraction of the pattern's cost on a whole pod.
    if isinstance(raw, bytes):
        may_hold = b"\x00" in raw[:4] or (
            (b"\\u" in raw or b"\xed" in raw) and _SURROGATE_ESCAPE_BYTES.search(raw) is not None
        )
    else:
        may_hold = ("\\u" in raw or not raw.isascii()) and (
            _SURROGATE_OR_ESCAPE.search(raw) is not None
        )
    if may_hold:
        check_text(document, path)
    return document


_SURROGATE_ESCAPE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_SURROGATE_OR_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")
_CHECK_ENCODER = json.JSONEncoder(ensure_ascii=False, check_circular=False, default=str)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_text(document: object, path: str = "") -> None:
    r"""Refuses decoded JSON (objects, arrays, strings, numbers) holding a string or key that
    UTF-8 cannot encode — a lone surrogate, the only such text a Python string can hold.

    One C-speed encoding proves the common case; the walk that names each bad string only
    runs when it fails. Keys join the path as ``.name`` when they are identifiers, else as
    ``["key"]``, e.g. ``metadata.annotations["hami.io/node-nvidia-register"]``.

    Raises:
        InvalidInputError: naming each such string, e.g. ``[0].type: must be text UTF-8 can
            encode, got a lone surrogate U+D800 at character 6 of "NVIDIA\ud800"``.
    """
    try:
        _CHECK_ENCODER.encode(document).encode("utf-8")
    except UnicodeEncodeError:
        pass
    else:
        return
    found = Violations()
    # Iterative, in document order: decoded JSON may nest almost as deep as the stack allows.
    stack: list[tuple[object, str, str | None]] = [(document, path, None)]
    while stack:
        value, at, key = stack.pop()
        if key is not None:
            _check_encodable(found, at, key, what="a key")
        if isinstance(value, str):
            _check_encodable(found, at, value)
        elif isinstance(value, dict):
            stack.extend(
                (item, _key_path(at, str(name)), str(name))
                for name, item in reversed(value.items())
            )
        elif isinstance(value, list | tuple):
            stack.extend(
                (item, f"{at}[{index}]", None) for index, item in reversed(list(enumerate(value)))
            )
    found.raise_if_any()


def _key_path(path: str, key: str) -> str:
    if _IDENTIFIER.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{quote(key)}]"


def _check_encodable(found: Violations, path: str, text: str, what: str = "text") -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        found.add(
            path,
            f"must be {what} UTF-8 can encode, got a lone surrogate "
            f"U+{ord(text[error.start]):04X} at character {error.start} of {quote(text)}",
        )


def bounded_json_array(
    document: object, path: str, *, items: str, noun: str, limit: int
) -> list[Any]:
    """``document`` (decoded JSON, not null) as a list of at most ``limit`` entries; else an
    error at ``path`` such as "must be a JSON array of devices, got an object"."""
    if not isinstance(document, list):
        raise InvalidInputError.single(
            path, f"must be a JSON array of {items}, got {json_kind(document)}"
        )
    if len(document) > limit:
        raise InvalidInputError.single(path, f"at most {limit} {noun}, got {len(document)}")
    return document
