"""Configuration of the scheduler daemon, read from ``HAMI_ACCOUNTING_*`` environment variables.

Layer: services/scheduler (runtime). ``SchedulerConfig.from_env`` is a pure function of a
Mapping and reports every problem in one ``ConfigError``; the command-line flags of
``__main__`` override the same fields one to one. With no variable set the daemon serves gRPC
on 127.0.0.1:50052 and reads usage from the recorder at 127.0.0.1:50053 (node usage through a
WatchUsage-fed cache), with HAMi's default policies (binpack across nodes, spread across the
GPUs of a node).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from accounting.fit import BINPACK, POLICIES, SPREAD
from accounting.validate import MAX_MEMORY_FACTOR
from services.common.config import (
    DEFAULT_USAGE_ADDR,
    CommonConfig,
    env_addr,
    env_int,
    env_name,
    env_str,
    raise_if_problems,
)

DEFAULT_RESERVE_ATTEMPTS = 3
MAX_RESERVE_ATTEMPTS = 20
DEFAULT_USAGE_TIMEOUT_MS = 2000
NODE_CACHE_OFF = "off"
"""Every Filter reads its candidates' usage with GetNodeUsage."""
NODE_CACHE_WATCH = "watch"
"""A local copy of every node's state fed by WatchUsage; direct reads while it is down."""
NODE_CACHE_MODES = (NODE_CACHE_OFF, NODE_CACHE_WATCH)


def _policy(env: Mapping[str, str], key: str, default: str, problems: list[str]) -> str:
    value = env_str(env, key, default, problems=problems).lower()
    if value not in POLICIES:
        problems.append(f"{env_name(key)} must be one of {', '.join(POLICIES)}, got {value!r}")
        return default
    return value


@dataclass(frozen=True)
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
    memory_factor: int = 1
    """HAMi's memoryFactor: memory requests are multiplied by it when fitted (>= 1;
    HAMI_ACCOUNTING_MEMORY_FACTOR). Must match the recorder's and HAMi's."""
    reserve_attempts: int = DEFAULT_RESERVE_ATTEMPTS
    """How many times a placement is computed and reserved when another scheduler replica took
    the capacity first (1..20; HAMI_ACCOUNTING_RESERVE_ATTEMPTS)."""
    usage_timeout_ms: int = DEFAULT_USAGE_TIMEOUT_MS
    """Deadline of every call to the recorder, milliseconds (HAMI_ACCOUNTING_USAGE_TIMEOUT_MS;
    default 2000). Shortened to what is left of the caller's own deadline."""
    node_cache: str = NODE_CACHE_WATCH
    """``watch`` (default) or ``off`` (HAMI_ACCOUNTING_NODE_CACHE); see
    services.scheduler.node_cache. Reserve re-checks either way."""

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
        common = CommonConfig.for_service(env, "scheduler", problems=problems)
        usage_addr = env_addr(env, "USAGE_ADDR", DEFAULT_USAGE_ADDR, problems=problems)
        node_policy = _policy(env, "NODE_SCHEDULER_POLICY", BINPACK, problems)
        gpu_policy = _policy(env, "GPU_SCHEDULER_POLICY", SPREAD, problems)
        memory_factor = env_int(
            env, "MEMORY_FACTOR", 1, problems=problems, minimum=1, maximum=MAX_MEMORY_FACTOR
        )
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
        node_cache = env_str(env, "NODE_CACHE", NODE_CACHE_WATCH, problems=problems).lower()
        if node_cache not in NODE_CACHE_MODES:
            problems.append(
                f"{env_name('NODE_CACHE')} must be one of {', '.join(NODE_CACHE_MODES)}, "
                f"got {node_cache!r}"
            )
            node_cache = NODE_CACHE_WATCH
        raise_if_problems(problems)
        return cls(
            common=common,
            usage_addr=usage_addr,
            node_policy=node_policy,
            gpu_policy=gpu_policy,
            memory_factor=memory_factor,
            reserve_attempts=reserve_attempts,
            usage_timeout_ms=usage_timeout_ms,
            node_cache=node_cache,
        )
