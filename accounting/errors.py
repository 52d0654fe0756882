"""Errors raised by the accounting rules.

Layer: accounting (pure). Domain exceptions never carry transport codes; services map them to
gRPC status codes in one place (services/common/errors.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MAX_PATH_CHARS = 300
"""Characters of one violation's path; a longer one (a path quoting a long annotation key
without ``quote``) is cut, saying how long it was."""
MAX_DESCRIPTION_CHARS = 1_000
"""Characters of one violation's message."""
MAX_MESSAGE_CHARS = 1_500
"""Characters of an error's whole message (``InvalidInputError.bounded``; every status message
on gRPC and every webhook answer). With every character printable ASCII, a status and its
BadRequest detail stay under gRPC's 8 KiB metadata limit, past which a client sees
RESOURCE_EXHAUSTED "received metadata size exceeds ..." instead of the error."""
_CUT = "... ({} characters)"


def bounded_text(text: str, limit: int) -> str:
    r"""``text`` as printable ASCII of at most ``limit`` characters: any other character
    written as its escape (``\u00e9``, ``\ud800``, ``\n``), and a longer result cut,
    ending with how long the text was: ``... (5000 characters)``."""
    if len(text) <= limit and text.isascii() and text.isprintable():
        return text
    escaped = (
        text
        if text.isascii() and text.isprintable()
        else "".join(c if " " <= c <= "~" else _escape(c) for c in text[: limit + 1])
    )
    if len(escaped) <= limit and len(text) <= limit:
        return escaped
    suffix = _CUT.format(len(text))
    kept = escaped[: max(limit - len(suffix), 0)]
    # An escape cut in two would read as other text: drop what is left of it.
    backslash = kept.rfind("\\", max(len(kept) - 10, 0))
    if backslash >= 0 and not _whole_escape(kept[backslash:]):
        kept = kept[:backslash]
    return kept + suffix


def _escape(character: str) -> str:
    code = ord(character)
    if character in "\n\r\t":
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}[character]
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _whole_escape(tail: str) -> bool:
    """Whether ``tail`` (from a backslash on) is complete as an escape or no escape at all."""
    kinds = {"u": 6, "U": 10}
    width = kinds.get(tail[1:2])
    return width is None or len(tail) >= width


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One problem with one input field, e.g. ``pod.containers[1].grants[0].memory_mib``.

    Whatever built it, its path and message are printable ASCII within ``MAX_PATH_CHARS`` and
    ``MAX_DESCRIPTION_CHARS`` (``bounded_text``): a message that quotes a received value
    without ``accounting.quoting.quote`` still cannot grow an error past its bounds.
    """

    path: str
    message: str

    def __post_init__(self) -> None:
        path, message = self.path, self.message
        if not (len(path) <= MAX_PATH_CHARS and path.isascii() and path.isprintable()):
            object.__setattr__(self, "path", bounded_text(path, MAX_PATH_CHARS))
        if not (
            len(message) <= MAX_DESCRIPTION_CHARS and message.isascii() and message.isprintable()
        ):
            object.__setattr__(self, "message", bounded_text(message, MAX_DESCRIPTION_CHARS))

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class AccountingError(Exception):
    """Base class of every error the accounting raises on purpose."""


class InvalidInputError(AccountingError):
    """Input that the rules cannot accept. Carries every offending field, not just the first."""

    def __init__(self, violations: Iterable[FieldViolation]) -> None:
        self.violations: tuple[FieldViolation, ...] = tuple(violations)
        if not self.violations:
            raise ValueError("InvalidInputError needs at least one violation")
        super().__init__("; ".join(str(v) for v in self.violations))

    @classmethod
    def single(cls, path: str, message: str) -> InvalidInputError:
        """An error about one field."""
        return cls([FieldViolation(path, message)])

    def bounded(
        self, limit: int = MAX_MESSAGE_CHARS, prefix: str = ""
    ) -> tuple[tuple[FieldViolation, ...], str]:
        """The leading violations whose message fits ``limit`` characters, with ``prefix``
        (at least one), closed by "and N more problems" on the last one's path when some are
        left out; and that message: ``prefix`` then ``path: message`` joined by "; "."""
        violations = self.violations
        kept: list[FieldViolation] = []
        size = len(prefix)
        for index, violation in enumerate(violations):
            piece = len(violation.path) + len(violation.message) + 2 + (2 if kept else 0)
            left = len(violations) - index - 1
            # Room for the closing "and N more problems" whenever something would follow.
            closing = len(violation.path) + len(f": and {left} more problems") + 2 if left else 0
            if kept and size + piece + closing > limit:
                break
            kept.append(violation)
            size += piece
        left_out = len(violations) - len(kept)
        if left_out:
            kept.append(FieldViolation(kept[-1].path, f"and {left_out} more problems"))
        message = prefix + "; ".join(str(v) for v in kept)
        return tuple(kept), message


MAX_REPORTED_VIOLATIONS = 100
"""An error lists at most this many fields, then says how many more there were."""


class Violations:
    """Collects violations while validating, then raises them all at once.

    Only the first ``limit`` are kept: a malformed annotation or a huge typed message can hold
    thousands of bad fields, and the error names the first few and counts the rest, so building
    it stays cheap and the message fits in a gRPC status.
    """

    def __init__(self, limit: int = MAX_REPORTED_VIOLATIONS) -> None:
        self._limit = limit
        self._found: list[FieldViolation] = []
        self._dropped = 0

    def add(self, path: str, message: str) -> None:
        """Adds one problem of the field at ``path``."""
        if len(self._found) < self._limit:
            self._found.append(FieldViolation(path, message))
        else:
            self._dropped += 1

    def extend(self, error: InvalidInputError, prefix: str = "") -> None:
        """Adds another error's violations, optionally under a path prefix."""
        for violation in error.violations:
            self.add(f"{prefix}{violation.path}", violation.message)

    def __bool__(self) -> bool:
        return bool(self._found)

    def __len__(self) -> int:
        """How many violations were added, kept or not (lets callers see if a step added any)."""
        return len(self._found) + self._dropped

    def raise_if_any(self) -> None:
        """Raises one ``InvalidInputError`` with every violation kept, if there is any."""
        if not self._found:
            return
        found = list(self._found)
        if self._dropped:
            last = found[-1]
            found.append(FieldViolation(last.path, f"and {self._dropped} more problems"))
        raise InvalidInputError(found)
