"""The bounds of every value the accounting receives: sizes of repeated fields, lengths of
names and ids, the largest numbers, each the most a real cluster needs and small enough that
the sums the rules form stay inside the wire's integer fields.

Layer: accounting (pure). The readers (``accounting.kube``, ``accounting.hami_codec``), the
checks (``accounting.validate``) and the adapters refuse what lies beyond them; the store and
the ledger bound their totals with them.
"""

from __future__ import annotations

INT32_MAX = 2_147_483_647
INT32_MIN = -2_147_483_648

MAX_CONTAINERS = 256
"""Containers per pod (init, sidecar and app together); Kubernetes pods have a handful."""
MAX_GRANTS_PER_CONTAINER = 64
"""Devices granted to one container; more than any node has."""
MAX_REQUESTS_PER_CONTAINER = 16
"""Vendor requests of one container."""
MAX_STATUSES = MAX_CONTAINERS
"""Entries of initContainerStatuses or containerStatuses."""
MAX_DEVICES_PER_NODE = 256
"""Devices in one node inventory."""
MAX_DEVICES_PER_CONTAINER = MAX_DEVICES_PER_NODE
"""Devices one container may ask for: more than a node may register could never be placed."""
MAX_GRANT_SLOTS = 65_536
"""Sharing slots one grant may stand for (HAMi's deviceSplitCount is 10 by default)."""
MAX_MEMORY_FACTOR = 65_536
"""The largest memory factor (HAMi's memoryFactor; 1024 makes gpumem count GiB)."""
MAX_QUOTA_LIMIT = 10**12
"""The largest namespace limit of any resource (MiB, percent or devices): more than a cluster
has, and small enough that limit × memory factor stays well inside int64.

Why these maxima keep every number on the wire inside its int64 or int32 field: a pod has at
most 256 containers, each at most 256 devices of at most 2^31 − 1 MiB, so its effective memory
request times the largest memory factor is below 2^63; a limit times that factor is below 2^57;
one pod's usage on one device (at most 256 × 64 grants) stays below 2^45 MiB, 2^22 percent and
2^30 slots. Only totals over many pods (a node's or a namespace's used amounts) are unbounded
in principle; they are reported saturated at the field's maximum, which no real cluster
reaches."""
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
MAX_DEVICE_ID_CHARS = 320
"""The longest device id (UUID) read from a request or an annotation. The ids HAMi writes are
far shorter (an NVIDIA UUID has 40 characters); the longest an id made from a node's name can
get is 276 (a 253-character name, ``-enflame-drs-`` and a 10-digit index). Every id is stored
and sent in every watch event of its node, so a longer one only costs every reader."""
MAX_NODE_NAME_CHARS = 253
"""A Kubernetes node name is a DNS subdomain: at most 253 characters."""
MAX_NAMESPACE_CHARS = 63
"""A Kubernetes namespace is a DNS label: at most 63 characters. Every namespace is stored, kept
with its limits and sent in every watch event of its usage, so a longer one only costs every
reader."""
MAX_POD_NAME_CHARS = 253
"""A pod's name is a DNS subdomain: at most 253 characters."""
MAX_POD_UID_CHARS = MAX_NODE_NAME_CHARS
"""A pod's uid: Kubernetes writes a 36-character UUID; callers that make their own (tests,
HAMi's Go components replaying a pod) get as much room as a name."""
MAX_MIG_SLICES = 8
"""Memory slices of a MIG-mode card: NVIDIA's cards have at most eight (A100, H100; A30 has
four), and NVML's possible placements, which the device plugin registers, lie inside them."""
MAX_ANNOTATIONS_BYTES = 256 * 1024
"""Kubernetes' own limit on the total size of a pod's annotations (keys plus values)."""
