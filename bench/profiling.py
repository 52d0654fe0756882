"""Profiles behind a missed goal: py-spy for time, tracemalloc for the recorder's memory.

Layer: benchmark. ``make bench`` profiles each missed goal and writes the top entries (file:
function, share of samples) into the results, so the cause is read from evidence:

* a daemon under load: ``py-spy record --pid`` while the figure's calls run again, idle
  threads excluded (``record_pid`` + ``summarize``);
* a command from start to exit: ``py-spy record -- python -m bench.profiling recover DIR``,
  which opens the journal in DIR and runs the recorder's recovery once;
* fit compute: ``python -m bench.profiling fit 5000`` runs fit_pod over 5,000 nodes for 3 s;
* resident memory per tracked pod: ``python -m bench.profiling memory DIR`` recovers under
  tracemalloc and prints the allocation sites still holding memory, biggest first.

Self share: samples whose innermost frame is the entry (by package: whose innermost frame is in
the package). Inclusive share: samples with the entry anywhere on the stack. For a daemon
sampled by wall clock, shares are of the samples inside handled calls (under the call
telemetry's wrapper), so a wait on another daemon shows as the grpc frame that waits; sampled by GIL
holder (``--gil``), of where its CPU goes; for a command, of all samples outside idle threads.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.procs import ROOT

PYSPY = "py-spy"
HANDLER = "unary_response.<locals>.observed"
"""The call telemetry's wrapper of a unary handler (services/common/server/call_telemetry.py):
every handled unary call runs inside it."""
RATE_HZ = 250
TOP = 8


def pyspy_path() -> str | None:
    beside = Path(sys.executable).with_name(PYSPY)
    return str(beside) if beside.is_file() else shutil.which(PYSPY)


def _frame_name(frame: str) -> tuple[str, str]:
    """'function (path:line)' -> ('relative/path.py:function', file path)."""
    function, _, location = frame.rpartition(" (")
    path = location.rstrip(")").rsplit(":", 1)[0]
    for prefix in (str(ROOT) + "/", "/work/main/"):
        if path.startswith(prefix):
            path = path[len(prefix):]
    if "site-packages/" in path:
        path = path.split("site-packages/", 1)[1]
    elif "/lib/python3" in path:
        path = "stdlib/" + path.split("/lib/python3", 1)[1].split("/", 1)[-1]
    return f"{path}:{function or frame}", path


IDLE = ("threading.py:Condition.wait", "thread.py:_worker", "_server.py:_serve")
"""Frames where a daemon's pool threads wait for work (py-spy cannot always tell them idle)."""


def summarize(raw_path: Path, top: int = TOP, focus: str | None = None) -> dict[str, Any]:
    """Top self and inclusive entries of a py-spy raw (collapsed stacks) file.

    With ``focus`` (a substring of a frame name, e.g. the call telemetry's ``HANDLER``),
    only stacks through that frame count: the shares are then of the time spent inside
    handled calls, waits on other services included.
    """
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    project: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    total = 0
    for line in raw_path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        names = [_frame_name(f) for f in stack.split(";") if " (" in f and "0x" not in f[:2]]
        if not names:
            continue
        if focus is not None and not any(focus in name for name, _ in names):
            continue
        if focus is None and names[-1][0].endswith(IDLE):
            continue
        total += count
        own[names[-1][0]] += count
        seen = set()
        for name, path in names:
            if name in seen:
                continue
            seen.add(name)
            inclusive[name] += count
            if path.startswith(("accounting/", "services/")):
                project[name] += count
        packages[_package(names[-1][1])] += count

    def shares(counter: Counter[str]) -> list[list[Any]]:
        if not total:
            return []
        return [[name, round(count / total, 3)] for name, count in counter.most_common(top)]

    return {"samples": total, "focus": focus, "self": shares(own),
            "inclusive": shares(inclusive), "project_inclusive": shares(project),
            "packages": shares(packages)}


def _package(path: str) -> str:
    """The top-level package of a frame's path (stdlib modules by name)."""
    parts = path.split("/")
    if parts[0] == "stdlib" and len(parts) > 1:
        return parts[1].removesuffix(".py")
    return parts[0].removesuffix(".py")


