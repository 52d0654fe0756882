"""The kube-scheduler extender under test: a scheduler daemon serving ``POST /filter`` beside a
real recorder, patching pods on the fake API server of our tests, and a client that sends what
kube-scheduler's HTTP extender sends (``ExtenderArgs`` as Go's ``json.Marshal`` writes it)."""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.scheduler.conftest import Scheduler
from tests.support.fake_apiserver import FakeApiServer

Json = dict[str, Any]


def write_kubeconfig(path: Path, server_url: str) -> Path:
    """A kubeconfig naming the fake API server."""
    path.write_text(json.dumps({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server_url}}],
        "users": [{"name": "scheduler", "user": {"token": "t"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "fake", "user": "scheduler"}}],
        "current-context": "ctx",
    }))
    return path


def extender_args(
    pod: Mapping[str, Any],
    node_names: Sequence[str] | None = None,
    nodes: Sequence[Mapping[str, Any]] | None = None,
) -> Json:
    """ExtenderArgs as kube-scheduler's ``json.Marshal`` writes it: no JSON tags, so the Go
    field names; the unused form ``null``."""
    return {
        "Pod": dict(pod),
        "Nodes": None if nodes is None else {"metadata": {}, "items": [dict(n) for n in nodes]},
        "NodeNames": None if node_names is None else list(node_names),
    }


@dataclass(frozen=True)
class Answer:
    status: int
    body: Json


@dataclass
class Extender:
    """A scheduler daemon with its extender endpoint, and the fake API server it patches."""

    scheduler: Scheduler
    apiserver: FakeApiServer
    url: str
    cafile: Path | None = None
    client_cert: tuple[Path, Path] | None = None

    def post(self, body: bytes | Mapping[str, Any], *, path: str = "/filter",
             method: str = "POST", headers: Mapping[str, str] | None = None) -> Answer:
        """One request, as kube-scheduler's HTTPExtender sends it (POST, JSON)."""
        self.scheduler.sync()
        scheme, _, rest = self.url.partition("://")
        host_port = rest.split("/", 1)[0]
        host, _, port = host_port.rpartition(":")
        connection: http.client.HTTPConnection
        if scheme == "https":
            context = ssl.create_default_context(cafile=str(self.cafile))
            if self.client_cert is not None:
                context.load_cert_chain(*map(str, self.client_cert))
            connection = http.client.HTTPSConnection(host, int(port), context=context,
                                                     timeout=30)
        else:
            connection = http.client.HTTPConnection(host, int(port), timeout=30)
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        try:
            connection.request(method, path, body=data if method == "POST" else None,
                               headers={"Content-Type": "application/json", **(headers or {})})
            response = connection.getresponse()
            raw = response.read()
            return Answer(response.status, json.loads(raw) if raw else {})
        finally:
            connection.close()

    def filter(self, pod: Mapping[str, Any], node_names: Sequence[str]) -> Json:
        answer = self.post(extender_args(pod, node_names))
        assert answer.status == 200, answer
        return answer.body

    def patches(self) -> list[str]:
        """The pods the extender patched (namespace/name), in order."""
        return [f"{r.namespace}/{r.name}" for r in self.apiserver.requests
                if r.method == "PATCH" and r.plural == "pods"]
