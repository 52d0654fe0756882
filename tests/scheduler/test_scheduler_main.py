"""SchedulerConfig.from_env, the command line, and the daemon as a process
(``python -m services.scheduler``): health, a Filter, a clean stop on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import services.common.daemon
import services.scheduler.__main__ as scheduler_main
from hami.accounting.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.cli.app import main as cli_main
from services.cli.health import check_health
from services.common.config import ConfigError
from services.common.server import ServerStartError, client_channel
from services.scheduler.__main__ import main
from services.scheduler.config import SchedulerConfig
from tests.scheduler.conftest import NS, Recorder, free_port
from tests.support.pods import app_container, gpu_device, init_container, kube_pod, to_json

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_defaults() -> None:
    config = SchedulerConfig.from_env({})

    assert config.common.listen_addr == "127.0.0.1:50052"
    assert config.common.metrics_addr == "127.0.0.1:9102"
    assert config.usage_addr == "127.0.0.1:50053"
    assert (config.node_policy, config.gpu_policy) == ("binpack", "spread")
    assert config.reserve_attempts == 3
    assert config.usage_timeout_s == 2.0
    assert config.node_cache == "watch"


def test_every_variable() -> None:
    config = SchedulerConfig.from_env({
        "HAMI_ACCOUNTING_LISTEN_ADDR": "0.0.0.0:6002",
        "HAMI_ACCOUNTING_METRICS_ADDR": "off",
        "HAMI_ACCOUNTING_USAGE_ADDR": "usage:50053",
        "HAMI_ACCOUNTING_NODE_SCHEDULER_POLICY": "Spread",
        "HAMI_ACCOUNTING_GPU_SCHEDULER_POLICY": "BINPACK",
        "HAMI_ACCOUNTING_RESERVE_ATTEMPTS": "5",
        "HAMI_ACCOUNTING_USAGE_TIMEOUT_MS": "750",
        "HAMI_ACCOUNTING_NODE_CACHE": "OFF",
    })

    assert config.common.listen_addr == "0.0.0.0:6002"
    assert config.common.metrics_addr is None
    assert config.usage_addr == "usage:50053"
    assert (config.node_policy, config.gpu_policy) == ("spread", "binpack")
    assert config.reserve_attempts == 5
    assert config.usage_timeout_s == 0.75
    assert config.node_cache == "off"


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        SchedulerConfig.from_env({
            "HAMI_ACCOUNTING_USAGE_ADDR": "no-port",
            "HAMI_ACCOUNTING_NODE_SCHEDULER_POLICY": "mutex",
            "HAMI_ACCOUNTING_GPU_SCHEDULER_POLICY": "topology",
            "HAMI_ACCOUNTING_MEMORY_FACTOR": "0",
            "HAMI_ACCOUNTING_RESERVE_ATTEMPTS": "0",
            "HAMI_ACCOUNTING_USAGE_TIMEOUT_MS": "soon",
            "HAMI_ACCOUNTING_NODE_CACHE": "sometimes",
        })

    text = str(caught.value)
    for name in ("USAGE_ADDR", "NODE_SCHEDULER_POLICY", "GPU_SCHEDULER_POLICY", "MEMORY_FACTOR",
                 "RESERVE_ATTEMPTS", "USAGE_TIMEOUT_MS", "NODE_CACHE"):
        assert f"HAMI_ACCOUNTING_{name}" in text
    assert "must be one of binpack, spread, got 'mutex'" in text
    assert "must be one of off, watch, got 'sometimes'" in text


def test_flags_map_one_to_one_to_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[SchedulerConfig] = []

    def fake_start(config: SchedulerConfig, **_: Any) -> None:
        seen.append(config)
        raise ServerStartError("not started in this test")

    monkeypatch.setattr(scheduler_main, "start", fake_start)
    # Keep this process's logging as it was (main installs the JSON handler).
    levels: list[str] = []
    monkeypatch.setattr(services.common.daemon, "configure_logging",
                        lambda _service, level: levels.append(level))
    code = main([
        "--listen", "127.0.0.1:7002", "--usage-addr", "10.0.0.1:50053", "--metrics", "off",
        "--node-policy", "spread", "--gpu-policy", "binpack",
        "--reserve-attempts", "4", "--usage-timeout-ms", "500", "--log-level", "warning",
        "--node-cache", "off",
    ])

    assert code == 1
    [config] = seen
    assert config.common.listen_addr == "127.0.0.1:7002"
    assert config.usage_addr == "10.0.0.1:50053"
    assert config.common.metrics_addr is None
    assert (config.node_policy, config.gpu_policy) == ("spread", "binpack")
    assert (config.reserve_attempts, config.usage_timeout_ms) == (4, 500)
    assert config.node_cache == "off"
    assert config.common.log_level == levels[0] == "WARNING"


def test_main_refuses_a_bad_value_with_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--reserve-attempts", "0", "--metrics", "off"]) == 2
    assert "HAMI_ACCOUNTING_RESERVE_ATTEMPTS" in capsys.readouterr().err


def test_main_rejects_an_unknown_policy() -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--node-policy", "mutex"])
    assert caught.value.code == 2


def test_the_cli_serves_the_scheduler_through_this_main(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli_main(["serve", "scheduler", "--memory-factor", "0", "--metrics", "off"]) == 2
    assert "HAMI_ACCOUNTING_MEMORY_FACTOR" in capsys.readouterr().err


def test_the_daemon_runs_as_a_module_and_stops_on_sigterm(recorder: Recorder) -> None:
    recorder.register_node("node1", [gpu_device("GPU-0")])
    port = free_port()
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO_ROOT), str(REPO_ROOT / "gen"), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen(
        [sys.executable, "-m", "services.scheduler", "--listen", f"127.0.0.1:{port}",
         "--usage-addr", recorder.target, "--metrics", "off"],
        cwd=REPO_ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    target = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            try:
                if check_health(target, "hami.accounting.v1.Scheduler", timeout_s=1) == "SERVING":
                    break
            except Exception:
                pass
            assert time.monotonic() < deadline, "the scheduler did not serve within 30 s"
            time.sleep(0.1)
        assert check_health(target, "liveness") == "SERVING"
        pod = kube_pod("trainer", namespace=NS,
                       init=[init_container("convert-weights", gpumem=20480)],
                       apps=[app_container("server", gpumem=10240)])
        with client_channel(target) as channel:
            response = scheduler_pb2_grpc.SchedulerStub(channel).Filter(
                scheduler_pb2.FilterRequest(kubernetes_pod_json=to_json(pod),
                                            node_names=["node1"]),
                timeout=10,
            )
        assert response.reason == "Scheduled"
        assert response.annotations["hami.io/vgpu-devices-allocated"] == (
            "GPU-0,NVIDIA,20480,0:;GPU-0,NVIDIA,10240,0:;"
        )
        unix_s = int(response.annotations["hami.io/vgpu-time"])
        assert abs(unix_s - time.time()) < 60
        assert recorder.node_memory("node1") == 20480
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    assert code == 0, process.stderr.read().decode() if process.stderr else ""
