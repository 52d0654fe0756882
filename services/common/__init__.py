"""Shared runtime of the three daemons: config, server bootstrap, telemetry, errors, metrics.

Layer: services (runtime). No business rules live here; the daemons import these modules by name
(``from services.common import server``) so each concern has exactly one implementation.
"""
