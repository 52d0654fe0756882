"""The cluster's GPU memory over one what-if replay: reserved, requested by the running
containers, reserved but idle, running beyond reservation, and each namespace's usage.

Layer: the what-if simulator (accounting and the standard library only). Every change goes
through ``stored`` (the ledger changed what it stores for a pod) or ``running`` (the pod's
running containers changed); both close the pod's stretch at its old figures first
(``ReplayedPod.advance``). ``mark`` adds a point to the curves when a total changed at a moment.
"""

from __future__ import annotations

from whatif.pod_life import ReplayedPod


class MemoryTotals:
    """The totals now, their step curves from 0, and each namespace's usage and peak."""

    __slots__ = (
        "curves",
        "idle",
        "namespace_peak",
        "namespace_used",
        "requested",
        "reserved",
        "times",
        "unreserved",
    )

    def __init__(self) -> None:
        self.reserved = 0
        self.requested = 0
        self.idle = 0
        self.unreserved = 0
        self.namespace_used: dict[str, int] = {}
        self.namespace_peak: dict[str, int] = {}
        self.times: list[int] = [0]
        # Reserved, requested, reserved but idle, running beyond reservation; one value per time.
        self.curves: tuple[list[int], ...] = ([0], [0], [0], [0])

    def stored(self, pod: ReplayedPod, now_s: int, before_mib: int, after_mib: int) -> None:
        """The ledger now stores ``after_mib`` for the pod instead of ``before_mib``."""
        self.settle(pod, now_s, after_mib, pod.running)
        pod.peak_stored = max(pod.peak_stored, after_mib)
        self.reserved += after_mib - before_mib
        namespace = pod.counted.namespace
        used = self.namespace_used.get(namespace, 0) + after_mib - before_mib
        self.namespace_used[namespace] = used
        self.namespace_peak[namespace] = max(self.namespace_peak.get(namespace, 0), used)

    def running(self, pod: ReplayedPod, running_mib: int, now_s: int) -> None:
        """The pod's running containers now request ``running_mib``."""
        self.requested += running_mib - pod.running
        self.settle(pod, now_s, pod.stored, running_mib)

    def settle(self, pod: ReplayedPod, now_s: int, stored_mib: int, running_mib: int) -> None:
        """Closes the pod's stretch at its old figures, then takes the new ones (also into
        the cluster's idle and beyond-reservation totals)."""
        pod.advance(now_s)
        gap = pod.stored - pod.running
        if gap > 0:
            self.idle -= gap
        else:
            self.unreserved += gap
        pod.stored = stored_mib
        pod.running = running_mib
        gap = stored_mib - running_mib
        if gap > 0:
            self.idle += gap
        else:
            self.unreserved -= gap

    def mark(self, now_s: int) -> None:
        """Adds a point to the curves when a total changed at ``now_s``."""
        point = (self.reserved, self.requested, self.idle, self.unreserved)
        curves = self.curves
        if point == tuple(curve[-1] for curve in curves):
            return
        if self.times[-1] == now_s:
            for curve, value in zip(curves, point, strict=True):
                curve[-1] = value
            return
        self.times.append(now_s)
        for curve, value in zip(curves, point, strict=True):
            curve.append(value)


def peak_and_mean(times: list[int], values: list[int], window_s: int) -> tuple[int, int]:
    """Peak and time-weighted mean (MiB, rounded down) of a step curve over [0, window_s]."""
    peak = max(values) if values else 0
    if window_s <= 0:
        return peak, values[-1] if values else 0
    area = 0
    for i, (start, value) in enumerate(zip(times, values, strict=True)):
        end = times[i + 1] if i + 1 < len(times) else window_s
        area += value * (min(end, window_s) - start)
    return peak, area // window_s
