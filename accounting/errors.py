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


class Violations:
    """Collects violations while validating, then raises them all at once."""

    def __init__(self) -> None:
        self._found: list[FieldViolation] = []

    def add(self, path: str, message: str) -> None:
        self._found.append(FieldViolation(path, message))

    def extend(self, error: InvalidInputError, prefix: str = "") -> None:
        """Adds another error's violations, optionally under a path prefix."""
        for violation in error.violations:
            path = f"{prefix}{violation.path}" if prefix else violation.path
            self._found.append(FieldViolation(path, violation.message))

    def __bool__(self) -> bool:
        return bool(self._found)

    def raise_if_any(self) -> None:
        if self._found:
            raise InvalidInputError(self._found)
