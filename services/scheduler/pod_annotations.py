"""Writes a placement's annotations onto its pod through the Kubernetes API: what HAMi's Filter
patches before it answers kube-scheduler.

Layer: services/scheduler (adapter); the one module of the scheduler daemon that imports the
``kubernetes`` client. One JSON merge patch, as HAMi's ``PatchPodAnnotations`` (pkg/util) writes
it: ``metadata.annotations`` byte for byte as the Filter returned them and, when they name the
assigned node, the label ``hami.io/vgpu-node`` with the same value; and the pod's
``metadata.uid`` beside them: the uid is immutable, so the API server refuses the patch when the
name now belongs to another pod (deleted and created again meanwhile) instead of annotating the
wrong one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import urllib3.exceptions
from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from accounting.annotations import VGPU_NODE_ANNOTATION

CONNECT_TIMEOUT_S = 2.0
_MERGE_PATCH = "application/merge-patch+json"


class PatchError(Exception):
    """The patch was not applied; ``status`` is the API server's HTTP status (0: none came)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class PodAnnotationWriter:
    """Merge-patches pods' annotations with the daemon's Kubernetes client."""

    def __init__(self, api_client: ApiClient) -> None:
        self._api = client.CoreV1Api(api_client)

    def write(
        self,
        namespace: str,
        name: str,
        uid: str,
        annotations: Mapping[str, str],
        timeout_s: float,
    ) -> None:
        """Sets ``annotations`` on the pod ``namespace/name`` whose uid is ``uid``.

        Raises:
            PatchError: refused (404: no such pod; 403: RBAC; 409/422: the uid differs) or not
                answered within ``timeout_s``.
        """
        metadata: dict[str, object] = {"uid": uid, "annotations": dict(annotations)}
        node = annotations.get(VGPU_NODE_ANNOTATION, "")
        if node:
            metadata["labels"] = {VGPU_NODE_ANNOTATION: node}
        body = {"metadata": metadata}
        try:
            response: Any = self._api.patch_namespaced_pod(
                name,
                namespace,
                body,
                _content_type=_MERGE_PATCH,
                _request_timeout=(min(CONNECT_TIMEOUT_S, timeout_s), timeout_s),
                # The answer is the whole pod; only its status matters here, so the client's
                # model of it is never built.
                _preload_content=False,
            )
            response.release_conn()
        except ApiException as error:
            raise PatchError(int(error.status or 0), _api_message(error)) from error
        except urllib3.exceptions.HTTPError as error:
            raise PatchError(0, f"the Kubernetes API did not answer: {error}") from error


def _api_message(error: ApiException) -> str:
    """``<status> <reason>: <the Status message>`` from an API server refusal."""
    message = ""
    try:
        body = json.loads(error.body or b"{}")
        if isinstance(body, dict) and isinstance(body.get("message"), str):
            message = body["message"]
    except (TypeError, ValueError):
        pass
    head = f"{error.status} {error.reason}"
    return f"{head}: {message}" if message else head
