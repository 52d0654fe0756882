"""Facts about the vendors' devices that more than one reader needs: the keys a registered
device's ``custom_info`` carries, the annotations a vendor's pods name, and the geometry of a
vendor's devices.

Layer: accounting (pure, standard library only). Data, no rules: the readers of Kubernetes JSON
(``accounting.kube``) write these keys and figures into accounting values, and the vendors' own
fit rules (``accounting.vendor_fit``) and the allocation annotations (``accounting.allocation``)
read them back, so each is defined once here. The vendor table itself is ``accounting.vendors``.
"""

from __future__ import annotations

import re

# -- NVIDIA ------------------------------------------------------------------------------------

PAIR_SCORES_INFO = "hami.io/node-nvidia-score"
"""The ``custom_info`` key of an NVIDIA card's pair scores with the node's other cards (the
form of ``accounting.pair_scores.encode_card_scores``). Set by the node reader from the node's
``hami.io/node-nvidia-score`` annotation, which it drops from anything a register wrote; the
``topology-aware`` GPU policy reads it."""

# -- Ascend ------------------------------------------------------------------------------------

ASCEND_TOPOLOGY_PREFIX = "Ascend910"
"""Ascend chips whose devices may carry a NetworkID (HAMi's ``Ascend910Prefix``)."""
NETWORK_ID_INFO = "NetworkID"
"""The ``custom_info`` key of an Ascend device's network group."""
ASCEND_SOFT_SPLIT_INFO = "hamiVnpuCore"
"""The ``custom_info`` key an Ascend device carries its node's hami-core support under
(``"true"`` or ``"false"``)."""
NPUS_PER_MODULE = 2
"""Ascend 910C: NPUs per physical module."""

# -- Vastai ------------------------------------------------------------------------------------

VASTAI_STRATEGY_INFO = "DeviceStrategy"
"""The ``custom_info`` key of a Vastai device's allocation strategy."""

# -- AWS Neuron --------------------------------------------------------------------------------

NEURON_CORES_PER_DEVICE = 2
"""NeuronCores per AWS Neuron device as HAMi's requests see them: the first node's count,
capped at 2 (HAMi's core masks have two bits); 2 on every current Neuron device."""
NEURON_BOTH_CORES = 0b11
"""The core mask of a Neuron device with both its NeuronCores taken."""
AWS_INSTANCE_TYPE_INFO = "AWSNodeType"
"""The ``custom_info`` key a Neuron device carries its node's instance type under."""

# -- Enflame DRS -------------------------------------------------------------------------------

DRS_PROFILES_INFO = "profiles"
"""The ``custom_info`` key of an Enflame DRS device's profiles (JSON: name -> profile id)."""
DRS_PROFILE_NAME = re.compile(r"([0-9]+)g\.([0-9]+)gb")
"""A DRS profile's name: its slices and its memory in GB (``<slices>g.<memory>gb``)."""

# -- Metax sGPU --------------------------------------------------------------------------------

METAX_APP_CLASS = "metax-tech.com/sgpu-app-class"
METAX_QOS_POLICY = "metax-tech.com/sgpu-qos-policy"
METAX_DEFAULT_QOS = "best-effort"
"""What HAMi's webhook writes when a pod names no QoS policy."""
