"""Configuration shared by the three daemons, read from environment variables.

Layer: services (runtime). Every daemon builds its config once in ``__main__`` from a Mapping
(``os.environ`` in production, a dict in tests) and passes it down; nothing here is global.
Variables carry the prefix ``HAMI_ACCOUNTING_`` so they never collide with the
``<SERVICE>_PORT`` variables Kubernetes injects. Parsing collects *every* problem and raises one
``ConfigError`` listing them all, so an operator fixes a manifest in one round trip.

Each reader takes the problem list as a keyword argument and appends to it instead of raising;
the caller raises once at the end with ``raise_if_problems(problems)``. A service's own config
composes with the common one like this::

    problems: list[str] = []
    common = CommonConfig.from_env(env, *DEFAULT_PORTS["usage"], problems=problems)
    journal = env_path(env, "JOURNAL_PATH", Path("data/usage.sqlite"), problems=problems)
    raise_if_problems(problems)
"""

from __future__ import annotations

import argparse
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, overload

from accounting import numbers

ENV_PREFIX = "HAMI_ACCOUNTING_"

# The value of HAMI_ACCOUNTING_METRICS_ADDR that turns the Prometheus endpoint off.
METRICS_OFF = "off"

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
_FALSE_WORDS = frozenset({"0", "false", "no", "off"})


class ServicePorts(NamedTuple):
    """The default ports of one daemon."""

    grpc: int
    """gRPC listen port."""
    metrics: int
    """Prometheus /metrics port."""


DEFAULT_PORTS: Mapping[str, ServicePorts] = {
    "admission": ServicePorts(grpc=50051, metrics=9101),
    "scheduler": ServicePorts(grpc=50052, metrics=9102),
    "usage": ServicePorts(grpc=50053, metrics=9103),
}

# Where admission and scheduler find the usage recorder unless HAMI_ACCOUNTING_USAGE_ADDR says.
DEFAULT_USAGE_ADDR = f"127.0.0.1:{DEFAULT_PORTS['usage'].grpc}"

RECORDER_SETTINGS = ("MEMORY_FACTOR", "ENFORCE_GPU_COUNT", "VENDORS")
"""Variables of the accounting policy: the usage recorder's configuration, which the admission
and scheduler daemons take from the recorder (services.common.policy)."""


def recorder_settings_problems(env: Mapping[str, str], service: str, problems: list[str]) -> None:
    """Refuses a policy setting given to a daemon that takes its policy from the recorder: it
    would change nothing there, and an operator who set it would believe it in force."""
    for key in RECORDER_SETTINGS:
        if _raw(env, key) is not None:
            problems.append(
                f"{env_name(key)} is the usage recorder's setting, not the {service} daemon's: "
                "every daemon answers under the recorder's accounting policy; set it on the "
                "recorder (docs/deploy.md)"
            )


class ConfigError(Exception):
    """The environment cannot be turned into a config; lists every problem found."""

    def __init__(self, problems: list[str] | tuple[str, ...]) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        if not self.problems:
            raise ValueError("ConfigError needs at least one problem")
        super().__init__("invalid configuration: " + "; ".join(self.problems))


def raise_if_problems(problems: list[str]) -> None:
    """Raises one ConfigError listing every collected problem, if there are any."""
    if problems:
        raise ConfigError(problems)


def env_name(key: str) -> str:
    """The full variable name for ``key`` (``"PORT"`` -> ``"HAMI_ACCOUNTING_PORT"``)."""
    return key if key.startswith(ENV_PREFIX) else ENV_PREFIX + key


def _raw(env: Mapping[str, str], key: str) -> str | None:
    # An empty value counts as unset: manifests often template a variable to "" to disable it.
    value = env.get(env_name(key), "").strip()
    return value or None


def env_str(
    env: Mapping[str, str],
    key: str,
    default: str = "",
    *,
    problems: list[str],
    required: bool = False,
) -> str:
    """A string variable; ``required`` adds a problem when it is unset or empty."""
    value = _raw(env, key)
    if value is None:
        if required:
            problems.append(f"{env_name(key)} is required")
        return default
    return value


def env_choice(
    env: Mapping[str, str],
    key: str,
    choices: tuple[str, ...],
    default: str,
    *,
    problems: list[str],
) -> str:
    """One of ``choices`` (read in lower case); the default when unset or not one of them."""
    value = env_str(env, key, default, problems=problems).lower()
    if value not in choices:
        problems.append(f"{env_name(key)} must be one of {', '.join(choices)}, got {value!r}")
        return default
    return value


