"""The readers of Kubernetes JSON: a Pod (``pod_json``, each container's device requests read
by ``device_requests``), a Node's registered devices (``node_json``), and the quantities both
are written in (``quantity``). Pure: plain decoded JSON in, accounting values out.
"""
