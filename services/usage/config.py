"""Configuration of the usage recorder, read from ``HAMI_ACCOUNTING_*`` environment variables.

Layer: services/usage (runtime). ``UsageConfig.from_env`` is a pure function of a Mapping and
reports every problem in one ``ConfigError``; command-line flags of ``__main__`` override the
same fields one to one. With no variable set the recorder runs stand-alone: no Kubernetes, no
leader election, the journal in ``./data``.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from accounting.limits import MAX_MEMORY_FACTOR
from accounting.policy import AccountingPolicy, policy_for
from accounting.vendors import ALL_VENDORS, DEFAULT_VENDORS, known
from services.common.config import (
    CommonConfig,
    env_bool,
    env_choice,
    env_int,
    env_name,
    env_path,
    env_str,
    raise_if_problems,
)
from services.common.kube_api import KubernetesAccess
from services.usage.journal import (
    ON_DAMAGE_MODES,
    ON_DAMAGE_REBUILD,
    ON_DAMAGE_REFUSE,
    SYNCHRONOUS_MODES,
)
from services.usage.watch_hub import DEFAULT_MAX_STREAMS

DEFAULT_DATA_DIR = Path("data")
DEFAULT_LEASE_NAME = "hami-accounting-usage"
SERVICE_ACCOUNT_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _default_lease_namespace(namespace_file: Path) -> str:
    # In a pod the service account's namespace is the natural home of the Lease.
    try:
        return namespace_file.read_text().strip() or "default"
    except OSError:
        return "default"


@dataclass(frozen=True)
class UsageConfig:
    """Everything the usage recorder reads at start."""

    common: CommonConfig
    """Listen and metrics addresses, TLS, log level (see services.common.config)."""
    data_dir: Path = DEFAULT_DATA_DIR
    """Directory of the journal ``usage.sqlite3`` (HAMI_ACCOUNTING_DATA_DIR; default ./data)."""
    kubernetes: str = "off"
    """Kubernetes source: off, in-cluster or kubeconfig (HAMI_ACCOUNTING_KUBERNETES)."""
    kubeconfig: Path | None = None
    """Kubeconfig file for ``kubeconfig`` mode (HAMI_ACCOUNTING_KUBECONFIG, else KUBECONFIG)."""
    leader_election: bool = False
    """Compete for a Lease; only the leader writes (HAMI_ACCOUNTING_LEADER_ELECTION)."""
    lease_name: str = DEFAULT_LEASE_NAME
    """Name of the Lease (HAMI_ACCOUNTING_LEASE_NAME)."""
    lease_namespace: str = "default"
    """Namespace of the Lease (HAMI_ACCOUNTING_LEASE_NAMESPACE; default: the service
    account's namespace, else ``default``)."""
    identity: str = ""
    """This replica's holder identity (HAMI_ACCOUNTING_POD_NAME; default the hostname)."""
    memory_factor: int = 1
    """HAMi's memoryFactor: memory requests are multiplied by it once, and memory limits with
    them (1..65536; HAMI_ACCOUNTING_MEMORY_FACTOR). Part of the accounting policy the recorder
    publishes: the admission and scheduler daemons take it from here."""
    enforce_gpu_count: bool = True
    """Enforce ``limits.nvidia.com/gpu`` where a namespace sets it
    (HAMI_ACCOUNTING_ENFORCE_GPU_COUNT, default true; HAMi has no count quota, ``false``
    restores its behaviour). Part of the published accounting policy."""
    vendors: tuple[str, ...] = tuple(v.vendor for v in DEFAULT_VENDORS)
    """The vendors accounted, by keyword (HAMI_ACCOUNTING_VENDORS: a comma-separated list of
    keywords from the vendor table, ``default`` for those HAMi's chart turns on without a flag
    — every vendor but Ascend and Iluvatar — or ``all``). Part of the published policy."""
    journal_sync: str = "normal"
    """SQLite ``synchronous`` of the journal: ``normal`` survives a process kill, ``full`` also
    a power loss, one fsync per write (HAMI_ACCOUNTING_JOURNAL_SYNC)."""
    max_watch_streams: int = DEFAULT_MAX_STREAMS
    """Open WatchUsage streams served at most; past it a new one is refused with
    RESOURCE_EXHAUSTED (HAMI_ACCOUNTING_MAX_WATCH_STREAMS; one per admission and scheduler
    replica is what the daemons open)."""
    hami_legacy_metrics: bool = False
    """Also serve HAMi's pre-2.8 scheduler metric names (``GPUDeviceMemoryLimit``,
    ``vGPUMemoryAllocated``, ``QuotaUsed``...) beside the ``hami_*`` ones, as HAMi's
    ``--legacy-metrics`` does (HAMI_ACCOUNTING_HAMI_LEGACY_METRICS, default false)."""
    journal_on_damage: str = ON_DAMAGE_REFUSE
    """What to do when the journal is damaged or incomplete at start
    (HAMI_ACCOUNTING_JOURNAL_ON_DAMAGE): ``refuse`` (exit 3), ``accept-loss`` (keep what is
    readable, log what was lost) or ``rebuild-from-kubernetes`` (start empty; needs the
    Kubernetes source). It only acts when damage is found."""

    @property
    def kubernetes_enabled(self) -> bool:
        return self.kubernetes != "off"

    @property
    def policy(self) -> AccountingPolicy:
        """The accounting policy this recorder decides under and publishes: the vendors' table
        entries, NVIDIA's with the configured memory factor."""
        return policy_for(
            self.vendors,
            memory_factor=self.memory_factor,
            enforce_gpu_count=self.enforce_gpu_count,
        )

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str],
        *,
        namespace_file: Path = SERVICE_ACCOUNT_NAMESPACE_FILE,
    ) -> UsageConfig:
        """Reads the recorder's settings.

        Raises:
            ConfigError: listing every invalid variable.
        """
        problems: list[str] = []
        common = CommonConfig.for_service(env, "usage", problems=problems)
        data_dir = env_path(env, "DATA_DIR", DEFAULT_DATA_DIR, problems=problems)
        access = KubernetesAccess.from_env(env, problems=problems)
        kubernetes, kubeconfig = access.mode, access.kubeconfig
        leader_election = env_bool(env, "LEADER_ELECTION", False, problems=problems)
        if leader_election and kubernetes == "off":
            problems.append(
                f"{env_name('LEADER_ELECTION')} needs a Kubernetes API: set "
                f"{env_name('KUBERNETES')} to in-cluster or kubeconfig"
            )
        lease_name = env_str(env, "LEASE_NAME", DEFAULT_LEASE_NAME, problems=problems)
        lease_namespace = env_str(env, "LEASE_NAMESPACE", "", problems=problems)
        if not lease_namespace:
            lease_namespace = _default_lease_namespace(namespace_file)
        identity = env_str(env, "POD_NAME", "", problems=problems) or socket.gethostname()
        memory_factor = env_int(
            env, "MEMORY_FACTOR", 1, problems=problems, minimum=1, maximum=MAX_MEMORY_FACTOR
        )
        enforce_gpu_count = env_bool(env, "ENFORCE_GPU_COUNT", True, problems=problems)
        vendors = _vendors(env_str(env, "VENDORS", DEFAULT, problems=problems), problems)
        journal_sync = env_choice(
            env, "JOURNAL_SYNC", SYNCHRONOUS_MODES, "normal", problems=problems
        )
        max_watch_streams = env_int(
            env, "MAX_WATCH_STREAMS", DEFAULT_MAX_STREAMS, problems=problems, minimum=1,
            maximum=100_000,
        )
        hami_legacy_metrics = env_bool(env, "HAMI_LEGACY_METRICS", False, problems=problems)
        journal_on_damage = env_choice(
            env, "JOURNAL_ON_DAMAGE", ON_DAMAGE_MODES, ON_DAMAGE_REFUSE, problems=problems
        )
        if journal_on_damage == ON_DAMAGE_REBUILD and kubernetes == "off":
            problems.append(
                f"{env_name('JOURNAL_ON_DAMAGE')}={ON_DAMAGE_REBUILD} needs the Kubernetes "
                f"source: set {env_name('KUBERNETES')} to in-cluster or kubeconfig"
            )
        raise_if_problems(problems)
        return cls(
            common=common,
            data_dir=data_dir,
            kubernetes=kubernetes,
            kubeconfig=kubeconfig,
            leader_election=leader_election,
            lease_name=lease_name,
            lease_namespace=lease_namespace,
            identity=identity,
            memory_factor=memory_factor,
            enforce_gpu_count=enforce_gpu_count,
            vendors=vendors,
            journal_sync=journal_sync,
            max_watch_streams=max_watch_streams,
            hami_legacy_metrics=hami_legacy_metrics,
            journal_on_damage=journal_on_damage,
        )


DEFAULT = "default"
"""HAMI_ACCOUNTING_VENDORS: the vendors HAMi's chart schedules without a flag."""
ALL = "all"


def _vendors(value: str, problems: list[str]) -> tuple[str, ...]:
    """The keywords of HAMI_ACCOUNTING_VENDORS, in the table's order, each once."""
    words = [word.strip() for word in value.split(",") if word.strip()]
    chosen: set[str] = set()
    for word in words:
        if word.lower() == DEFAULT:
            chosen.update(v.vendor for v in DEFAULT_VENDORS)
        elif word.lower() == ALL:
            chosen.update(v.vendor for v in ALL_VENDORS)
        elif word in known():
            chosen.add(word)
        else:
            problems.append(
                f"{env_name('VENDORS')}: {word!r} is not a vendor HAMi schedules; use "
                f"{DEFAULT}, {ALL} or keywords from: {', '.join(known())}"
            )
    if not chosen and not problems:
        problems.append(f"{env_name('VENDORS')} names no vendor")
    return tuple(vendor for vendor in known() if vendor in chosen)
