"""The leader's pod label: setting and clearing one label on the recorder's own pods, through
the official client, so that the recorder's Service sends traffic to the leader alone.

Layer: services/usage (adapter). Beside the Leases (services/usage/k8s_lease.py), whose errors
and connect timeout it shares; services/usage/leader_label.py decides when to call it.
"""

from __future__ import annotations

import urllib3.exceptions
from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from services.usage.k8s_lease import CONNECT_TIMEOUT_S, KubernetesApiError

LEADER_LABEL = "accounting.hami.io/leader"
"""The label the leading recorder's pod carries (value ``"true"``); the recorder's Service
selects it, so only the leader receives calls while every replica can report ready."""


class PodLabelClient:
    """Patches one label of pods in one namespace (a merge patch of ``metadata.labels``)."""

    def __init__(self, api_client: ApiClient, namespace: str, *,
                 request_timeout_s: float = 5.0) -> None:
        self._api = client.CoreV1Api(api_client)
        self._namespace = namespace
        self._request_timeout = (min(CONNECT_TIMEOUT_S, request_timeout_s), request_timeout_s)

    def set(self, pod: str, key: str, value: str | None) -> None:
        """Sets label ``key`` of pod ``pod`` to ``value``; None removes it.

        Raises:
            KubernetesApiError: the patch failed (404: no such pod; 403: RBAC).
        """
        body = {"metadata": {"labels": {key: value}}}
        try:
            self._api.patch_namespaced_pod(
                pod, self._namespace, body, _request_timeout=self._request_timeout
            )
        except ApiException as error:
            raise KubernetesApiError(int(error.status or 0),
                                     f"{error.status} {error.reason}") from error
        except urllib3.exceptions.HTTPError as error:
            raise KubernetesApiError(0, str(error)) from error

    def labelled(self, key: str, value: str) -> list[str]:
        """The names of the namespace's pods whose label ``key`` is ``value``.

        Raises:
            KubernetesApiError: the list failed.
        """
        try:
            pods = self._api.list_namespaced_pod(
                self._namespace, label_selector=f"{key}={value}",
                _request_timeout=self._request_timeout,
            )
        except ApiException as error:
            raise KubernetesApiError(int(error.status or 0),
                                     f"{error.status} {error.reason}") from error
        except urllib3.exceptions.HTTPError as error:
            raise KubernetesApiError(0, str(error)) from error
        return [str(pod.metadata.name) for pod in pods.items if pod.metadata is not None]