def record_pid(pid: int, seconds: float, out: Path, *, gil: bool = False,
               native: bool = False) -> subprocess.Popen[bytes] | None:
    """Starts sampling a running process for ``seconds``; None without py-spy.

    ``gil``: only samples of the thread holding the GIL (where the CPU goes), instead of every
    thread's stack (where the calls' time goes, waits included). ``native``: C frames too (the
    system calls grpc makes with the GIL held show up by name); py-spy then has to pause the
    process for each sample (it refuses ``--nonblocking`` with ``--native``).
    """
    binary = pyspy_path()
    if binary is None:
        return None
    return subprocess.Popen(
        [binary, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))),
         "--rate", str(RATE_HZ), "--format", "raw", "--output", str(out), "--full-filenames",
         *(["--gil"] if gil else []), *(["--native"] if native else ["--nonblocking"])],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def finish(recording: subprocess.Popen[bytes] | None, out: Path,
           focus: str | None = HANDLER) -> dict[str, Any]:
    if recording is None:
        return {"error": "py-spy is not installed (pip install -e '.[bench]')"}
    _, stderr = recording.communicate(timeout=120)
    if recording.returncode != 0 or not out.is_file():
        return {"error": f"py-spy failed: {stderr.decode(errors='replace').strip()[-500:]}"}
    return summarize(out, focus=focus)


def record_command(argv: list[str], out: Path) -> dict[str, Any]:
    """Samples a command from start to exit."""
    binary = pyspy_path()
    if binary is None:
        return {"error": "py-spy is not installed (pip install -e '.[bench]')"}
    done = subprocess.run(
        [binary, "record", "--rate", str(RATE_HZ), "--format", "raw", "--output", str(out),
         "--full-filenames", "--", *argv], cwd=ROOT, capture_output=True, check=False)
    if done.returncode != 0 or not out.is_file():
        return {"error": f"py-spy failed: {done.stderr.decode(errors='replace').strip()[-500:]}"}
    return summarize(out)


def profile_recovery(data_dir: Path, out: Path) -> dict[str, Any]:
    return record_command([sys.executable, "-m", "bench.profiling", "recover", str(data_dir)],
                          out)


def profile_memory(data_dir: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "bench.profiling", "memory", str(data_dir)],
                          cwd=ROOT, capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-1000:]}
    return dict(json.loads(done.stdout))


def _open_store(data_dir: Path) -> Any:
    from accounting.ledger import Ledger
    from services.usage.journal import Journal
    from services.usage.store import UsageStore

    return UsageStore(Ledger(), Journal.in_data_dir(data_dir))


def _recover(data_dir: Path) -> None:
    store = _open_store(data_dir)
    started = time.perf_counter()
    summary = store.recover()
    print(f"recovered {summary.pods} pods in {time.perf_counter() - started:.3f} s")


def _memory(data_dir: Path) -> None:
    import gc
    import tracemalloc

    store = _open_store(data_dir)
    tracemalloc.start(1)
    before = tracemalloc.take_snapshot()
    summary = store.recover()
    gc.collect()
    after = tracemalloc.take_snapshot()
    stats = after.compare_to(before, "lineno")
    held = sum(s.size_diff for s in stats)
    pods = max(summary.pods, 1)
    top = []
    for stat in stats[:TOP]:
        frame = stat.traceback[0]
        name, _ = _frame_name(f"? ({frame.filename}:{frame.lineno})")
        top.append([f"{name.rsplit(':', 1)[0]}:{frame.lineno}", round(stat.size_diff / pods, 1),
                    round(stat.size_diff / held, 3) if held else 0.0])
    print(json.dumps({"pods": summary.pods, "python_heap_bytes_per_pod": round(held / pods, 1),
                      "top_sites_bytes_per_pod_share": top}))


def _fit(node_count: str) -> None:
    from accounting import fit
    from bench.naive_fit import _benchmark_nodes, _benchmark_pod

    pod, nodes = _benchmark_pod(), _benchmark_nodes(int(node_count))
    deadline = time.perf_counter() + 3.0
    while time.perf_counter() < deadline:
        fit.fit_pod(pod, nodes)


if __name__ == "__main__":
    command, argument = sys.argv[1], sys.argv[2]
    if command == "fit":
        _fit(argument)
    else:
        {"recover": _recover, "memory": _memory}[command](Path(argument))
