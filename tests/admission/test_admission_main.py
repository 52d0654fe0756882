"""AdmissionConfig.from_env, the command line, and the daemon as a process
(``python -m services.admission``): health, a check, a clean stop on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from admission_support import (
    Recorder,
    checker,
    container,
    free_port,
    json_request,
    kube_pod,
    post,
    review,
    wait_until,
)

from services.admission.__main__ import main
from services.admission.config import AdmissionConfig
from services.cli.app import main as cli_main
from services.cli.health import check_health
from services.common.config import ConfigError
from services.common.server import client_channel

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_defaults() -> None:
    config = AdmissionConfig.from_env({})

    assert config.common.listen_addr == "127.0.0.1:50051"
    assert config.common.metrics_addr == "127.0.0.1:9101"
    assert config.usage_addr == "127.0.0.1:50053"
    assert config.usage_cache == "watch"
    assert config.webhook_addr is None and not config.webhook_enabled


def test_every_variable(serving_certificate: tuple[Path, Path]) -> None:
    cert, key = serving_certificate
    config = AdmissionConfig.from_env({
        "HAMI_ACCOUNTING_LISTEN_ADDR": "0.0.0.0:6000",
        "HAMI_ACCOUNTING_USAGE_ADDR": "usage:50053",
        "HAMI_ACCOUNTING_USAGE_CACHE": "off",
        "HAMI_ACCOUNTING_WEBHOOK_CERT_FILE": str(cert),
        "HAMI_ACCOUNTING_WEBHOOK_KEY_FILE": str(key),
    })

    assert config.common.listen_addr == "0.0.0.0:6000"
    assert config.usage_addr == "usage:50053"
    assert config.usage_cache == "off"
    # The webhook listens on its default address once a certificate is configured.
    assert config.webhook_addr == "0.0.0.0:8443"
    assert (config.webhook_cert_file, config.webhook_key_file) == (cert, key)


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        AdmissionConfig.from_env({
            "HAMI_ACCOUNTING_USAGE_ADDR": "no-port",
            "HAMI_ACCOUNTING_MEMORY_FACTOR": "0",
            "HAMI_ACCOUNTING_ENFORCE_GPU_COUNT": "maybe",
            "HAMI_ACCOUNTING_USAGE_CACHE": "redis",
            "HAMI_ACCOUNTING_WEBHOOK_CERT_FILE": str(tmp_path / "missing.pem"),
        })

    text = str(caught.value)
    for name in ("USAGE_ADDR", "MEMORY_FACTOR", "ENFORCE_GPU_COUNT", "USAGE_CACHE",
                 "WEBHOOK_CERT_FILE", "WEBHOOK_KEY_FILE"):
        assert f"HAMI_ACCOUNTING_{name}" in text


@pytest.mark.parametrize("name", ["MEMORY_FACTOR", "ENFORCE_GPU_COUNT"])
def test_the_recorders_policy_settings_are_refused_here(name: str) -> None:
    # The accounting policy is the recorder's: set here it would change nothing, and whoever
    # set it would believe it in force.
    with pytest.raises(ConfigError) as caught:
        AdmissionConfig.from_env({f"HAMI_ACCOUNTING_{name}": "1"})
    assert f"HAMI_ACCOUNTING_{name} is the usage recorder's setting" in str(caught.value)


def test_a_webhook_address_without_a_certificate_is_refused() -> None:
    with pytest.raises(ConfigError, match="HTTPS only"):
        AdmissionConfig.from_env({"HAMI_ACCOUNTING_WEBHOOK_ADDR": "0.0.0.0:8443"})


def test_main_refuses_a_bad_flag_value_with_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--memory-factor", "0", "--metrics", "off"]) == 2
    assert "HAMI_ACCOUNTING_MEMORY_FACTOR" in capsys.readouterr().err


def test_the_cli_serves_admission_through_this_main(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["serve", "admission", "--enforce-gpu-count", "sometimes"]) == 2
    assert "HAMI_ACCOUNTING_ENFORCE_GPU_COUNT" in capsys.readouterr().err


def test_main_rejects_an_unknown_cache_mode() -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--usage-cache", "redis"])
    assert caught.value.code == 2


def test_the_daemon_runs_as_a_module_and_stops_on_sigterm(
    recorder: Recorder, serving_certificate: tuple[Path, Path]
) -> None:
    cert, key = serving_certificate
    port, webhook_port = free_port(), free_port()
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO_ROOT), str(REPO_ROOT / "gen"), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen(
        [sys.executable, "-m", "services.admission", "--listen", f"127.0.0.1:{port}",
         "--usage-addr", recorder.target, "--metrics", "off",
         "--webhook-addr", f"127.0.0.1:{webhook_port}", "--webhook-cert-file", str(cert),
         "--webhook-key-file", str(key)],
        cwd=REPO_ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    target = f"127.0.0.1:{port}"
    try:
        def serving() -> bool:
            try:
                return check_health(target, "hami.accounting.v1.Admission", timeout_s=1) == (
                    "SERVING")
            except Exception:
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
                return False

        wait_until(serving, "the daemon to serve", timeout_s=30)
        assert check_health(target, "liveness") == "SERVING"
        recorder.set_quota("main-ns", mib=24576)
        pod = kube_pod("llm", "main-ns", init=[container("convert-weights", 30720)],
                       apps=[container("server", 4096)])
        with client_channel(target) as channel:
            # Read-your-writes: the check waits until the daemon's cache has the quota.
            response = checker(channel, after=recorder)(json_request(pod))
        assert not response.allowed and response.reason == "MemoryQuotaExceeded"
        answer = post(f"https://127.0.0.1:{webhook_port}/validate", cert, review(pod))
        assert answer.body["response"]["status"]["code"] == 403
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    assert code == 0, process.stderr.read().decode() if process.stderr else ""
