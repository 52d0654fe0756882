"""The accounting policy between hami.accounting.v1 and accounting.policy: published as the
recorder holds it, read back and checked against its ``policy_id`` like any input.

Layer: services (adapter).
"""

from __future__ import annotations

from accounting.errors import InvalidInputError, Violations
from accounting.policy import AccountingPolicy
from accounting.vendors import VendorResources
from hami.accounting.v1 import types_pb2
from services.common.convert.wire_fields import from_wire, same_names, to_wire

_VENDOR_POLICY_FIELDS = same_names(
    "vendor",
    "count_resource",
    "memory_resource",
    "memory_percentage_resource",
    "core_resource",
    "memory_factor",
    "default_memory_mib",
    "default_core_percent",
    "default_gpu_count",
)


def policy_to_pb(policy: AccountingPolicy) -> types_pb2.AccountingPolicy:
    return types_pb2.AccountingPolicy(
        policy_id=policy.policy_id,
        vendors=[
            types_pb2.VendorPolicy(**to_wire(v, _VENDOR_POLICY_FIELDS))
            for v in policy.vendors
        ],
        enforce_gpu_count=policy.enforce_gpu_count,
    )


def policy_from_pb(pb: types_pb2.AccountingPolicy, path: str = "policy") -> AccountingPolicy:
    """The recorder's policy as it published it, checked like any input.

    Raises:
        InvalidInputError: a policy the rules cannot run under (no vendor, a factor out of
            range...), or one whose content does not match its ``policy_id``.
    """
    try:
        policy = AccountingPolicy(
            tuple(
                VendorResources(**from_wire(v, _VENDOR_POLICY_FIELDS))
                for v in pb.vendors
            ),
            enforce_gpu_count=pb.enforce_gpu_count,
        )
    except InvalidInputError as error:
        found = Violations()
        found.extend(error, f"{path}.")
        found.raise_if_any()
        raise
    if pb.policy_id and pb.policy_id != policy.policy_id:
        raise InvalidInputError.single(
            f"{path}.policy_id",
            f"{pb.policy_id} does not match the policy's content ({policy.policy_id})",
        )
    return policy
