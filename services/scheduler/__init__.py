"""The scheduler daemon: on which node, and on which physical GPUs, does a pod fit?

Layer: services/scheduler. Stateless; node usage and namespace quota are read from the usage
recorder, the fit is ``accounting.fit.fit_pod``, and a placement only counts once the recorder's
``Reserve`` has stored it. ``servicer`` (gRPC ``Scheduler.Filter`` and the recorder client),
``convert`` (protobuf <-> domain, HAMi annotations), ``config`` and ``__main__`` (config ->
server).
"""
