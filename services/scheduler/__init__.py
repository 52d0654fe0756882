"""The scheduler daemon: on which node, and on which physical GPUs, does a pod fit?

Layer: services/scheduler. Stateless; node usage and namespace quota come from the usage
recorder (node usage through a copy fed by its WatchUsage stream, by default), the fit is
``accounting.fit.fit_pod``, and a placement only counts once the recorder's ``Reserve`` has
stored it. ``servicer`` (gRPC ``Scheduler.Filter``), ``placer`` (one Filter: read, fit,
reserve), ``answers`` (what each ending of a Filter says), ``candidate_fit`` (the kernel or the
reference fit over the candidates), ``recorder_client`` (the calls to the recorder),
``node_cache`` (the WatchUsage-fed node states), ``convert`` (protobuf <-> domain, HAMi
annotations), ``config`` and ``__main__`` (config -> server).
"""
