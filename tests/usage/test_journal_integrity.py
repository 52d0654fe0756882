"""A lost or damaged journal never goes unnoticed: every damage issue 15 found, reproduced on real
SQLite files written by a real recorder process killed with SIGKILL, is detected; the recorder
refuses to start with one line and exit code 3; the explicit ways on (accept the loss, rebuild
from Kubernetes, restore a backup) work and say what was lost.

Issue 15 measured, before: the file deleted or truncated to 0, its -wal deleted, truncated or
with a flipped header byte after a SIGKILL: every pod lost; the WAL cut in half: 90 of 196 pods
back; flipped frame bytes: 27 of 195; a changed digit in a stored value: served as is; one
corrupted file: a raw UnicodeDecodeError traceback. All started silently.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from accounting.ledger import Ledger
from hami.accounting.v1 import usage_pb2, usage_pb2_grpc
from services.usage.journal import (
    EXIT_JOURNAL_DAMAGED,
    JOURNAL_FILE_NAME,
    Journal,
    JournalDamagedError,
)
from services.usage.store import UsageStore
from services.usage.watermark import WATERMARK_SUFFIX, read_watermark
from tests.support.fake_apiserver import FakeApiServer
from tests.support.pods import allocation, app_container, kube_pod, to_json
from tests.usage.conftest import RPC_TIMEOUT_S, StartRecorder, free_port
from tests.usage.test_store_k8s import write_kubeconfig

PODS = 196
"""As many pods as issue 15's runs recorded."""
NODE = "node1"
GPU = "GPU-0"
START_TIMEOUT_S = 60.0
WAL_HEADER_BYTES = 32
WAL_FRAME_HEADER_BYTES = 24


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HAMI_ACCOUNTING_", "OTEL_"))}
    env.update({"OTEL_SDK_DISABLED": "true", "PYTHONUNBUFFERED": "1"}, **extra)
    return env


def _pod(number: int) -> bytes:
    return to_json(kube_pod(
        f"p{number}", uid=f"uid-{number:03d}", namespace="team-a", node=NODE,
        apps=[app_container("a", gpumem=100 + number)],
        allocation=allocation([(GPU, 100 + number, 1)]),
    ))


