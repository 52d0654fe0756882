"""The version of this build, as ``hami-accounting --version`` reports it.

Layer: services (common). It is pyproject.toml's version (a test holds the two, the chart and
the manifests' image tags together); the releases before it are in releases.toml.
"""

from __future__ import annotations

VERSION = "0.4.0"
