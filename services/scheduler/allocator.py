"""The C allocator's settings for the scheduler's column arithmetic (glibc only).

Layer: services/scheduler (runtime). Each Filter computes on copies of its candidates' columns:
at 5,000 nodes × 8 devices one int64 column is 320 KB, and a Filter allocates a few dozen such
temporaries. glibc serves allocations above its mmap threshold with fresh ``mmap`` pages and
hands them back on free, so every temporary pays its page faults again; with these settings the
vectorized fit and the copy of the candidates' rows take a fraction of their CPU time under
glibc's defaults (docs/scheduler-measurements.md). Raising the threshold keeps such blocks on
the heap, and a high trim threshold keeps freed heap memory for the next Filter instead of
returning it at once.

The cost is memory held: the heap keeps its high-water mark (a few MiB of columns per Filter
running at once), which the benchmark reports as the scheduler's resident memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

_LOG = logging.getLogger(__name__)

# mallopt parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
"""Blocks below this come from the heap (glibc's maximum for the setting is 32 MiB on 64-bit)."""
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024
"""Free heap memory above this is returned to the system."""
TOP_PAD_BYTES = 16 * 1024 * 1024
"""Extra heap grown at once, so a Filter's temporaries do not grow it page by page."""


def keep_large_blocks_on_the_heap() -> bool:
    """Applies the settings (module docstring); False where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    applied = all(
        mallopt(parameter, value) == 1
        for parameter, value in (
            (_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
            (_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
            (_M_TOP_PAD, TOP_PAD_BYTES),
        )
    )
    if not applied:
        _LOG.info("the C allocator did not take the scheduler's settings; running with its own")
    return applied
