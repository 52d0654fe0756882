"""hami-accounting's pure rules: GPU accounting for pods with init containers and sidecars.

Layer: accounting (pure, standard library only). Every rule of docs/design.md §2 lives here
exactly once; the three daemons call it through thin adapters.

Modules: amount (the one amount type) and fold (the one walk over a pod's containers); model
(domain values), vendors and policy (the accounting policy), annotations and reasons (every key
and reason code), errors; pod (classes, sizing, the formula's views), lifecycle (what is stored
next), quota (the namespace check), ledger (stored usage, totals by deltas, Reserve), fit (the
scheduler's per-GPU fit), explain (one pod's charge); hami_codec (HAMi's annotation wire
formats), kube (the readers of Kubernetes JSON: pods, their device requests, nodes,
quantities), received_json (decoding received JSON), validate (input checks), limits (their
bounds), quoting (how errors quote received values); counting_rules (the rules a what-if replay
compares; the replay itself is the whatif package, beside this one).
"""
