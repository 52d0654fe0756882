"""Proves accounting/ and the what-if simulator (whatif/) import with no third-party package.

import-linter checks the import graph statically; this runs the package in a fresh
interpreter started with -S (no site-packages), so grpc, protobuf, kubernetes and
opentelemetry cannot be imported even by accident at run time.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import sys
sys.path.insert(0, {root!r})
import pkgutil, importlib
import accounting, whatif
for package in (accounting, whatif):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(module.name)
for banned in ("grpc", "google", "kubernetes", "opentelemetry"):
    assert banned not in sys.modules, banned
print("accounting and whatif import with the standard library only")
"""

if __name__ == "__main__":
    result = subprocess.run([sys.executable, "-S", "-c", PROBE.format(root=str(ROOT))], check=False)
    sys.exit(result.returncode)
