"""The ledger's records: what is stored for each pod, and which pods are stored on each node.

Layer: accounting (pure; a part of ``accounting.ledger.ledger.Ledger``, which alone changes it,
and of the one-pass load in ``accounting.ledger.bulk_load``).
"""

from __future__ import annotations

import bisect

from accounting.lifecycle import StoredPod


class PodRecords:
    """uid -> the stored pod, and node -> the uids stored there, sorted."""

    __slots__ = ("by_node", "by_uid")

    def __init__(self) -> None:
        self.by_uid: dict[str, StoredPod] = {}
        # node -> uids of the pods stored there, sorted. A list per node rather than a set: a
        # set of 8 uids takes 728 bytes, the list 120, and GetNodeUsage wants them sorted.
        self.by_node: dict[str, list[str]] = {}

    def index(self, stored: StoredPod) -> None:
        """Lists the pod under its node."""
        uids = self.by_node.get(stored.node_name)
        if uids is None:
            self.by_node[stored.node_name] = [stored.uid]
        else:
            bisect.insort(uids, stored.uid)

    def unindex(self, stored: StoredPod) -> None:
        """Takes the pod off its node's list (it is there)."""
        uids = self.by_node[stored.node_name]
        del uids[bisect.bisect_left(uids, stored.uid)]
        if not uids:
            del self.by_node[stored.node_name]

    def remove_everywhere(self, uid: str) -> None:
        """Forgets the uid and takes it off every node's list it is on, whatever state a
        failed change left them in (slow: it walks every node)."""
        self.by_uid.pop(uid, None)
        for node_name, uids in list(self.by_node.items()):
            if uid in uids:
                uids.remove(uid)
                if not uids:
                    del self.by_node[node_name]
