"""hami-accounting's pure rules: GPU accounting for pods with init containers and sidecars.

Layer: accounting (pure, standard library only). Every rule of docs/design.md §2
lives here exactly once; the three daemons call it through thin adapters.

Modules: model (domain values), errors, pod (the ordering-aware formula), lifecycle (what is
stored next), quota (the namespace check), ledger (stored usage and totals by deltas), fit (the
scheduler's per-GPU fit), hami_codec (HAMi's annotation wire formats), kube_pod and kube_node
(Kubernetes JSON parsers), validate (input checks).
"""
