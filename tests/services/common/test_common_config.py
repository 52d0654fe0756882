"""Config from environment variables: defaults, every problem listed at once, TLS settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.config import (
    DEFAULT_PORTS,
    CommonConfig,
    ConfigError,
    TlsConfig,
    env_bool,
    env_int,
    env_path,
    env_str,
    parse_host_port,
    raise_if_problems,
)


def test_defaults_listen_on_loopback_with_the_service_ports() -> None:
    config = CommonConfig.for_service({}, "usage")
    assert config == CommonConfig(listen_addr="127.0.0.1:50053", metrics_addr="127.0.0.1:9103",
                                  tls=None, log_level="INFO")


def test_default_ports_of_the_three_daemons() -> None:
    assert {name: tuple(ports) for name, ports in DEFAULT_PORTS.items()} == {
        "admission": (50051, 9101),
        "scheduler": (50052, 9102),
        "usage": (50053, 9103),
    }


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({"HAMI_ACCOUNTING_LISTEN_ADDR": "0.0.0.0:7000"},
         CommonConfig("0.0.0.0:7000", "127.0.0.1:9101", None, "INFO")),
        ({"HAMI_ACCOUNTING_METRICS_ADDR": "off"},
         CommonConfig("127.0.0.1:50051", None, None, "INFO")),
        ({"HAMI_ACCOUNTING_METRICS_ADDR": "OFF", "HAMI_ACCOUNTING_LOG_LEVEL": "debug"},
         CommonConfig("127.0.0.1:50051", None, None, "DEBUG")),
        ({"HAMI_ACCOUNTING_LISTEN_ADDR": "[::]:50051", "HAMI_ACCOUNTING_METRICS_ADDR": ""},
         CommonConfig("[::]:50051", "127.0.0.1:9101", None, "INFO")),
    ],
    ids=[
        "the container image listens everywhere",
        "metrics can be turned off",
        "off and log level in any case",
        "IPv6 wildcard; an empty variable means the default",
    ],
)
def test_overrides(env: dict[str, str], want: CommonConfig) -> None:
    assert CommonConfig.for_service(env, "admission") == want


def test_every_problem_is_listed_in_one_error(tmp_path: Path) -> None:
    env = {
        "HAMI_ACCOUNTING_LISTEN_ADDR": "localhost",
        "HAMI_ACCOUNTING_METRICS_ADDR": "127.0.0.1:http",
        "HAMI_ACCOUNTING_LOG_LEVEL": "chatty",
        "HAMI_ACCOUNTING_TLS_CERT_FILE": str(tmp_path / "missing.pem"),
    }
    with pytest.raises(ConfigError) as caught:
        CommonConfig.from_env(env, 50051, 9101)
    problems = caught.value.problems
    assert problems == (
        "HAMI_ACCOUNTING_LISTEN_ADDR must be host:port, got 'localhost'",
        "HAMI_ACCOUNTING_METRICS_ADDR port must be an integer, got '127.0.0.1:http'",
        "HAMI_ACCOUNTING_LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, "
        "got 'CHATTY'",
        f"HAMI_ACCOUNTING_TLS_CERT_FILE points to '{tmp_path / 'missing.pem'}', "
        "which does not exist",
        "HAMI_ACCOUNTING_TLS_KEY_FILE required when TLS is configured",
    )
    assert all(problem in str(caught.value) for problem in problems)


def test_common_problems_can_be_collected_with_a_service_s_own() -> None:
    problems: list[str] = []
    CommonConfig.from_env({"HAMI_ACCOUNTING_LISTEN_ADDR": "x"}, 1, 2, problems=problems)
    env_int({"HAMI_ACCOUNTING_WORKERS": "many"}, "WORKERS", 4, problems=problems)
    assert len(problems) == 2
    with pytest.raises(ConfigError, match=r"LISTEN_ADDR.*; HAMI_ACCOUNTING_WORKERS"):
        raise_if_problems(problems)


def _touch(directory: Path, *names: str) -> list[Path]:
    paths = [directory / name for name in names]
    for path in paths:
        path.write_text("pem")
    return paths


def test_tls_unset_is_plaintext() -> None:
    assert TlsConfig.from_env({}) is None


def test_tls_with_ca_is_mutual(tmp_path: Path) -> None:
    cert, key, ca = _touch(tmp_path, "c.pem", "k.pem", "ca.pem")
    config = TlsConfig.from_env({
        "HAMI_ACCOUNTING_TLS_CERT_FILE": str(cert),
        "HAMI_ACCOUNTING_TLS_KEY_FILE": str(key),
        "HAMI_ACCOUNTING_TLS_CA_FILE": str(ca),
    })
    assert config == TlsConfig(cert_file=cert, key_file=key, ca_file=ca)
    assert config.mutual


def test_tls_without_ca_is_server_only(tmp_path: Path) -> None:
    cert, key = _touch(tmp_path, "c.pem", "k.pem")
    config = TlsConfig.from_env({
        "HAMI_ACCOUNTING_TLS_CERT_FILE": str(cert),
        "HAMI_ACCOUNTING_TLS_KEY_FILE": str(key),
    })
    assert config is not None and not config.mutual


def test_tls_ca_alone_is_refused_not_silently_plaintext(tmp_path: Path) -> None:
    (ca,) = _touch(tmp_path, "ca.pem")
    with pytest.raises(ConfigError) as caught:
        TlsConfig.from_env({"HAMI_ACCOUNTING_TLS_CA_FILE": str(ca)})
    assert caught.value.problems == (
        "HAMI_ACCOUNTING_TLS_CERT_FILE and HAMI_ACCOUNTING_TLS_KEY_FILE required when TLS is "
        "configured",
    )


@dataclass(frozen=True)
class ReaderCase:
    name: str
    env: dict[str, str]
    want: object
    want_problems: list[str] = field(default_factory=list)


READER_CASES = [
    ReaderCase("int parsed", {"HAMI_ACCOUNTING_N": " 12 "}, 12),
    ReaderCase("int unset gives the default", {}, 7),
    ReaderCase("int not a number", {"HAMI_ACCOUNTING_N": "1.5"}, 7,
               ["HAMI_ACCOUNTING_N must be an integer, got '1.5'"]),
    ReaderCase("int below the minimum", {"HAMI_ACCOUNTING_N": "0"}, 7,
               ["HAMI_ACCOUNTING_N must be >= 1, got 0"]),
    ReaderCase("int above the maximum", {"HAMI_ACCOUNTING_N": "101"}, 7,
               ["HAMI_ACCOUNTING_N must be <= 100, got 101"]),
]


@pytest.mark.parametrize("case", READER_CASES, ids=lambda c: c.name)
def test_env_int(case: ReaderCase) -> None:
    problems: list[str] = []
    assert env_int(case.env, "N", 7, problems=problems, minimum=1, maximum=100) == case.want
    assert problems == case.want_problems


@pytest.mark.parametrize(
    ("value", "want", "want_problem"),
    [("true", True, False), ("On", True, False), ("1", True, False), ("no", False, False),
     ("FALSE", False, False), ("maybe", True, True)],
    ids=["true", "On", "1", "no", "FALSE", "not a boolean keeps the default"],
)
def test_env_bool(value: str, want: bool, want_problem: bool) -> None:
    problems: list[str] = []
    assert env_bool({"HAMI_ACCOUNTING_FLAG": value}, "FLAG", True, problems=problems) == want
    assert bool(problems) == want_problem


def test_required_string_and_path_are_reported_by_full_name() -> None:
    problems: list[str] = []
    assert env_str({}, "USAGE_ADDR", problems=problems, required=True) == ""
    assert env_path({}, "JOURNAL_PATH", problems=problems, required=True) is None
    assert problems == ["HAMI_ACCOUNTING_USAGE_ADDR is required",
                        "HAMI_ACCOUNTING_JOURNAL_PATH is required"]


def test_full_variable_names_are_accepted_too() -> None:
    problems: list[str] = []
    env = {"HAMI_ACCOUNTING_DATA_DIR": "/var/lib/x"}
    assert env_path(env, "HAMI_ACCOUNTING_DATA_DIR", Path("d"), problems=problems) == Path(
        "/var/lib/x")
    assert problems == []


@pytest.mark.parametrize(
    ("value", "want"),
    [("127.0.0.1:50051", ("127.0.0.1", 50051)), ("[::1]:0", ("::1", 0)),
     ("usage.hami-system.svc:50053", ("usage.hami-system.svc", 50053))],
    ids=["IPv4", "IPv6 in brackets with port 0", "DNS name"],
)
def test_parse_host_port(value: str, want: tuple[str, int]) -> None:
    assert parse_host_port(value) == want


@pytest.mark.parametrize("value", [":50051", "host", "host:99999", "host:-1"],
                         ids=["no host", "no port", "port too large", "negative port"])
def test_parse_host_port_rejects(value: str) -> None:
    with pytest.raises(ValueError):
        parse_host_port(value)


_HOSTS = st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,30}[a-z0-9])?", fullmatch=True)
_PORTS = st.integers(min_value=0, max_value=65535)


@given(host=_HOSTS, port=_PORTS)
def test_parse_host_port_inverts_formatting(host: str, port: int) -> None:
    assert parse_host_port(f"{host}:{port}") == (host, port)


@given(address=st.ip_addresses(v=6), port=_PORTS)
def test_parse_host_port_inverts_bracketed_ipv6(address: object, port: int) -> None:
    assert parse_host_port(f"[{address}]:{port}") == (str(address), port)


@given(value=st.integers(min_value=-(10**12), max_value=10**12))
def test_env_int_reads_back_any_integer_within_bounds(value: int) -> None:
    problems: list[str] = []
    got = env_int({"HAMI_ACCOUNTING_N": str(value)}, "N", 0, problems=problems,
                  minimum=-(10**6), maximum=10**6)
    if -(10**6) <= value <= 10**6:
        assert (got, problems) == (value, [])
    else:
        assert got == 0 and len(problems) == 1
