"""How big the reliability runs are: the CI size by default, the full size under ``make soak``
(``HAMI_ACCOUNTING_SOAK=1``). Every figure a run reaches is printed, so ``pytest -s`` shows them.
"""

from __future__ import annotations

import os

SOAK = os.environ.get("HAMI_ACCOUNTING_SOAK", "").strip().lower() not in ("", "0", "false", "no")
"""True under ``make soak``."""


def sized(ci: int, soak: int) -> int:
    """``soak`` under ``make soak``, ``ci`` otherwise."""
    return soak if SOAK else ci


def sized_s(ci: float, soak: float) -> float:
    """A duration in seconds: ``soak`` under ``make soak``, ``ci`` otherwise."""
    return soak if SOAK else ci


def report(test: str, **figures: object) -> None:
    """Prints one line of figures (shown with ``pytest -s`` and in the soak log)."""
    shown = ", ".join(f"{key}={value}" for key, value in figures.items())
    print(f"\n[reliability] {test}: {shown} ({'soak' if SOAK else 'ci'} size)")
