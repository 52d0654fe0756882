"""``python -m bench`` (``make bench``): run the suite and write results, table and chart.

Options:
    --quick          minimal iterations and sizes (the smoke test); writes to --out-dir
    --out-dir DIR    write latest.json, benchmarks.md and benchmarks.png into DIR instead of
                     bench/results/ and docs/
    --render         rebuild docs/benchmarks.md and the chart from bench/results/latest.json
    --keep           keep the run's work directory (daemon logs, journals, raw profiles)
    --no-chart       skip the PNG (then matplotlib is not needed)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

from bench import report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out-dir", type=Path)
    parser.add_argument("--render", action="store_true")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--no-chart", action="store_true")
    args = parser.parse_args(argv)

    if not args.no_chart and importlib.util.find_spec("matplotlib") is None:
        print(f"python -m bench: matplotlib is missing; {report.install_hint()}",
              file=sys.stderr)
        return 2
    paths: dict[str, Path | None] = {}
    if args.out_dir is not None:
        paths = {"json_path": args.out_dir / "latest.json",
                 "markdown_path": args.out_dir / "benchmarks.md",
                 "chart_path": args.out_dir / "benchmarks.png"}
    if args.no_chart:
        paths["chart_path"] = None
    if args.render:
        results = json.loads(report.RESULTS.read_text())
        report.write_all(results, **paths)
        return 0

    from bench import suite

    results = suite.run(suite.QUICK if args.quick else suite.FULL, keep_work_dir=args.keep)
    report.write_all(results, **paths)
    print(report.markdown(results, chart_name=None))
    missed = [g["goal"] for g in results["goals"] if not g["pass"]]
    burst = results["burst"]
    if burst["errors"] or not burst["no_double_allocation"]:
        print("burst: errors or double allocation, see above", file=sys.stderr)
        return 1
    replicas = next(iter(results["scheduler_scale"]["steps"].values()))["replicas"]
    if replicas["errors"] or not replicas["check"]["no_double_booking"]:
        print("scheduler scale: errors or double booking over two replicas, see above",
              file=sys.stderr)
        return 1
    if missed:
        print(f"{len(missed)} goal(s) missed (profiles in the results): " + "; ".join(missed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
