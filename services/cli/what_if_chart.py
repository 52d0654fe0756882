"""The what-if chart: GPU memory reserved over time per rule, with what the running containers
request for reference.

Layer: services/cli (the output of what-if). matplotlib is the project's optional ``what-if``
extra (installed by ``make up`` and ``make test``), imported only when a chart is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from accounting.counting_rules import CountingRule
from whatif.results import RuleResult

INSTALL_HINT = (
    "install the project's what-if extra from the checkout (.venv/bin/pip install -e '.[what-if]'; "
    "make up and make test install it), or matplotlib itself"
)
"""hami-accounting is not published on PyPI: the extra is installed from the checkout."""

# One colour per rule, the same in every chart (colour-blind safe, from matplotlib's tab10).
COLOURS = {
    CountingRule.SUMMED: "#d62728",
    CountingRule.HAMI_V2_10: "#ff7f0e",
    CountingRule.SHRINK: "#1f77b4",
    CountingRule.PROGRESSIVE: "#2ca02c",
}


class ChartUnavailableError(RuntimeError):
    """matplotlib is not installed."""


def write_chart(
    results: Sequence[RuleResult], path: Path, *, capacity_mib: int | None = None
) -> None:
    """Writes the PNG. Top: per rule, GPU memory reserved (solid) and requested by the running
    containers under that rule's placements (dashed), and the pool's memory (grey). Below, on a
    log scale both ways: reserved but idle above zero, running beyond the reservation below
    (summed per pod: one pod's idle share does not make up for another's shortfall).

    Raises:
        ChartUnavailableError: matplotlib is missing (the message says how to install it).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
        from matplotlib.lines import Line2D
        from matplotlib.ticker import FuncFormatter
    except ImportError as error:
        raise ChartUnavailableError(
            f"the chart needs matplotlib ({error}): {INSTALL_HINT}"
        ) from None

    figure, (top, bottom) = pyplot.subplots(
        2, 1, figsize=(10, 7.5), dpi=110, sharex=True, gridspec_kw={"height_ratios": (3, 2)}
    )
    try:
        handles = []
        for result in results:
            colour = COLOURS[result.rule]
            hours = [t / 3600 for t in (*result.times_s, result.window_s)]

            def gib(values: tuple[int, ...], sign: int = 1) -> list[float]:
                return [sign * m / 1024 for m in (*values, values[-1])]

            top.step(hours, gib(result.reserved_mib), where="post", color=colour, linewidth=1.5)
            top.step(
                hours,
                gib(result.requested_mib),
                where="post",
                color=colour,
                linewidth=0.9,
                linestyle=(0, (3, 2)),
                alpha=0.85,
            )
            bottom.step(hours, gib(result.idle_mib), where="post", color=colour, linewidth=1.2)
            bottom.step(
                hours,
                gib(result.unreserved_mib, -1),
                where="post",
                color=colour,
                linewidth=1.2,
                linestyle=(0, (1, 1)),
            )
            handles.append(Line2D([], [], color=colour, linewidth=2, label=result.rule.title))
        handles.append(Line2D([], [], color="black", linewidth=1.5, label="reserved"))
        handles.append(
            Line2D(
                [],
                [],
                color="black",
                linewidth=0.9,
                linestyle=(0, (3, 2)),
                label="requested by running containers",
            )
        )
        if capacity_mib:
            top.axhline(capacity_mib / 1024, color="#7f7f7f", linewidth=1, linestyle=":")
            handles.append(
                Line2D(
                    [],
                    [],
                    color="#7f7f7f",
                    linewidth=1,
                    linestyle=":",
                    label="GPU memory of the pool",
                )
            )
        top.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
        top.set_ylabel("GPU memory, GiB")
        top.set_title(
            "GPU memory reserved under each accounting rule, and requested by the "
            "containers running",
            fontsize=10.5,
        )
        top.set_ylim(bottom=0)
        bottom.axhline(0, color="black", linewidth=0.6)
        # A log scale both ways: the summed rule idles tens of thousands of GiB, the others
        # tens; a linear axis would show one line and three flat ones.
        bottom.set_yscale("symlog", linthresh=1)
        bottom.set_ylabel("GiB, log scale", fontsize=9)
        bottom.set_title(
            "above 0: reserved but idle (solid); below 0: running beyond the reservation (dotted)",
            fontsize=9,
        )
        bottom.set_xlabel("hours since the first pod arrived")
        bottom.set_xlim(0, max(r.window_s for r in results) / 3600)
        for axes in (top, bottom):
            axes.grid(True, linewidth=0.4, alpha=0.5)
        figure.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
        figure.tight_layout(rect=(0, 0.07, 1, 1))
        figure.savefig(path, format="png")
    finally:
        pyplot.close(figure)
