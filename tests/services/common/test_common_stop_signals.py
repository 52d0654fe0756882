"""A SIGTERM that arrives while a daemon is still starting stops it gracefully once it has
started, instead of killing it: a daemon reports SERVING as soon as its gRPC server is up,
and its start may still run then (seen as a scheduler killed by SIGTERM, exit -15, in the end
to end stack's stop right after its first Filter)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

# The admission daemon's own spec, with a start that is signalled before it returns.
PROGRAM = textwrap.dedent(
    """
    import dataclasses, os, signal, sys
    from services.admission import __main__ as admission
    from services.common.daemon import run

    def start(config, tracer_provider):
        daemon = admission.SPEC.start(config, tracer_provider)
        os.kill(os.getpid(), signal.SIGTERM)
        return daemon

    spec = dataclasses.replace(admission.SPEC, start=start)
    sys.exit(run(spec, ["--listen", "127.0.0.1:0", "--metrics", "off",
                        "--usage-addr", "127.0.0.1:1"]))
    """
)


def test_a_sigterm_during_the_start_stops_the_daemon_cleanly() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=REPO, capture_output=True, text=True, timeout=60
    )

    assert done.returncode == 0, done.stderr[-2000:]
    assert "stopping on SIGTERM" in done.stderr
    assert "admission daemon serving" in done.stderr
