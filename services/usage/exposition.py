"""Prometheus text-format lines written directly, for the families the recorder renders at scrape
time from a reading of its store.

Layer: services/usage (runtime). These families have one series per device and per pod device
(at 5,000 nodes × 8 GPUs, 600,000 series); prometheus_client's exposition validates and
escapes the label names of every line of every sample, for seconds per scrape with the GIL
held (docs/observability.md, ``bench/metrics_scrape.py --baseline``), so they are written here
instead: a series'
label set is escaped once and kept while its device or pod is unchanged
(``services.usage.scrape``). Only gauges are written this
way, whose lines are the same in the text format 0.0.4 and in OpenMetrics.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def escape_label_value(value: str) -> str:
    """A label value as the text format quotes it (backslash, double quote and newline)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def label_set(pairs: Iterable[tuple[str, str]]) -> str:
    """``{name="value",...}`` with the names sorted, as Prometheus' Go client writes them."""
    return "{" + ",".join(
        f'{name}="{escape_label_value(value)}"' for name, value in sorted(pairs)
    ) + "}"


def number(value: float) -> str:
    """A sample value: integers without a fraction, other floats in their shortest form."""
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 2**63:
        return str(int(value))
    return repr(value)


def header(name: str, help_text: str, kind: str = "gauge") -> str:
    """The ``# HELP`` and ``# TYPE`` lines of a family."""
    escaped = help_text.replace("\\", "\\\\").replace("\n", "\\n")
    return f"# HELP {name} {escaped}\n# TYPE {name} {kind}\n"


def family(name: str, help_text: str, chunks: Sequence[str]) -> str:
    """A gauge family: its header and its series lines (pre-rendered chunks, each a run of
    whole lines); nothing at all when there is no series, as Prometheus' Go client does."""
    body = "".join(chunks)
    if not body:
        return ""
    return header(name, help_text) + body
