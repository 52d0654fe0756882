"""How each vendor's devices are asked for: resource names, defaults and memory factor.

Layer: accounting (pure, standard library only). A vendor's entry is part of the
accounting policy (``accounting.policy``): the usage recorder's configuration, which every
daemon answers under. NVIDIA is HAMi's default and the one the fit models; the other vendors
HAMi supports take their entries here.
"""

from __future__ import annotations

from dataclasses import dataclass

NVIDIA = "NVIDIA"
"""Vendor keyword HAMi writes into hami.io/vgpu-devices-allocated for NVIDIA devices."""


@dataclass(frozen=True, slots=True)
class VendorResources:
    """How one vendor's requests are named and sized (HAMi's ResourceNames plus defaults)."""

    vendor: str = NVIDIA
    count_resource: str = "nvidia.com/gpu"
    memory_resource: str = "nvidia.com/gpumem"
    memory_percentage_resource: str = "nvidia.com/gpumem-percentage"
    core_resource: str = "nvidia.com/gpucores"
    memory_factor: int = 1
    """Memory requests are multiplied by this (HAMi's memoryFactor; chart default 1)."""
    default_memory_mib: int = 0
    """Memory given to a container that asks for neither MiB nor a percentage (0: whole card)."""
    default_core_percent: int = 0
    default_gpu_count: int = 1



NVIDIA_RESOURCES = VendorResources()
