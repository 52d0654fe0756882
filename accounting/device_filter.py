"""The pod annotations that narrow which of a vendor's devices the pod may use.

Layer: accounting (pure). Each vendor names its own keys (``VendorSpec.selection``): NVIDIA's
``nvidia.com/use-gputype`` / ``nouse-gputype`` (models, a substring in any case),
``nvidia.com/use-gpuuuid`` / ``nouse-gpuuuid`` (device ids, exact) and ``nvidia.com/vgpu-mode``
(the card's sharing mode must be a substring of the value), Hygon's ``hygon.com/use-dcutype``,
Ascend's ``hami.io/use-<chip>-uuid`` and so on. HAMi's ``CheckType`` / ``CheckUUID`` semantics:
a blank value constrains nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from accounting.vendor_spec import Selection


@dataclass(frozen=True, slots=True)
class DeviceFilter:
    """One vendor's device-selection annotations of one pod, parsed once per pod."""

    use_types: tuple[str, ...]
    nouse_types: tuple[str, ...]
    use_uuids: tuple[frozenset[str], ...]
    """Each non-empty ``use`` list: a device must be in every one of them."""
    nouse_uuids: frozenset[str]
    mode: str | None

    @classmethod
    def from_annotations(
        cls, annotations: Mapping[str, str], selection: Selection
    ) -> DeviceFilter | None:
        """The filter, or None when the pod sets none of the vendor's keys (the usual case)."""
        if not annotations or not any(key in annotations for key in selection.annotation_keys()):
            return None
        use_types = _lowered_list(annotations.get(selection.use_type)) if selection.use_type else ()
        nouse_types = (
            _lowered_list(annotations.get(selection.nouse_type)) if selection.nouse_type else ()
        )
        use_uuids = tuple(
            frozenset(listed)
            for key in (selection.use_uuid, selection.extra_use_uuid)
            if key and (listed := _trimmed_list(annotations.get(key)))
        )
        nouse_uuids = frozenset(
            uuid
            for key in (selection.nouse_uuid, selection.extra_nouse_uuid)
            if key
            for uuid in _trimmed_list(annotations.get(key))
        )
        mode = annotations.get(selection.mode) if selection.mode else None
        if mode is not None and not mode.strip():
            mode = None
        if not (use_types or nouse_types or use_uuids or nouse_uuids or mode):
            return None
        return cls(use_types, nouse_types, use_uuids, nouse_uuids, mode)

    def type_refused(self, model: str, mode: str) -> bool:
        """Whether the model or the sharing mode of a device rules it out."""
        lowered = model.lower()
        if self.use_types and not any(t in lowered for t in self.use_types):
            return True
        if any(t in lowered for t in self.nouse_types):
            return True
        return self.mode is not None and mode not in self.mode

    def uuid_refused(self, uuid: str) -> bool:
        """Whether the device id rules it out."""
        if any(uuid not in listed for listed in self.use_uuids):
            return True
        return uuid in self.nouse_uuids


def _trimmed_list(value: str | None) -> list[str]:
    # Empty entries ("a,,b" or a trailing comma) constrain nothing; HAMi would match an empty
    # substring against every card, which no user means.
    if value is None:
        return []
    return [entry.strip() for entry in value.split(",") if entry.strip()]


def _lowered_list(value: str | None) -> tuple[str, ...]:
    return tuple(entry.lower() for entry in _trimmed_list(value))
