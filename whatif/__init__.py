"""What-if: replays a workload on a node pool under each accounting rule and measures the cost.

Layer: the simulator, beside accounting/ and services/: it imports accounting (and the standard
library) only, the what-if command in services/cli imports it, and accounting imports nothing
of it. The replay calls the same quota check, fit, ledger and lifecycle the daemons call; only
the rule of accounting.counting_rules changes.

Modules, from the input down:

* workload: the pods with their timing, the nodes, the quotas;
* kube_input: a workload from Kubernetes objects as decoded JSON; generate: a seeded synthetic
  workload, as Kubernetes objects;
* settings: what the scheduler and the report are configured with; results: every figure of
  one rule's replay;
* replay: the event-driven replay (arrival, scheduling, the pods' lives), over
  node_pool (the cluster's nodes in the scheduler's order, and which changed when),
  shapes (waiting pods grouped by what the fit depends on), pod_life (one pod's state and
  what its running containers request) and memory_totals (the cluster's figures over time).
"""
