"""CheckQuota and Filter refuse a pod holding text UTF-8 cannot carry, naming the field.

The pods of ``tests/usage/test_unencodable_text.py`` (a lone surrogate in a MIG profile name, the
pod's or a container's name, an annotation), sent to the admission and scheduler daemons: each
answers INVALID_ARGUMENT naming the string's field, never INTERNAL, and the recorder behind
them still reads every node.
"""

from __future__ import annotations

import pytest

from hami.accounting.v1 import (
    admission_pb2,
    admission_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    usage_pb2,
)
from tests.services import test_every_vendor_grpc as every_vendor
from tests.services.test_every_vendor_grpc import TIMEOUT_S, Stack
from tests.support.pods import to_json
from tests.usage.test_unencodable_text import POD_CASES, Case, mig_node, refused_field

stack = every_vendor.stack
"""The every-vendor test's daemons (module-scoped: one recorder, admission and scheduler)."""


@pytest.mark.parametrize("case", POD_CASES, ids=lambda c: c.what)
def test_check_quota_and_filter_refuse_the_pod_naming_the_field(stack: Stack, case: Case) -> None:
    stack.recorder.RegisterNode(
        usage_pb2.RegisterNodeRequest(kubernetes_node_json=to_json(mig_node())),
        timeout=TIMEOUT_S,
    )
    raw = to_json(case.body())
    admission = admission_pb2_grpc.AdmissionStub(stack.admission)
    scheduler = scheduler_pb2_grpc.SchedulerStub(stack.scheduler)
    assert refused_field(
        admission.CheckQuota, admission_pb2.CheckQuotaRequest(kubernetes_pod_json=raw)
    ) == case.field
    assert refused_field(
        scheduler.Filter,
        scheduler_pb2.FilterRequest(kubernetes_pod_json=raw, node_names=["mig-node"]),
    ) == case.field
    nodes = stack.recorder.GetNodeUsage(usage_pb2.GetNodeUsageRequest(), timeout=TIMEOUT_S)
    assert "mig-node" in {n.node_name for n in nodes.nodes}
