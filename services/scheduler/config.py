"""Configuration of the scheduler daemon, read from ``HAMI_ACCOUNTING_*`` environment variables.

Layer: services/scheduler (runtime). ``SchedulerConfig.from_env`` is a pure function of a
Mapping and reports every problem in one ``ConfigError``; the command-line flags of
``__main__`` override the same fields one to one. With no variable set the daemon serves gRPC
on 127.0.0.1:50052 and reads usage from the recorder at 127.0.0.1:50053 (node usage through a
WatchUsage-fed cache), with HAMi's default policies (binpack across nodes, spread across the
GPUs of a node). The accounting policy (memory factor, GPU-count enforcement, resource names)
is the recorder's, taken from it (services.common.policy).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from accounting.fit import BINPACK, POLICIES, SPREAD
from services.common.config import (
    DEFAULT_USAGE_ADDR,
    CommonConfig,
    env_addr,
    env_choice,
    env_int,
    env_name,
    env_path,
    raise_if_problems,
    recorder_client_config,
)
from services.common.json_endpoint import ServingTls
from services.common.kube_api import NO_KUBERNETES, KubernetesAccess

DEFAULT_RESERVE_ATTEMPTS = 3
MAX_RESERVE_ATTEMPTS = 20
DEFAULT_USAGE_TIMEOUT_MS = 2000
NODE_CACHE_OFF = "off"
"""Every Filter reads its candidates' usage with GetNodeUsage."""
NODE_CACHE_WATCH = "watch"
"""A local copy of every node's state fed by WatchUsage; direct reads while it is down."""
NODE_CACHE_MODES = (NODE_CACHE_OFF, NODE_CACHE_WATCH)
DEFAULT_EXTENDER_DEADLINE_MS = 4000
"""Inside kube-scheduler's default extender ``httpTimeout`` of 5 s."""


