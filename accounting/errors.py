"""Errors raised by the accounting rules.

Layer: accounting (pure). Domain exceptions never carry transport codes; services map them to
gRPC status codes in one place (services/common/errors.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One problem with one input field, e.g. ``pod.containers[1].grants[0].memory_mib``."""

    path: str
    message: str

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