def _wait_serving(channel: grpc.Channel, process: subprocess.Popen[bytes], log: Path) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"recorder exited with {process.returncode}:\n{log.read_text()}")
        try:
            if health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == (
                    health_pb2.HealthCheckResponse.SERVING):
                return
        except grpc.RpcError:
            pass
        time.sleep(0.1)
    pytest.fail(f"recorder not SERVING:\n{log.read_text()}")


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory as a recorder process left it when SIGKILLed after acknowledging PODS
    RecordPods: most of them only in the -wal (never checkpointed)."""
    work = tmp_path_factory.mktemp("killed")
    data_dir, log, port = work / "data", work / "recorder.log", free_port()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.usage", "--listen", f"127.0.0.1:{port}",
             "--data-dir", str(data_dir), "--metrics", "off"],
            env=_env(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            _wait_serving(channel, process, log)
            stub = usage_pb2_grpc.UsageRecorderStub(channel)
            for number in range(PODS):
                answer = stub.RecordPod(usage_pb2.RecordPodRequest(
                    kubernetes_pod_json=_pod(number)), timeout=RPC_TIMEOUT_S)
                assert answer.tracked
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    wal = data_dir / f"{JOURNAL_FILE_NAME}-wal"
    assert wal.stat().st_size > 100_000, "the acknowledged pods should be in the WAL"
    return data_dir


@pytest.fixture
def copy_of(killed: Path, tmp_path: Path) -> Callable[[], Path]:
    def copy() -> Path:
        target = tmp_path / f"data-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(killed, target)
        return target
    return copy


def _journal(data_dir: Path) -> Path:
    return data_dir / JOURNAL_FILE_NAME


def _wal(data_dir: Path) -> Path:
    return data_dir / f"{JOURNAL_FILE_NAME}-wal"


def _frames(data_dir: Path) -> int:
    page_size = int.from_bytes(_wal(data_dir).read_bytes()[8:12], "big")
    frame_bytes = WAL_FRAME_HEADER_BYTES + page_size
    return (_wal(data_dir).stat().st_size - WAL_HEADER_BYTES) // frame_bytes


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def _cut_wal_in_half(data_dir: Path) -> None:
    page_size = int.from_bytes(_wal(data_dir).read_bytes()[8:12], "big")
    keep = WAL_HEADER_BYTES + _frames(data_dir) // 2 * (WAL_FRAME_HEADER_BYTES + page_size)
    os.truncate(_wal(data_dir), keep)


def _flip_a_middle_frame(data_dir: Path) -> None:
    page_size = int.from_bytes(_wal(data_dir).read_bytes()[8:12], "big")
    frame = _frames(data_dir) // 3
    _flip(_wal(data_dir), WAL_HEADER_BYTES + frame * (WAL_FRAME_HEADER_BYTES + page_size)
          + WAL_FRAME_HEADER_BYTES + page_size // 2)


def _change_a_digit(data_dir: Path) -> None:
    """One stored usage value changed by one digit, checkpointed into the main file."""
    with sqlite3.connect(_journal(data_dir)) as db:
        usage = db.execute("SELECT usage FROM pods WHERE uid = 'uid-007'").fetchone()[0]
        db.execute("UPDATE pods SET usage = ? WHERE uid = 'uid-007'",
                   (usage.replace("107", "907"),))


def _backup_without_its_wal(data_dir: Path) -> None:
    """What `cp usage.sqlite3*` restored without the -wal gives: the checkpointed part only."""
    _wal(data_dir).unlink()
    (data_dir / f"{JOURNAL_FILE_NAME}-shm").unlink()


@dataclass(frozen=True)
class Damage:
    name: str
    apply: Callable[[Path], None]
    problem: str
    """Part of the first problem the refusal names."""


DAMAGES = [
    Damage("the file deleted", lambda d: [_journal(d).unlink(), _wal(d).unlink()],
           "its watermark says journal"),
    Damage("the file truncated to 0 bytes", lambda d: [os.truncate(_journal(d), 0),
                                                       _wal(d).unlink()],
           "its watermark says journal"),
    Damage("its -wal deleted after the SIGKILL", lambda d: _wal(d).unlink(),
           "its watermark says journal"),
    Damage("its -wal truncated to 0 after the SIGKILL", lambda d: os.truncate(_wal(d), 0),
           "its watermark says journal"),
    Damage("a flipped byte in the -wal header after the SIGKILL", lambda d: _flip(_wal(d), 20),
           "its watermark says journal"),
    Damage("the -wal cut in half", _cut_wal_in_half, "was acknowledged: the changes after"),
    Damage("flipped bytes in a -wal frame", _flip_a_middle_frame,
           "was acknowledged: the changes after"),
    Damage("a changed digit in a stored usage value", _change_a_digit,
           "1 rows fail their checksum or do not decode (pod uid-007)"),
    Damage("a backup copied without its -wal", _backup_without_its_wal,
           "its watermark says journal"),
    Damage("the watermark deleted", lambda d: (d / f"{JOURNAL_FILE_NAME}{WATERMARK_SUFFIX}")
           .unlink(), "it has no watermark beside it"),
]


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda d: d.name)
def test_every_damage_is_detected_and_the_recorder_refuses_to_start(
    damage: Damage, copy_of: Callable[[], Path]
) -> None:
    pristine = copy_of()
    journal = Journal(_journal(pristine))
    whole = journal.load()
    journal.close()
    assert (whole.damage, len(whole.pods)) == (None, PODS) and whole.revision >= PODS

    data_dir = copy_of()
    damage.apply(data_dir)
    store = UsageStore(Ledger(), Journal(_journal(data_dir)))
    with pytest.raises(JournalDamagedError) as refused:
        store.recover()
    assert damage.problem in refused.value.damage.problems[0], refused.value.damage.problems
    message = str(refused.value)
    assert "\n" not in message and "Refusing to start (exit code 3)" in message


def test_the_daemon_exits_3_with_one_line_and_no_traceback(copy_of: Callable[[], Path]) -> None:
    data_dir = copy_of()
    _cut_wal_in_half(data_dir)
    result = subprocess.run(
        [sys.executable, "-m", "services.cli", "serve", "usage", "--data-dir", str(data_dir),
         "--listen", "127.0.0.1:0", "--metrics", "off"],
        env=_env(), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == EXIT_JOURNAL_DAMAGED == 3, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    errors = [line for line in lines if line["level"] == "ERROR"]
    assert len(errors) == 1, result.stderr
    assert errors[0]["message"].startswith(
        f"cannot start the usage daemon: journal {_journal(data_dir)} is damaged or incomplete: "
        "it reads revision ")
    assert "Traceback" not in result.stderr and "exc_info" not in errors[0]
    # Refusing changed nothing: the same refusal again.
    again = subprocess.run(
        [sys.executable, "-m", "services.cli", "journal", "check", "--data-dir", str(data_dir)],
        env=_env(), capture_output=True, text=True, timeout=60)
    assert again.returncode == 3 and "was acknowledged" in again.stderr, again.stderr


@pytest.mark.parametrize("seed", range(40))
def test_a_corrupted_file_is_one_clear_line_never_a_traceback(
    seed: int, copy_of: Callable[[], Path]
) -> None:
    # Issue 15: one of these once ended in a raw UnicodeDecodeError traceback.
    data_dir = copy_of()
    journal_file = _journal(data_dir)
    with sqlite3.connect(journal_file) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    rng = random.Random(seed)
    data = bytearray(journal_file.read_bytes())
    for _ in range(rng.randint(1, 6)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    journal_file.write_bytes(bytes(data))

    store = UsageStore(Ledger(), Journal(journal_file))
    try:
        summary = store.recover()
    except JournalDamagedError as error:
        assert "\n" not in str(error)
        return
    # Undamaged by the flips (free space, say): then every pod is back, exactly.
    assert summary.pods == PODS


def test_accepting_the_loss_keeps_what_is_readable_logs_what_was_lost_and_goes_on(
    copy_of: Callable[[], Path], start_recorder: StartRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = copy_of()
    _cut_wal_in_half(data_dir)
    with caplog.at_level("ERROR"):
        recorder = start_recorder(data_dir, journal_on_damage="accept-loss")
    records = [r for r in caplog.records if r.getMessage().startswith("journal damaged")]
    assert len(records) == 1
    lost = records[0]
    kept = len(recorder.app.store.pods())
    assert 0 < kept < PODS
    acknowledged = read_watermark(_journal(copy_of()))
    assert acknowledged is not None
    first_lost, last_lost = lost.lost_revisions.split("..")  # type: ignore[attr-defined]
    assert int(first_lost) <= kept + 2 and int(last_lost) == acknowledged.revision
    # Revisions go on past everything acknowledged before the loss.
    assert recorder.app.store.revision >= acknowledged.revision
    answer = recorder.stub.RecordPod(usage_pb2.RecordPodRequest(
        kubernetes_pod_json=_pod(PODS + 1)), timeout=RPC_TIMEOUT_S)
    assert answer.tracked and answer.revision > acknowledged.revision
    recorder.stop()
    # The next start finds a whole journal again.
    again = start_recorder(data_dir)
    assert len(again.app.store.pods()) == kept + 1


def test_accepting_the_loss_of_damaged_rows_drops_and_names_them(
    copy_of: Callable[[], Path], start_recorder: StartRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = copy_of()
    _change_a_digit(data_dir)
    with caplog.at_level("ERROR"):
        recorder = start_recorder(data_dir, journal_on_damage="accept-loss")
    (lost,) = [r for r in caplog.records if r.getMessage().startswith("journal damaged")]
    assert lost.dropped_rows == ["pod uid-007"]  # type: ignore[attr-defined]
    uids = {pod.uid for pod in recorder.app.store.pods()}
    assert len(uids) == PODS - 1 and "uid-007" not in uids
    # What is served is what was written, never the changed digit.
    assert all(not any(u.memory_mib == 907 for u in pod.usage)
               for pod in recorder.app.store.pods())


def test_rebuilding_from_kubernetes_sets_the_journal_aside_and_lists_the_cluster(
    copy_of: Callable[[], Path], start_recorder: StartRecorder, tmp_path: Path
) -> None:
    data_dir = copy_of()
    _wal(data_dir).unlink()
    with FakeApiServer() as apiserver:
        for number in (1, 2, 3):
            apiserver.add("pods", json.loads(_pod(number)))
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)
        recorder = start_recorder(data_dir, journal_on_damage="rebuild-from-kubernetes",
                                  kubernetes="kubeconfig", kubeconfig=kubeconfig)
        deadline = time.monotonic() + 30
        while len(recorder.app.store.pods()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(p.uid for p in recorder.app.store.pods()) == [
            "uid-001", "uid-002", "uid-003"]
        assert recorder.app.store.revision > PODS
    (set_aside,) = [p for p in data_dir.iterdir() if ".damaged-" in p.name]
    assert set_aside.name.startswith(f"{JOURNAL_FILE_NAME}.damaged-") and set_aside.is_dir()
    # What was set aside is a data directory of its own, as damaged as it was found.
    assert {p.name for p in set_aside.iterdir()} >= {
        JOURNAL_FILE_NAME, f"{JOURNAL_FILE_NAME}{WATERMARK_SUFFIX}"}
    checked = subprocess.run(
        [sys.executable, "-m", "services.cli", "journal", "check", "--data-dir", str(set_aside)],
        env=_env(), capture_output=True, text=True, timeout=60)
    assert checked.returncode == 3 and "acknowledged revision" in checked.stderr, checked


def test_backup_while_writing_and_restore_bring_back_exactly_what_was_acknowledged(
    start_recorder: StartRecorder, tmp_path: Path
) -> None:
    data_dir = tmp_path / "live"
    recorder = start_recorder(data_dir)
    for number in range(50):
        recorder.stub.RecordPod(usage_pb2.RecordPodRequest(kubernetes_pod_json=_pod(number)),
                                timeout=RPC_TIMEOUT_S)
    backup = tmp_path / "backup.sqlite3"
    tool = [sys.executable, "-m", "services.cli", "journal"]
    made = subprocess.run([*tool, "backup", "--data-dir", str(data_dir), "--to", str(backup)],
                          env=_env(), capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert ": 50 pods, 0 nodes" in made.stdout
    before = sorted((p.uid, p.usage) for p in recorder.app.store.pods())
    # Written after the backup: gone once the backup is restored.
    recorder.stub.RecordPod(usage_pb2.RecordPodRequest(kubernetes_pod_json=_pod(99)),
                            timeout=RPC_TIMEOUT_S)

    refused = subprocess.run([*tool, "restore", "--data-dir", str(data_dir), "--from",
                              str(backup)], env=_env(), capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 4 and "in use by another process" in refused.stderr
    recorder.stop()

    restored = subprocess.run([*tool, "restore", "--data-dir", str(data_dir), "--from",
                               str(backup)], env=_env(), capture_output=True, text=True,
                              timeout=60)
    assert restored.returncode == 0, restored.stderr
    assert "previous files are kept in usage.sqlite3.replaced-" in restored.stdout
    checked = subprocess.run([*tool, "check", "--data-dir", str(data_dir)], env=_env(),
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0 and ": 50 pods, 0 nodes" in checked.stdout
    again = start_recorder(data_dir)
    assert sorted((p.uid, p.usage) for p in again.app.store.pods()) == before


def test_a_damaged_backup_is_refused_by_restore(
    tmp_path: Path, copy_of: Callable[[], Path]
) -> None:
    data_dir = copy_of()
    _change_a_digit(data_dir)
    with sqlite3.connect(_journal(data_dir)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    (tmp_path / "target").mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "services.cli", "journal", "restore", "--data-dir",
         str(tmp_path / "target"), "--from", str(_journal(data_dir))],
        env=_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 3
    assert "1 rows fail their checksum or do not decode (pod uid-007)" in result.stderr
    assert list((tmp_path / "target").iterdir()) == []


def test_closing_twice_releases_the_directory_once_and_leaves_other_files_alone(
    tmp_path: Path,
) -> None:
    journal = Journal.in_data_dir(tmp_path, lock=True)
    journal.close()
    # The watermark's descriptor number is free now: a file opened meanwhile may get it.
    other = os.open(tmp_path / "unrelated", os.O_CREAT | os.O_RDWR)
    try:
        journal.close()
        os.fstat(other)  # still open: the second close closed nothing
        reopened = Journal.in_data_dir(tmp_path, lock=True)  # the lock was released
        reopened.close()
    finally:
        os.close(other)
