"""What the journal's integrity checks cost at recovery: 100,000 pods loaded with and without
them, in one process, alternating rounds.

Layer: benchmark. The journal is the recorder-scale one (bench/recorder_scale.build_journal:
100,000 pods on 12,500 nodes, written through the store). ``Journal.load()`` checks the file's
structure (``PRAGMA quick_check``), every row's CRC-32 and the revision against the watermark;
``Journal.load(verify=False)`` reads the same rows without the first two. quick_check is also
timed on its own. The ratio is the recovery-time cost of detecting a damaged journal.
"""

from __future__ import annotations

import gc
import statistics
import time
from pathlib import Path

from bench import recorder_scale
from services.usage.journal import Journal


def run(work_dir: Path, pods: int = 100_000, rounds: int = 5) -> dict[str, object]:
    data_dir = work_dir / "integrity"
    built = recorder_scale.build_journal(data_dir, pods)
    journal = Journal.in_data_dir(data_dir)
    timings: dict[str, list[float]] = {"checked": [], "unchecked": [], "quick_check": []}
    try:
        for _ in range(rounds):
            for verify in (True, False):
                # As UsageStore.recover loads: without the cyclic collector walking the heap.
                gc.disable()
                try:
                    started = time.perf_counter()
                    state = journal.load(verify=verify)
                    timings["checked" if verify else "unchecked"].append(
                        time.perf_counter() - started)
                finally:
                    gc.enable()
                if len(state.pods) != pods or state.damage is not None:
                    raise RuntimeError(f"loaded {len(state.pods)} pods, damage {state.damage}")
                del state
            started = time.perf_counter()
            with journal._lock:  # the bench reads the connection the load uses
                assert journal._db is not None
                journal._db.execute("PRAGMA quick_check").fetchall()
            timings["quick_check"].append(time.perf_counter() - started)
    finally:
        journal.close()
    medians = {key: statistics.median(values) for key, values in timings.items()}
    return {
        "pods": pods,
        "journal_mib": built["journal_mib"],
        "load_checked_s": round(medians["checked"], 3),
        "load_unchecked_s": round(medians["unchecked"], 3),
        "quick_check_s": round(medians["quick_check"], 3),
        "checks_cost_s": round(medians["checked"] - medians["unchecked"], 3),
        "checked_over_unchecked": round(medians["checked"] / medians["unchecked"], 3),
        "rounds": {key: [round(v, 3) for v in values] for key, values in timings.items()},
    }


if __name__ == "__main__":
    import json
    import sys
    import tempfile

    pods = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    with tempfile.TemporaryDirectory() as directory:
        print(json.dumps(run(Path(directory), pods), indent=2))
