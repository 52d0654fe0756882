"""A namespace's quota items between hami.accounting.v1 and accounting.model, the used total
saturated on the wire.

Layer: services (adapter).
"""

from __future__ import annotations

from accounting.model import QuotaItem
from hami.accounting.v1 import types_pb2
from services.common.convert.wire_fields import from_wire, same_names, saturated, to_wire

_QUOTA_ITEM_FIELDS = same_names("resource", "used", "limit", "limit_set")


def quota_item_to_pb(item: QuotaItem) -> types_pb2.QuotaItem:
    fields = to_wire(item, _QUOTA_ITEM_FIELDS)
    fields["used"] = saturated(item.used)
    return types_pb2.QuotaItem(**fields)


def quota_item_from_pb(pb: types_pb2.QuotaItem) -> QuotaItem:
    return QuotaItem(**from_wire(pb, _QUOTA_ITEM_FIELDS))
