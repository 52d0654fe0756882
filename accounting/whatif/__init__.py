"""What-if: replays a workload on a node pool under each accounting rule and measures the cost.

Layer: accounting (pure, standard library only). The replay calls the same quota check, fit,
ledger and lifecycle the daemons call; only the rule of accounting.counting_rules changes.

Modules: workload (the pods with their timing, the nodes, the quotas), kube_input (a workload
from Kubernetes objects as decoded JSON), generate (a seeded synthetic workload, as Kubernetes
objects), replay (the event-driven replay and its figures).
"""
