"""The accounting rules a platform team can compare: how a pod's containers are counted.

Layer: accounting (pure). Every rule runs through the same formulas, fit, quota check, ledger
and lifecycle; a rule only changes two things:

* **the container-class rule**: which class each container is counted as. The classes drive
  every formula (accounting.pod), so re-classifying a pod's containers is all it takes to count
  it as an older scheduler did;
* **the release rule**: whether the regular init containers' share is released one by one as
  each finishes (progressive release) or all at once when the last one has (the shrink).

The four rules, oldest first:

* ``SUMMED``: every container is counted as an app, so every container's usage adds up for the
  pod's whole life (HAMi before its init-container support);
* ``HAMI_V2_10``: every entry of spec.initContainers is a regular init container, sidecars
  included (HAMi v2.10, before sidecar support): a sidecar is counted in the init peak, not
  beside the apps, and while it runs the shrink never happens;
* ``SHRINK``: the classes as Kubernetes runs them (sidecars apart), ordering-aware, released
  when every regular init container has exited 0;
* ``PROGRESSIVE``: the same, with each regular init container's share released as it exits 0
  (what the usage recorder does).
"""

from __future__ import annotations

import enum
from dataclasses import replace

from accounting.model import Container, ContainerClass, Pod


class CountingRule(enum.Enum):
    """One accounting rule: a container-class rule and a release rule."""

    SUMMED = "summed"
    HAMI_V2_10 = "hami-v2.10"
    SHRINK = "shrink"
    PROGRESSIVE = "progressive"

    @property
    def title(self) -> str:
        """A short human name, for tables and charts."""
        return _TITLES[self]

    @property
    def description(self) -> str:
        """One sentence on what the rule does and who applies it."""
        return _DESCRIPTIONS[self]

    @property
    def progressive_release(self) -> bool:
        """True: each regular init container's share is released as soon as it exits 0."""
        return self is CountingRule.PROGRESSIVE

    def counted_class(self, declared: ContainerClass) -> ContainerClass:
        """The class a container declared as ``declared`` is counted as under this rule."""
        return _COUNTED[self][declared]


_INIT, _SIDECAR, _APP = ContainerClass.INIT, ContainerClass.SIDECAR, ContainerClass.APP
_COUNTED: dict[CountingRule, dict[ContainerClass, ContainerClass]] = {
    CountingRule.SUMMED: {_INIT: _APP, _SIDECAR: _APP, _APP: _APP},
    CountingRule.HAMI_V2_10: {_INIT: _INIT, _SIDECAR: _INIT, _APP: _APP},
    CountingRule.SHRINK: {_INIT: _INIT, _SIDECAR: _SIDECAR, _APP: _APP},
    CountingRule.PROGRESSIVE: {_INIT: _INIT, _SIDECAR: _SIDECAR, _APP: _APP},
}
"""Declared class -> counted class, per rule (a table: this runs for every container of
every pod a what-if replays)."""


_DESCRIPTIONS = {
    CountingRule.SUMMED: "every container's usage added up for the pod's whole life "
    "(HAMi before its init-container support)",
    CountingRule.HAMI_V2_10: "sidecars counted as init containers, so they sit in the init "
    "peak and, while they run, keep the pod from shrinking (HAMi v2.10)",
    CountingRule.SHRINK: "ordering-aware: sidecars beside the apps, each init container beside "
    "the sidecars before it; shrunk when the last init container exits 0",
    CountingRule.PROGRESSIVE: "ordering-aware, and each init container's share released as it "
    "exits 0 (what the usage recorder does)",
}

_TITLES = {
    CountingRule.SUMMED: "every container summed",
    CountingRule.HAMI_V2_10: "HAMi v2.10 (sidecars as init)",
    CountingRule.SHRINK: "ordering-aware, shrink",
    CountingRule.PROGRESSIVE: "ordering-aware, progressive release",
}


def counted_containers(
    containers: tuple[Container, ...], rule: CountingRule
) -> tuple[Container, ...]:
    """The containers re-classified by ``rule`` (the same objects where nothing changes)."""
    counted = _COUNTED[rule]
    return tuple(
        c
        if (as_counted := counted[c.container_class]) is c.container_class
        else replace(c, container_class=as_counted)
        for c in containers
    )


def counted_pod(pod: Pod, rule: CountingRule) -> Pod:
    """The pod as ``rule`` counts it: the same pod with its containers re-classified.

    Statuses are matched to containers by name, so they need no change: a sidecar counted as a
    regular init container keeps reporting Running, which is exactly why HAMi v2.10 never
    shrinks a pod with a sidecar.
    """
    containers = counted_containers(pod.containers, rule)
    if all(new is old for new, old in zip(containers, pod.containers, strict=True)):
        return pod
    return replace(pod, containers=containers)
