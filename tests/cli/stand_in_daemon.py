"""A stand-in daemon for the `hami-accounting up` tests: health only, stops on SIGTERM/SIGINT.

Run as ``python stand_in_daemon.py NAME``; it listens where HAMI_ACCOUNTING_LISTEN_ADDR says,
exits with code 3 at once when FAKE_DAEMON_FAIL names it, and prints a line when it stopped
cleanly through run_until_signalled (so the test sees the graceful path was taken).
"""

from __future__ import annotations

import os
import sys

from services.common.config import CommonConfig
from services.common.server import build_server, run_until_signalled

SERVICE_NAMES = {
    "admission": "hami.accounting.v1.Admission",
    "scheduler": "hami.accounting.v1.Scheduler",
    "usage": "hami.accounting.v1.UsageRecorder",
}


def main(name: str) -> int:
    if os.environ.get("FAKE_DAEMON_FAIL") == name:
        print(f"fake {name}: failing on purpose", file=sys.stderr, flush=True)
        return 3
    config = CommonConfig.from_env(os.environ, 0, 0)
    handle = build_server(service_names=[SERVICE_NAMES[name]], register=lambda _server: None,
                          listen_addr=config.listen_addr, max_workers=2)
    run_until_signalled(handle, on_stop=lambda: print(f"fake {name} stopped cleanly", flush=True),
                        grace_s=1.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
