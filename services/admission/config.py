"""Configuration of the admission daemon, read from ``HAMI_ACCOUNTING_*`` environment variables.

Layer: services/admission (runtime). ``AdmissionConfig.from_env`` is a pure function of a
Mapping and reports every problem in one ``ConfigError``; the command-line flags of
``__main__`` override the same fields one to one. With no variable set the daemon serves gRPC on
127.0.0.1:50051, reads usage from the recorder at 127.0.0.1:50053 (through a WatchUsage cache),
and runs no AdmissionReview endpoint (it needs a serving certificate). Nothing here changes an
answer: the accounting policy (memory factor, GPU-count enforcement, resource names) is the
recorder's, taken from it (services.common.policy).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from accounting.owned_annotations import DEFAULT_ANNOTATION_WRITERS
from services.common.config import (
    DEFAULT_USAGE_ADDR,
    CommonConfig,
    env_addr,
    env_choice,
    env_name,
    env_path,
    raise_if_problems,
    recorder_client_config,
)

USAGE_CACHE_OFF = "off"
"""Every check reads the namespace's usage from the recorder."""
USAGE_CACHE_WATCH = "watch"
"""A local copy fed by the recorder's WatchUsage stream (the default); direct reads while the
stream is down and to confirm a denial."""
USAGE_CACHE_MODES = (USAGE_CACHE_OFF, USAGE_CACHE_WATCH)

DEFAULT_WEBHOOK_ADDR = "0.0.0.0:8443"


@dataclass(frozen=True)
class AdmissionConfig:
    """Everything the admission daemon reads at start."""

    common: CommonConfig
    """Listen and metrics addresses, TLS, log level (see services.common.config). The gRPC TLS
    settings also secure the channel to the recorder."""
    usage_addr: str = DEFAULT_USAGE_ADDR
    """The usage recorder's gRPC ``host:port`` (HAMI_ACCOUNTING_USAGE_ADDR)."""
    usage_cache: str = USAGE_CACHE_WATCH
    """``off`` or ``watch`` (HAMI_ACCOUNTING_USAGE_CACHE); see services.admission.usage_source."""
    webhook_addr: str | None = None
    """``host:port`` of the AdmissionReview HTTPS endpoint (HAMI_ACCOUNTING_WEBHOOK_ADDR;
    default 0.0.0.0:8443 when a certificate is configured); None when disabled."""
    webhook_cert_file: Path | None = None
    """PEM serving certificate chain of the endpoint (HAMI_ACCOUNTING_WEBHOOK_CERT_FILE)."""
    webhook_key_file: Path | None = None
    """PEM private key of the endpoint (HAMI_ACCOUNTING_WEBHOOK_KEY_FILE)."""
    annotation_writers: tuple[str, ...] = DEFAULT_ANNOTATION_WRITERS
    """The user names (``request.userInfo.username``) whose pod UPDATEs may change the
    scheduler-owned annotations (HAMI_ACCOUNTING_ANNOTATION_WRITERS, comma-separated)."""

    @property
    def webhook_enabled(self) -> bool:
        return self.webhook_addr is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AdmissionConfig:
        """Reads the daemon's settings.

        Raises:
            ConfigError: listing every invalid variable.
        """
        problems: list[str] = []
        common, usage_addr = recorder_client_config(env, "admission", problems=problems)
        usage_cache = env_choice(
            env, "USAGE_CACHE", USAGE_CACHE_MODES, USAGE_CACHE_WATCH, problems=problems
        )

        cert = env_path(env, "WEBHOOK_CERT_FILE", problems=problems, must_exist=True)
        key = env_path(env, "WEBHOOK_KEY_FILE", problems=problems, must_exist=True)
        addr_given = bool(env.get(env_name("WEBHOOK_ADDR"), "").strip())
        webhook_addr: str | None = None
        if cert is not None and key is not None:
            webhook_addr = env_addr(env, "WEBHOOK_ADDR", DEFAULT_WEBHOOK_ADDR, problems=problems)
        elif cert is not None or key is not None or addr_given:
            # The API server only calls webhooks over HTTPS: an address without a certificate,
            # or half a certificate, is a manifest mistake, not a reason to serve plaintext.
            missing = [
                env_name(k)
                for k, v in (("WEBHOOK_CERT_FILE", cert), ("WEBHOOK_KEY_FILE", key))
                if v is None
            ]
            problems.append(
                f"{' and '.join(missing)} required for the AdmissionReview endpoint (HTTPS only)"
            )
        writers = _annotation_writers(env, problems)
        raise_if_problems(problems)
        return cls(
            common=common,
            usage_addr=usage_addr,
            usage_cache=usage_cache,
            webhook_addr=webhook_addr,
            webhook_cert_file=cert if webhook_addr else None,
            webhook_key_file=key if webhook_addr else None,
            annotation_writers=writers,
        )


def _annotation_writers(env: Mapping[str, str], problems: list[str]) -> tuple[str, ...]:
    """HAMI_ACCOUNTING_ANNOTATION_WRITERS: comma-separated user names, each without spaces
    (``system:serviceaccount:<namespace>:<name>`` for a service account); unset or empty, the
    defaults."""
    name = env_name("ANNOTATION_WRITERS")
    text = env.get(name, "").strip()
    if not text:
        return DEFAULT_ANNOTATION_WRITERS
    writers = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    bad = [writer for writer in writers if any(c.isspace() for c in writer)]
    if bad or not writers:
        problems.append(
            f"{name} must be comma-separated user names without spaces, got {text[:80]!r}"
        )
    return writers
