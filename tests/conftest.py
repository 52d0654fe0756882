"""Settings for every test.

Hypothesis runs without its per-example deadline (200 ms by default). A deadline is a timing
assertion, and timing goals live in bench/: on the shared 2-core machines an example that takes
30 ms alone can take over 200 ms under load, and the test then fails although its property holds
(test_hami_codec.py's round trip did, about one run in several under load). For the same reason
the health check that times data generation (``too_slow``) is off. Everything else (examples,
the other health checks, shrinking) stays Hypothesis' default or the test's own ``@settings``.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile(
    "hami-accounting", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("hami-accounting")