@dataclass(frozen=True, kw_only=True)
class ExtenderConfig:
    """The kube-scheduler extender endpoint (services.scheduler.extender)."""

    addr: str
    """``host:port`` it listens on (HAMI_ACCOUNTING_EXTENDER_ADDR)."""
    tls: ServingTls | None
    """HTTPS with this certificate and key (HAMI_ACCOUNTING_EXTENDER_CERT_FILE and _KEY_FILE),
    and with HAMI_ACCOUNTING_EXTENDER_CLIENT_CA_FILE mutual TLS; None: plain HTTP."""
    deadline_ms: int = DEFAULT_EXTENDER_DEADLINE_MS
    """Every recorder call and the pod's patch of one request, within this
    (HAMI_ACCOUNTING_EXTENDER_DEADLINE_MS); keep it under the extender's ``httpTimeout``."""

    @classmethod
    def from_env(cls, env: Mapping[str, str], problems: list[str]) -> ExtenderConfig | None:
        """The endpoint's settings; None when HAMI_ACCOUNTING_EXTENDER_ADDR is unset."""
        cert = env_path(env, "EXTENDER_CERT_FILE", problems=problems, must_exist=True)
        key = env_path(env, "EXTENDER_KEY_FILE", problems=problems, must_exist=True)
        client_ca = env_path(env, "EXTENDER_CLIENT_CA_FILE", problems=problems, must_exist=True)
        deadline_ms = env_int(env, "EXTENDER_DEADLINE_MS", DEFAULT_EXTENDER_DEADLINE_MS,
                              problems=problems, minimum=100, maximum=60_000)
        given = bool(env.get(env_name("EXTENDER_ADDR"), "").strip())
        if not given:
            if cert or key or client_ca:
                problems.append(f"{env_name('EXTENDER_CERT_FILE')}, _KEY_FILE and "
                                f"_CLIENT_CA_FILE need {env_name('EXTENDER_ADDR')}")
            return None
        addr = env_addr(env, "EXTENDER_ADDR", "", problems=problems)
        tls: ServingTls | None = None
        if cert is not None and key is not None:
            tls = ServingTls(cert, key, client_ca)
        elif cert is not None or key is not None:
            missing = "EXTENDER_KEY_FILE" if cert is not None else "EXTENDER_CERT_FILE"
            problems.append(f"{env_name(missing)} required for HTTPS on the extender (set both "
                            "files, or neither for plain HTTP)")
        elif client_ca is not None:
            problems.append(f"{env_name('EXTENDER_CLIENT_CA_FILE')} needs HTTPS: set "
                            f"{env_name('EXTENDER_CERT_FILE')} and _KEY_FILE too")
        return cls(addr=addr, tls=tls, deadline_ms=deadline_ms)


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """Everything the scheduler daemon reads at start."""

    common: CommonConfig
    """Listen and metrics addresses, TLS, log level (see services.common.config). The gRPC TLS
    settings also secure the channel to the recorder."""
    usage_addr: str = DEFAULT_USAGE_ADDR
    """The usage recorder's gRPC ``host:port`` (HAMI_ACCOUNTING_USAGE_ADDR)."""
    node_policy: str = BINPACK
    """Which fitting node wins: ``binpack`` the busiest, ``spread`` the least busy
    (HAMI_ACCOUNTING_NODE_SCHEDULER_POLICY; HAMi's --node-scheduler-policy). A pod's
    ``hami.io/node-scheduler-policy`` annotation overrides it."""
    gpu_policy: str = SPREAD
    """Which GPU of a node is tried first, same words (HAMI_ACCOUNTING_GPU_SCHEDULER_POLICY;
    HAMi's --gpu-scheduler-policy). A pod's ``hami.io/gpu-scheduler-policy`` overrides it."""
    reserve_attempts: int = DEFAULT_RESERVE_ATTEMPTS
    """How many times a placement is computed and reserved when another scheduler replica took
    the capacity first (1..20; HAMI_ACCOUNTING_RESERVE_ATTEMPTS)."""
    usage_timeout_ms: int = DEFAULT_USAGE_TIMEOUT_MS
    """Deadline of every call to the recorder, milliseconds (HAMI_ACCOUNTING_USAGE_TIMEOUT_MS;
    default 2000). Shortened to what is left of the caller's own deadline."""
    node_cache: str = NODE_CACHE_WATCH
    """``watch`` (default) or ``off`` (HAMI_ACCOUNTING_NODE_CACHE); see
    services.scheduler.node_cache. Reserve re-checks either way."""
    extender: ExtenderConfig | None = None
    """The kube-scheduler extender endpoint; None (the default) serves gRPC only."""
    kubernetes: KubernetesAccess = NO_KUBERNETES
    """The Kubernetes API the extender patches pods through (HAMI_ACCOUNTING_KUBERNETES and
    HAMI_ACCOUNTING_KUBECONFIG); required with the extender, unused without it."""

    @property
    def usage_timeout_s(self) -> float:
        return self.usage_timeout_ms / 1000

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> SchedulerConfig:
        """Reads the daemon's settings.

        Raises:
            ConfigError: listing every invalid variable.
        """
        problems: list[str] = []
        common, usage_addr = recorder_client_config(env, "scheduler", problems=problems)
        node_policy = env_choice(env, "NODE_SCHEDULER_POLICY", POLICIES, BINPACK, problems=problems)
        gpu_policy = env_choice(env, "GPU_SCHEDULER_POLICY", POLICIES, SPREAD, problems=problems)
        reserve_attempts = env_int(
            env,
            "RESERVE_ATTEMPTS",
            DEFAULT_RESERVE_ATTEMPTS,
            problems=problems,
            minimum=1,
            maximum=MAX_RESERVE_ATTEMPTS,
        )
        usage_timeout_ms = env_int(
            env,
            "USAGE_TIMEOUT_MS",
            DEFAULT_USAGE_TIMEOUT_MS,
            problems=problems,
            minimum=1,
            maximum=60_000,
        )
        node_cache = env_choice(
            env, "NODE_CACHE", NODE_CACHE_MODES, NODE_CACHE_WATCH, problems=problems
        )
        extender = ExtenderConfig.from_env(env, problems)
        kubernetes = KubernetesAccess.from_env(env, problems=problems)
        if extender is not None and not kubernetes.enabled:
            problems.append(
                f"{env_name('EXTENDER_ADDR')} needs a Kubernetes API to annotate the pods it "
                f"places: set {env_name('KUBERNETES')} to in-cluster or kubeconfig"
            )
        raise_if_problems(problems)
        return cls(
            common=common,
            usage_addr=usage_addr,
            node_policy=node_policy,
            gpu_policy=gpu_policy,
            reserve_attempts=reserve_attempts,
            usage_timeout_ms=usage_timeout_ms,
            node_cache=node_cache,
            extender=extender,
            kubernetes=kubernetes,
        )
