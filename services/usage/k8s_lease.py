"""The usage recorder's Leases: reading and writing the coordination.k8s.io/v1 Lease that
leader election holds (services/usage/leader.py), through the official client.

Layer: services/usage (adapter). The Kubernetes source (services/usage/k8s.py) shares the
connect timeout and hands these names on.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from typing import Any

import urllib3.exceptions
from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

CONNECT_TIMEOUT_S = 10.0
"""How long a request to the API server may take to connect."""


class KubernetesApiError(Exception):
    """A Kubernetes API call failed; ``status`` is the HTTP status, 0 for transport errors."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class LeaseConflictError(KubernetesApiError):
    """The Lease changed since it was read (409 on update) or already exists (409 on create)."""


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The parts of a coordination.k8s.io/v1 Lease that leader election reads and writes."""

    holder_identity: str
    """Empty when nobody holds the lease."""
    lease_duration_s: int
    acquire_time: datetime | None
    renew_time: datetime | None
    lease_transitions: int
    resource_version: str = ""
    """The version read; an update with it fails with a conflict if the Lease changed since."""


class LeaseClient:
    """Reads and writes Lease objects through the official client's CoordinationV1Api."""

    def __init__(self, api_client: ApiClient, *, request_timeout_s: float = 10.0) -> None:
        self._api = client.CoordinationV1Api(api_client)
        self._request_timeout = (min(CONNECT_TIMEOUT_S, request_timeout_s), request_timeout_s)

    def get(self, namespace: str, name: str) -> LeaseRecord | None:
        """The Lease, or None when it does not exist.

        Raises:
            KubernetesApiError: any other failure.
        """
        try:
            lease = self._api.read_namespaced_lease(
                name, namespace, _request_timeout=self._request_timeout
            )
        except ApiException as error:
            if error.status == HTTPStatus.NOT_FOUND:
                return None
            raise _api_error(error) from error
        except urllib3.exceptions.HTTPError as error:
            raise KubernetesApiError(0, str(error)) from error
        return _lease_record(lease)

    def create(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord:
        """Creates the Lease.

        Raises:
            LeaseConflictError: it already exists.
            KubernetesApiError: any other failure.
        """
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace),
            spec=_lease_spec(record),
        )
        try:
            created = self._api.create_namespaced_lease(
                namespace, body, _request_timeout=self._request_timeout
            )
        except ApiException as error:
            raise _api_error(error) from error
        except urllib3.exceptions.HTTPError as error:
            raise KubernetesApiError(0, str(error)) from error
        return _lease_record(created)

    def replace(self, namespace: str, name: str, record: LeaseRecord) -> LeaseRecord:
        """Replaces the Lease, on the condition that it is still at ``record.resource_version``.

        Raises:
            LeaseConflictError: the Lease changed since it was read.
            KubernetesApiError: any other failure.
        """
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(
                name=name, namespace=namespace, resource_version=record.resource_version or None
            ),
            spec=_lease_spec(record),
        )
        try:
            replaced = self._api.replace_namespaced_lease(
                name, namespace, body, _request_timeout=self._request_timeout
            )
        except ApiException as error:
            raise _api_error(error) from error
        except urllib3.exceptions.HTTPError as error:
            raise KubernetesApiError(0, str(error)) from error
        return _lease_record(replaced)


def _api_error(error: ApiException) -> KubernetesApiError:
    status = int(error.status or 0)
    message = f"{status} {error.reason}"
    if status == HTTPStatus.CONFLICT:
        return LeaseConflictError(status, message)
    return KubernetesApiError(status, message)


def _micro_time(moment: datetime | None) -> datetime | None:
    # The client writes datetimes with isoformat(), which drops the fraction when it is zero,
    # and the API server parses MicroTime with a mandatory ".000000": keep one microsecond.
    if moment is None:
        return None
    moment = moment.astimezone(UTC)
    return moment + timedelta(microseconds=1) if moment.microsecond == 0 else moment


def _lease_spec(record: LeaseRecord) -> client.V1LeaseSpec:
    return client.V1LeaseSpec(
        holder_identity=record.holder_identity or None,
        lease_duration_seconds=record.lease_duration_s,
        acquire_time=_micro_time(record.acquire_time),
        renew_time=_micro_time(record.renew_time),
        lease_transitions=record.lease_transitions,
    )


def _lease_record(lease: Any) -> LeaseRecord:
    spec = lease.spec or client.V1LeaseSpec()
    return LeaseRecord(
        holder_identity=spec.holder_identity or "",
        lease_duration_s=int(spec.lease_duration_seconds or 0),
        acquire_time=spec.acquire_time,
        renew_time=spec.renew_time,
        lease_transitions=int(spec.lease_transitions or 0),
        resource_version=str(lease.metadata.resource_version or ""),
    )
