"""TLS and mutual TLS through build_server and client_channel, with throwaway certificates.

The certificates are made with the openssl command line (Debian ships it; the `cryptography`
package is not a dependency here).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import pytest
from common_runtime_support import ServeFn

from hami.accounting.v1 import usage_pb2, usage_pb2_grpc
from services.common.config import TlsConfig
from services.common.server import ServerStartError, client_channel


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.pem"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={name}",
             "-days", "2")
    return cert, key


def _make_leaf(directory: Path, name: str, ca: tuple[Path, Path], extensions: str) -> TlsConfig:
    key, csr, cert = (directory / f"{name}.key", directory / f"{name}.csr",
                      directory / f"{name}.pem")
    ext_file = directory / f"{name}.ext"
    ext_file.write_text(extensions + "\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
             "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext_file))
    return TlsConfig(cert_file=cert, key_file=key, ca_file=ca[0])


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TlsConfig]:
    directory = tmp_path_factory.mktemp("pki")
    ca = _make_ca(directory, "test-ca")
    rogue_ca = _make_ca(directory, "rogue-ca")
    return {
        "server": _make_leaf(directory, "server", ca,
                             "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                             "extendedKeyUsage=serverAuth"),
        "client": _make_leaf(directory, "client", ca, "extendedKeyUsage=clientAuth"),
        "rogue": _make_leaf(directory, "rogue", rogue_ca, "extendedKeyUsage=clientAuth"),
    }


def _get(channel: grpc.Channel) -> usage_pb2.GetPodUsageResponse:
    return usage_pb2_grpc.UsageRecorderStub(channel).GetPodUsage(
        usage_pb2.GetPodUsageRequest(pod_uid="ok"), timeout=5
    )


def test_mutual_tls_accepts_a_client_with_a_certificate_from_the_ca(
    serve: ServeFn, pki: dict[str, TlsConfig]
) -> None:
    handle = serve(tls=pki["server"])
    with client_channel(handle.target, tls=pki["client"]) as channel:
        assert _get(channel).found


def test_mutual_tls_refuses_a_client_without_a_certificate(
    serve: ServeFn, pki: dict[str, TlsConfig]
) -> None:
    handle = serve(tls=pki["server"])
    ca_only = grpc.ssl_channel_credentials(root_certificates=pki["server"].read_ca())
    with grpc.secure_channel(handle.target, ca_only) as channel, \
            pytest.raises(grpc.RpcError) as caught:
        _get(channel)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_refuses_a_certificate_from_another_ca(
    serve: ServeFn, pki: dict[str, TlsConfig]
) -> None:
    handle = serve(tls=pki["server"])
    rogue = pki["rogue"]
    # The rogue client trusts the real CA (so it would accept the server) but presents its own.
    credentials = grpc.ssl_channel_credentials(
        root_certificates=pki["server"].read_ca(),
        private_key=rogue.read_key(),
        certificate_chain=rogue.read_cert(),
    )
    with grpc.secure_channel(handle.target, credentials) as channel, \
            pytest.raises(grpc.RpcError) as caught:
        _get(channel)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_plaintext_client_cannot_talk_to_a_tls_server(
    serve: ServeFn, pki: dict[str, TlsConfig]
) -> None:
    handle = serve(tls=pki["server"])
    with grpc.insecure_channel(handle.target) as channel, \
            pytest.raises(grpc.RpcError) as caught:
        _get(channel)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_server_tls_without_ca_does_not_ask_for_client_certificates(
    serve: ServeFn, pki: dict[str, TlsConfig]
) -> None:
    server = pki["server"]
    handle = serve(tls=TlsConfig(cert_file=server.cert_file, key_file=server.key_file))
    ca_only = grpc.ssl_channel_credentials(root_certificates=server.read_ca())
    with grpc.secure_channel(handle.target, ca_only) as channel:
        assert _get(channel).found


def test_unreadable_certificate_is_a_start_error(serve: ServeFn, tmp_path: Path) -> None:
    missing = TlsConfig(cert_file=tmp_path / "nope.pem", key_file=tmp_path / "nope.key")
    with pytest.raises(ServerStartError, match="cannot read TLS files"):
        serve(tls=missing)


def test_a_key_of_another_certificate_says_so(
    serve: ServeFn, pki: dict[str, TlsConfig]
) -> None:
    # Issue 15: this was reported as "cannot listen on ... (address in use or not available
    # here)".
    server, client = pki["server"], pki["client"]
    mismatched = TlsConfig(cert_file=server.cert_file, key_file=client.key_file)
    with pytest.raises(ServerStartError) as raised:
        serve(tls=mismatched)
    assert str(raised.value) == (
        f"the private key {client.key_file} does not belong to the certificate "
        f"{server.cert_file}"
    )


@pytest.mark.parametrize("broken", ["cert_file", "key_file", "ca_file"])
def test_a_file_that_is_not_pem_says_which(
    serve: ServeFn, pki: dict[str, TlsConfig], tmp_path: Path, broken: str
) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    server = pki["server"]
    files = {"cert_file": server.cert_file, "key_file": server.key_file,
             "ca_file": server.ca_file}
    files[broken] = garbage
    with pytest.raises(ServerStartError) as raised:
        serve(tls=TlsConfig(**files))
    message = str(raised.value)
    assert str(garbage) in message and "PEM" in message
    assert "address in use" not in message