def env_int(
    env: Mapping[str, str],
    key: str,
    default: int,
    *,
    problems: list[str],
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    """An integer variable, optionally bounded (inclusive); the default when unset or invalid."""
    value = _raw(env, key)
    if value is None:
        return default
    number = numbers.decimal_integer(value)
    if number is None:
        problems.append(f"{env_name(key)} must be an integer, got {value!r}")
        return default
    if minimum is not None and number < minimum:
        problems.append(f"{env_name(key)} must be >= {minimum}, got {number}")
        return default
    if maximum is not None and number > maximum:
        problems.append(f"{env_name(key)} must be <= {maximum}, got {number}")
        return default
    return number


def env_bool(
    env: Mapping[str, str],
    key: str,
    default: bool,
    *,
    problems: list[str],
) -> bool:
    """A boolean variable: true/false, 1/0, yes/no or on/off, in any case."""
    value = _raw(env, key)
    if value is None:
        return default
    word = value.lower()
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    problems.append(f"{env_name(key)} must be true or false, got {value!r}")
    return default


@overload
def env_path(
    env: Mapping[str, str],
    key: str,
    default: Path,
    *,
    problems: list[str],
    required: bool = ...,
    must_exist: bool = ...,
) -> Path: ...


@overload
def env_path(
    env: Mapping[str, str],
    key: str,
    default: None = ...,
    *,
    problems: list[str],
    required: bool = ...,
    must_exist: bool = ...,
) -> Path | None: ...


def env_path(
    env: Mapping[str, str],
    key: str,
    default: Path | None = None,
    *,
    problems: list[str],
    required: bool = False,
    must_exist: bool = False,
) -> Path | None:
    """A filesystem path; ``must_exist`` adds a problem when the file is not there."""
    value = _raw(env, key)
    if value is None:
        if required:
            problems.append(f"{env_name(key)} is required")
        return default
    path = Path(value)
    if must_exist and not path.exists():
        problems.append(f"{env_name(key)} points to {value!r}, which does not exist")
    return path


def parse_host_port(value: str) -> tuple[str, int]:
    """Splits ``host:port`` (``[v6]:port`` for IPv6); raises ValueError saying what is wrong."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"must be host:port, got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    port = numbers.decimal_integer(port_text)
    if port is None:
        raise ValueError(f"port must be an integer, got {value!r}")
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be within 0..65535, got {value!r}")
    return host, port


def env_addr(
    env: Mapping[str, str],
    key: str,
    default: str,
    *,
    problems: list[str],
) -> str:
    """A ``host:port`` variable, checked for shape; returned as written."""
    value = env_str(env, key, default, problems=problems)
    _check_addr(key, value, problems)
    return value


def _check_addr(key: str, value: str, problems: list[str]) -> None:
    try:
        parse_host_port(value)
    except ValueError as error:
        problems.append(f"{env_name(key)} {error}")


@dataclass(frozen=True)
class TlsConfig:
    """Certificates for gRPC, used by a daemon as a server and as a client of another daemon.

    As a server: present ``cert_file``/``key_file``; when ``ca_file`` is given, require client
    certificates signed by it (mutual TLS). As a client: verify the server against ``ca_file``
    (the system roots when None) and present ``cert_file``/``key_file``.
    """

    cert_file: Path
    """PEM certificate chain (HAMI_ACCOUNTING_TLS_CERT_FILE)."""
    key_file: Path
    """PEM private key (HAMI_ACCOUNTING_TLS_KEY_FILE)."""
    ca_file: Path | None = None
    """PEM CA bundle (HAMI_ACCOUNTING_TLS_CA_FILE); set means mutual TLS."""

    @property
    def mutual(self) -> bool:
        """True when peers must present a certificate signed by ``ca_file``."""
        return self.ca_file is not None

    def read_cert(self) -> bytes:
        return self.cert_file.read_bytes()

    def read_key(self) -> bytes:
        return self.key_file.read_bytes()

    def read_ca(self) -> bytes | None:
        return self.ca_file.read_bytes() if self.ca_file is not None else None

    def problem(self) -> str | None:
        """What is wrong with the files, in one sentence, or None when they can serve TLS.

        grpcio reports a certificate it cannot use (a key of another certificate, a file that
        is not PEM) as a failed bind, "address in use"; Python's ssl reads the same files and
        says what is wrong.
        """
        return tls_pair_problem(self.cert_file, self.key_file, self.ca_file)


    @classmethod
    def from_env(
        cls, env: Mapping[str, str], *, problems: list[str] | None = None
    ) -> TlsConfig | None:
        """TLS settings, or None when no TLS variable is set (plaintext).

        Raises ConfigError when ``problems`` is None; otherwise appends to it.
        """
        found: list[str] = []
        cert = env_path(env, "TLS_CERT_FILE", problems=found, must_exist=True)
        key = env_path(env, "TLS_KEY_FILE", problems=found, must_exist=True)
        ca = env_path(env, "TLS_CA_FILE", problems=found, must_exist=True)
        config: TlsConfig | None = None
        if cert is None and key is None and ca is None:
            config = None
        elif cert is None or key is None:
            # A CA alone would mean "verify peers" without an identity to present: refuse it
            # rather than silently serving plaintext.
            missing = [env_name(k) for k, v in (("TLS_CERT_FILE", cert), ("TLS_KEY_FILE", key))
                       if v is None]
            found.append(f"{' and '.join(missing)} required when TLS is configured")
        else:
            config = cls(cert_file=cert, key_file=key, ca_file=ca)
        if problems is None:
            raise_if_problems(found)
        else:
            problems.extend(found)
        return config


def tls_pair_problem(cert_file: Path, key_file: Path, ca_file: Path | None = None) -> str | None:
    """Why a certificate, its key and (optionally) a CA bundle cannot serve TLS, or None.

    E.g. "the private key /tls/tls.key does not belong to the certificate /tls/tls.crt".
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as error:
        if "KEY_VALUES_MISMATCH" in str(error):
            return f"the private key {key_file} does not belong to the certificate {cert_file}"
        return (
            f"cannot use the certificate {cert_file} with the private key {key_file}: "
            f"{error.reason or error} (PEM files expected)"
        )
    except OSError as error:
        return f"cannot read TLS files: {error}"
    if ca_file is not None:
        try:
            context.load_verify_locations(cafile=ca_file)
        except ssl.SSLError as error:
            return f"cannot use the CA bundle {ca_file}: {error.reason or error} (PEM expected)"
        except OSError as error:
            return f"cannot read TLS files: {error}"
    return None

@dataclass(frozen=True)
class CommonConfig:
    """Settings every daemon has."""

    listen_addr: str
    """gRPC ``host:port`` (HAMI_ACCOUNTING_LISTEN_ADDR; default 127.0.0.1:<service port>)."""
    metrics_addr: str | None
    """Prometheus ``host:port`` (HAMI_ACCOUNTING_METRICS_ADDR; ``off`` gives None)."""
    tls: TlsConfig | None
    """gRPC TLS (HAMI_ACCOUNTING_TLS_*); None means plaintext."""
    log_level: str
    """One of DEBUG, INFO, WARNING, ERROR, CRITICAL (HAMI_ACCOUNTING_LOG_LEVEL; default INFO)."""

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str],
        default_port: int,
        default_metrics_port: int,
        *,
        problems: list[str] | None = None,
    ) -> CommonConfig:
        """Reads the common settings.

        Raises ConfigError listing every problem when ``problems`` is None; otherwise appends
        the problems to it so the caller can report them together with its own.
        """
        found: list[str] = []
        listen_addr = env_addr(env, "LISTEN_ADDR", f"127.0.0.1:{default_port}", problems=found)
        metrics_value = env_str(env, "METRICS_ADDR", f"127.0.0.1:{default_metrics_port}",
                                problems=found)
        metrics_addr: str | None = None
        if metrics_value.lower() != METRICS_OFF:
            _check_addr("METRICS_ADDR", metrics_value, found)
            metrics_addr = metrics_value
        log_level = env_str(env, "LOG_LEVEL", "INFO", problems=found).upper()
        if log_level not in LOG_LEVELS:
            found.append(f"{env_name('LOG_LEVEL')} must be one of {', '.join(LOG_LEVELS)}, "
                         f"got {log_level!r}")
            log_level = "INFO"
        tls = TlsConfig.from_env(env, problems=found)
        if problems is None:
            raise_if_problems(found)
        else:
            problems.extend(found)
        return cls(listen_addr=listen_addr, metrics_addr=metrics_addr, tls=tls,
                   log_level=log_level)

    @classmethod
    def for_service(
        cls, env: Mapping[str, str], service: str, *, problems: list[str] | None = None
    ) -> CommonConfig:
        """from_env with the default ports of ``service`` (admission, scheduler or usage)."""
        ports = DEFAULT_PORTS[service]
        return cls.from_env(env, ports.grpc, ports.metrics, problems=problems)


def recorder_client_config(
    env: Mapping[str, str], service: str, *, problems: list[str]
) -> tuple[CommonConfig, str]:
    """The settings of a daemon that reads the usage recorder (admission, scheduler): its common
    settings and the recorder's address, refusing the recorder's own policy settings."""
    common = CommonConfig.for_service(env, service, problems=problems)
    recorder_settings_problems(env, service, problems)
    return common, env_addr(env, "USAGE_ADDR", DEFAULT_USAGE_ADDR, problems=problems)


def environment_with_flags(
    args: argparse.Namespace, flag_env: Mapping[str, str], environ: Mapping[str, str]
) -> dict[str, str]:
    """The environment with every command-line flag that was given written over its variable.

    Flags map one to one to HAMI_ACCOUNTING_* variables (``flag_env``: argparse dest -> key
    after the prefix), so a daemon reads its configuration from one place: the environment.
    """
    env = dict(environ)
    for dest, key in flag_env.items():
        value = getattr(args, dest)
        if value is not None:
            env[env_name(key)] = value
    return env
