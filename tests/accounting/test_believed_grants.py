"""What the recorder believes a pod holds (accounting.believed_grants): the forged-allocation
attacks of docs/security.md as cases, and as properties: the believed grants are never below
what the annotations grant, never below the request where the grant is the request, and an
honest pod is taken exactly as sent."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accounting.believed_grants import believe, floors_grants
from accounting.lifecycle import StoredPod
from accounting.mig import MIG_MODE
from accounting.model import (
    Device,
    DeviceGrant,
    DeviceUsage,
    MigInstance,
    MigPlacement,
    MigProfile,
    Pod,
)
from accounting.policy import DEFAULT_POLICY
from accounting.vendor_spec import VendorSpec
from accounting.vendors import VENDORS, find
from tests.builders import PodBuilder, device, gpu, req

SPECS = DEFAULT_POLICY.specs
NODE = (device("g0"), device("g1", index=1))
"""Two 24,576 MiB cards."""


@dataclass(frozen=True)
class Case:
    id: str
    pod: Pod
    expected: tuple[tuple[DeviceGrant, ...], ...]
    """The believed grants per container position."""
    distrusted: bool
    devices: tuple[Device, ...] | None = NODE
    stored: StoredPod | None = None
    node: str = "node-a"
    specs: tuple[VendorSpec, ...] = field(default=SPECS)


def one(grant: DeviceGrant, request: object = None, *, name: str = "main") -> Pod:
    builder = PodBuilder("p", uid="u1", node="node-a")
    items = [grant] if request is None else [grant, request]
    return builder.app(name, *items).build()


_MIG = dataclasses.replace(
    device("m0"), mode=MIG_MODE, memory_total_mib=40960,
)
_INSTANCE = MigInstance("7g.40gb", MigPlacement(0, 8))
_A100 = dataclasses.replace(_MIG, mig_profiles=(
    MigProfile("1g.5gb", 5120, 14, 1, tuple(MigPlacement(s, 1) for s in range(7))),
    MigProfile("3g.20gb", 20480, 42, 4, (MigPlacement(0, 4), MigPlacement(4, 4))),
))
_HALF = MigInstance("3g.20gb", MigPlacement(4, 4))

_RESERVED = (
    (gpu("g0", mib=20000),),
)
_RESERVED_STORED = StoredPod(
    uid="u1",
    namespace="default",
    name="p",
    node_name="node-a",
    usage=(DeviceUsage("g0", "NVIDIA", 20000, 0, 1),),
    reserved_grants=_RESERVED,
)

CASES = (
    Case("honest: the grant is the request", one(gpu("g0", mib=20000), req(mib=20000)),
         ((gpu("g0", mib=20000),),), False),
    Case("forged 1 MiB for a 20,000 MiB request: charged the request",
         one(gpu("g0", mib=1), req(mib=20000)), ((gpu("g0", mib=20000),),), True),
    Case("forged 0 cores for 30 % asked", one(gpu("g0", mib=100, cores=0), req(mib=100, cores=30)),
         ((gpu("g0", mib=100, cores=30),),), True),
    Case("a grant above the request stays (a whole card is given whole)",
         one(gpu("g0", mib=24576, cores=100), req(mib=1)),
         ((gpu("g0", mib=24576, cores=100),),), False),
    Case("a share of a known card is sized on it",
         one(gpu("g0", mib=1), req(percent=50)), ((gpu("g0", mib=12288),),), True),
    Case("a share of an unknown card: only the cores can be floored",
         one(gpu("g9", mib=1, cores=0), req(percent=50, cores=20)),
         ((gpu("g9", mib=1, cores=20),),), True, devices=None),
    Case("a grant without a request stays as it is", one(gpu("g0", mib=1)),
         ((gpu("g0", mib=1),),), False),
    Case("a MIG instance is what the device plugin creates: kept",
         one(dataclasses.replace(gpu("m0", mib=40960, cores=100), mig=_INSTANCE), req(mib=1)),
         ((dataclasses.replace(gpu("m0", mib=40960, cores=100), mig=_INSTANCE),),), False,
         devices=(_MIG,)),
    Case("a MIG instance forged at 1 MiB: charged its registered profile",
         one(dataclasses.replace(gpu("m0", mib=1, cores=0), mig=_HALF), req(mib=1)),
         ((dataclasses.replace(gpu("m0", mib=20480, cores=42), mig=_HALF),),), True,
         devices=(_A100,)),
    Case("a forged MIG instance in a container that asks nothing: charged its profile too",
         one(dataclasses.replace(gpu("m0", mib=1, cores=0), mig=_HALF)),
         ((dataclasses.replace(gpu("m0", mib=20480, cores=42), mig=_HALF),),), True,
         devices=(_A100,)),
    Case("an honest MIG grant (its profile's figures) is taken as sent",
         one(dataclasses.replace(gpu("m0", mib=20480, cores=42), mig=_HALF), req(mib=8000)),
         ((dataclasses.replace(gpu("m0", mib=20480, cores=42), mig=_HALF),),), False,
         devices=(_A100,)),
    Case("a grant on a MIG card without its instance: kept (the ledger closes the card)",
         one(gpu("m0", mib=1), req(mib=5000)), ((gpu("m0", mib=1),),), False,
         devices=(_MIG,)),
    Case("a vendor with rules of its own keeps its grant (Ascend templates)",
         one(gpu("n0", mib=1, vendor="Ascend910B3"), req(mib=20000, vendor="Ascend910B3")),
         ((gpu("n0", mib=1, vendor="Ascend910B3"),),), False,
         specs=tuple(s for s in VENDORS if s.vendor == "Ascend910B3")),
    Case("reserved: the annotation patched down keeps the reservation",
         one(gpu("g0", mib=1), req(mib=20000)), _RESERVED, True, stored=_RESERVED_STORED),
    Case("reserved: the annotation moved to another card keeps the reservation",
         one(gpu("g1", mib=20000), req(mib=20000)), _RESERVED, True, stored=_RESERVED_STORED),
    Case("reserved: the annotation grown keeps the reservation too",
         one(gpu("g0", mib=24576, cores=100), req(mib=20000)), _RESERVED, True,
         stored=_RESERVED_STORED),
    Case("reserved: an honest annotation is taken as it is",
         one(gpu("g0", mib=20000), req(mib=20000)), _RESERVED, False, stored=_RESERVED_STORED),
    Case("reserved: no annotation yet (before the extender patched it)",
         one(req(mib=20000)), _RESERVED, False, stored=_RESERVED_STORED),
    Case("recorded from annotations before: the request still floors the next update",
         one(gpu("g0", mib=1), req(mib=20000)), ((gpu("g0", mib=20000),),), True,
         stored=dataclasses.replace(_RESERVED_STORED, reserved_grants=None)),
)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_what_the_recorder_believes(case: Case) -> None:
    belief = believe(case.pod, case.stored, case.devices, case.specs)

    assert tuple(c.grants for c in belief.pod.containers) == case.expected
    assert bool(belief.distrusted) is case.distrusted
    if not case.distrusted and case.stored is None:
        assert belief.pod is case.pod  # taken exactly as sent
    assert belief.pod.node_name == (case.stored.node_name if case.stored else case.node)


def test_a_reservation_keeps_its_node_whatever_the_pod_names() -> None:
    pod = dataclasses.replace(one(gpu("g0", mib=20000), req(mib=20000)), node_name="node-b")

    belief = believe(pod, _RESERVED_STORED, NODE, SPECS)

    assert belief.pod.node_name == "node-a"
    assert any("node node-b" in sentence for sentence in belief.distrusted)


def test_the_vendors_whose_grant_is_the_request() -> None:
    floored = {spec.vendor for spec in VENDORS if floors_grants(spec)}

    assert floored == {"NVIDIA", "DCU", "MLU", "MR-V100", "MR-V50", "BI-V150", "BI-V100",
                       "Metax-GPU", "GCU"}
    for keyword in ("Mthreads", "AMD", "AWSNeuron", "Enflame", "kunlun", "XPU", "Vastai"):
        spec = find(keyword)
        assert spec is not None and not floors_grants(spec), keyword


_MIB = st.integers(0, 24576)
_CORES = st.integers(0, 100)


@given(
    st.lists(st.tuples(_MIB, _CORES, _MIB, _CORES, st.sampled_from(("g0", "g1"))),
             min_size=1, max_size=6),
    st.booleans(),
)
def test_belief_never_lowers_a_grant_and_never_goes_below_the_request(
    containers: list[tuple[int, int, int, int, str]], honest: bool
) -> None:
    builder = PodBuilder("p", uid="u1", node="node-a")
    for index, (granted, granted_cores, asked, asked_cores, uuid) in enumerate(containers):
        if honest:
            granted, granted_cores = asked, asked_cores
        builder.app(f"c{index}", gpu(uuid, mib=granted, cores=granted_cores),
                    req(mib=asked, cores=asked_cores) if asked else req(cores=asked_cores,
                                                                        percent=100))
    pod = builder.build()

    belief = believe(pod, None, NODE, SPECS)

    for sent, believed, (_, _, asked, asked_cores, _) in zip(
        pod.containers, belief.pod.containers, containers, strict=True
    ):
        (before,), (after,) = sent.grants, believed.grants
        assert after.uuid == before.uuid
        assert after.memory_mib >= before.memory_mib
        assert after.core_percent >= before.core_percent
        assert after.memory_mib >= (asked or 24576)
        assert after.core_percent >= asked_cores
    if honest and all(asked for _, _, asked, _, _ in containers):
        assert belief.pod is pod and belief.distrusted == ()
