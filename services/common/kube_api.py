"""The Kubernetes API client of a daemon: which configuration it reads, and the client built
from it.

Layer: services/common (runtime). The recorder's Kubernetes source and the scheduler's extender
(which patches the pods it places) read the same two settings, ``HAMI_ACCOUNTING_KUBERNETES``
(``off``, ``in-cluster``: the pod's service account, or ``kubeconfig``) and
``HAMI_ACCOUNTING_KUBECONFIG`` (else the first file of ``KUBECONFIG``). The ``kubernetes``
package is imported only by ``api_client_from_mode``: it is slow to import, and a daemon that
talks to no API server never pays for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from services.common.config import env_choice, env_path

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

KUBERNETES_OFF = "off"
KUBERNETES_MODES = (KUBERNETES_OFF, "in-cluster", "kubeconfig")


@dataclass(frozen=True, slots=True)
class KubernetesAccess:
    """How a daemon reaches the Kubernetes API (or that it does not)."""

    mode: str = KUBERNETES_OFF
    """``off``, ``in-cluster`` or ``kubeconfig`` (HAMI_ACCOUNTING_KUBERNETES)."""
    kubeconfig: Path | None = None
    """Kubeconfig file for ``kubeconfig`` mode (HAMI_ACCOUNTING_KUBECONFIG, else KUBECONFIG)."""

    @property
    def enabled(self) -> bool:
        return self.mode != KUBERNETES_OFF

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, problems: list[str]) -> KubernetesAccess:
        """Reads the two settings; each problem is appended to ``problems``."""
        mode = env_choice(env, "KUBERNETES", KUBERNETES_MODES, KUBERNETES_OFF, problems=problems)
        kubeconfig = env_path(env, "KUBECONFIG", problems=problems)
        if kubeconfig is None and env.get("KUBECONFIG", "").strip():
            # Only the first file of a KUBECONFIG list: the client reads one file.
            kubeconfig = Path(env["KUBECONFIG"].strip().split(":")[0])
        return cls(mode=mode, kubeconfig=kubeconfig)

    def api_client(self) -> ApiClient | None:
        """The client (None when ``off``).

        Raises:
            KubernetesConfigError: the configuration could not be loaded.
        """
        return api_client_from_mode(self.mode, str(self.kubeconfig) if self.kubeconfig else None)


NO_KUBERNETES = KubernetesAccess()


class KubernetesConfigError(Exception):
    """No usable Kubernetes client configuration (in-cluster or kubeconfig)."""


def api_client_from_mode(mode: str, kubeconfig: str | None) -> ApiClient | None:
    """Builds the API client for a configured source mode.

    Args:
        mode: ``off`` (no Kubernetes source), ``in-cluster`` (the pod's service account) or
            ``kubeconfig`` (the file at ``kubeconfig``; None means ``$KUBECONFIG`` or
            ``~/.kube/config``).
        kubeconfig: path of the kubeconfig file, used with ``mode="kubeconfig"``.

    Raises:
        ValueError: an unknown mode.
        KubernetesConfigError: the configuration could not be loaded.
    """
    if mode == KUBERNETES_OFF:
        return None
    # Imported here: the client is slow to import (see the module docstring).
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        # The client's config module is unannotated.
        if mode == "in-cluster":
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        elif mode == "kubeconfig":
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=configuration
            )
        else:
            raise ValueError(f"unknown Kubernetes mode {mode!r}: use off, in-cluster or kubeconfig")
    except config.ConfigException as error:
        raise KubernetesConfigError(
            f"cannot load the {mode} Kubernetes configuration: {error}"
        ) from error
    return client.ApiClient(configuration)
