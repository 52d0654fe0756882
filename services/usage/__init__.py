"""The usage recorder daemon: the single owner of accounting state.

Layer: services/usage. ``store`` (ledger + journal behind one lock), ``journal`` (SQLite),
``servicer`` and ``convert`` (the gRPC adapter), ``k8s`` and ``leader`` (the Kubernetes source
and leader election), ``__main__`` (config -> server).
"""
