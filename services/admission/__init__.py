"""The admission daemon: is a pod within its namespace's GPU quota?

Layer: services/admission. Stateless; usage and limits are read from the usage recorder.
``servicer`` (gRPC ``Admission.CheckQuota`` and the check both front ends share), ``convert``
(protobuf <-> domain), ``usage_source`` (reads from the recorder, optionally cached from its
watch stream), ``webhook`` (the same check as a Kubernetes AdmissionReview HTTPS endpoint),
``config`` and ``__main__`` (config -> server).
"""
