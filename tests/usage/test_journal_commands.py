"""The journal commands never destroy the journal: an operator who mistypes a path gets one line
and an exit code, and every file stays as it was.

Seen before (each reproduced against a running recorder): ``journal backup --to`` the journal,
its ``-wal`` or its watermark exited 0, and after the next restart ``--accept-journal-loss``
kept 0 of 400 acknowledged pods (the ``-wal`` replaced by a database file, then a SIGKILL);
a watermark with bytes after its line was never repaired, so every plain start refused again;
``journal restore --from`` the journal itself moved the live files aside and then failed,
leaving no journal; a second restore in the same second overwrote the copy the first one kept;
``backup --to`` an unrelated file replaced it; every backup left ``.partial-shm`` and
``.partial-wal`` beside it and every restore ``FILE-shm`` and ``FILE-wal`` beside the backup;
``journal check`` on a mistyped data directory exited 3, the exit code of real damage.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.accounting.v1 import usage_pb2, usage_pb2_grpc
from services.cli import journal as journal_tool
from services.usage import journal_files
from services.usage.journal import JOURNAL_FILE_NAME, JournalDamagedError
from services.usage.journal_files import keep_aside
from services.usage.watermark import WATERMARK_SUFFIX, Mark, Watermark, WatermarkError
from tests.usage.conftest import RPC_TIMEOUT_S, RunningRecorder, StartRecorder, free_port
from tests.usage.test_journal_integrity import _env, _pod, _wait_serving

WAL = f"{JOURNAL_FILE_NAME}-wal"
SHM = f"{JOURNAL_FILE_NAME}-shm"
WATERMARK = f"{JOURNAL_FILE_NAME}{WATERMARK_SUFFIX}"
PODS = 60
TOOL = (sys.executable, "-m", "services.cli", "journal")


# -- helpers -----------------------------------------------------------------------------------


def _tree(directory: Path) -> dict[str, object]:
    """Every entry under ``directory``: a file's inode and content hash, a link's target, a
    directory's mark; what "changes nothing" is checked against."""
    found: dict[str, object] = {}
    for path in sorted(directory.rglob("*")):
        name = str(path.relative_to(directory))
        if path.is_symlink():
            found[name] = ("link", os.readlink(path))
        elif path.is_dir():
            found[name] = "dir"
        elif not path.is_file():
            found[name] = ("special", path.stat().st_mode)
        else:
            found[name] = (path.stat().st_ino, hashlib.sha256(path.read_bytes()).hexdigest())
    return found


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str


def _command(*args: str | Path, cwd: Path | None = None) -> Outcome:
    """The real `hami-accounting journal` command, in its own process."""
    result = subprocess.run([*TOOL, *map(str, args)], env=_env(), capture_output=True,
                            text=True, timeout=120, cwd=cwd)
    return Outcome(result.returncode, result.stdout, result.stderr)


def _in_process(capsys: pytest.CaptureFixture[str], *args: str | Path) -> Outcome:
    """The same command's main() in this process (the tables run many of them)."""
    capsys.readouterr()
    code = journal_tool.main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return Outcome(code, captured.out, captured.err)


def _one_line_error(outcome: Outcome, command: str, part: str) -> None:
    assert outcome.out == "", outcome
    lines = outcome.err.splitlines()
    assert len(lines) == 1, outcome.err
    assert lines[0].startswith(f"hami-accounting journal {command}: "), lines[0]
    assert part in lines[0], lines[0]


def _record(stub: usage_pb2_grpc.UsageRecorderStub, numbers: range) -> None:
    for number in numbers:
        answer = stub.RecordPod(usage_pb2.RecordPodRequest(kubernetes_pod_json=_pod(number)),
                                timeout=RPC_TIMEOUT_S)
        assert answer.tracked


def _uids(recorder: RunningRecorder) -> list[str]:
    return sorted(pod.uid for pod in recorder.app.store.pods())


@contextmanager
def _recorder_process(data_dir: Path, log: Path) -> Iterator[usage_pb2_grpc.UsageRecorderStub]:
    """A recorder in its own process, SIGKILLed at the end (what a crash leaves)."""
    port = free_port()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.usage", "--listen", f"127.0.0.1:{port}",
             "--data-dir", str(data_dir), "--metrics", "off"],
            env=_env(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            _wait_serving(channel, process, log)
            yield usage_pb2_grpc.UsageRecorderStub(channel)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)


@pytest.fixture
def live(start_recorder: StartRecorder, tmp_path: Path) -> RunningRecorder:
    """A running recorder (it holds its data directory) with PODS pods acknowledged."""
    recorder = start_recorder(tmp_path / "data")
    _record(recorder.stub, range(PODS))
    return recorder


def _backup_of(recorder: RunningRecorder, target: Path) -> Path:
    made = _command("backup", "--data-dir", recorder.data_dir, "--to", target)
    assert made.code == 0, made
    return target


# -- backup: the live journal is never a target ------------------------------------------------


def test_a_backup_aimed_at_the_live_journal_is_refused_and_nothing_acknowledged_is_lost(
    tmp_path: Path, start_recorder: StartRecorder
) -> None:
    data_dir = tmp_path / "data"
    (tmp_path / "alias").symlink_to(data_dir)
    with _recorder_process(data_dir, tmp_path / "recorder.log") as stub:
        _record(stub, range(200))
        before = _tree(data_dir)
        for target, cwd in [
            (data_dir / JOURNAL_FILE_NAME, None), (data_dir / WAL, None), (data_dir / SHM, None),
            (data_dir / WATERMARK, None), (Path(WAL), data_dir),
            (tmp_path / "alias" / ".." / "data" / "." / JOURNAL_FILE_NAME, None),
        ]:
            refused = _command("backup", "--data-dir", data_dir, "--to", target, cwd=cwd)
            assert refused.code == 4, refused
            _one_line_error(refused, "backup", "is the live journal's")
        assert _tree(data_dir) == before
        # Acknowledged after the refusals, then a crash: the journal still holds every pod.
        _record(stub, range(200, 400))
    checked = _command("check", "--data-dir", data_dir)
    assert checked.code == 0 and ": 400 pods," in checked.out, checked
    again = start_recorder(data_dir)
    assert len(_uids(again)) == 400


@dataclass(frozen=True)
class Given:
    """A path an operator may type (``backup --to``, ``restore --from``), and what the command
    must answer."""

    name: str
    path: Callable[[Path, Path], Path]
    """(data directory, a scratch directory) -> the path given."""
    code: int
    says: str
    replace: bool = False
    cwd_in_data_dir: bool = False


def _hard_link(to: str) -> Callable[[Path, Path], Path]:
    def make(data_dir: Path, scratch: Path) -> Path:
        os.link(data_dir / to, scratch / "linked.sqlite3")
        return scratch / "linked.sqlite3"
    return make


def _symlink(to: str) -> Callable[[Path, Path], Path]:
    def make(data_dir: Path, scratch: Path) -> Path:
        (scratch / "pointer").symlink_to(data_dir / to)
        return scratch / "pointer"
    return make


def _made(content: bytes, *, mode: int = 0o644) -> Callable[[Path, Path], Path]:
    def make(data_dir: Path, scratch: Path) -> Path:
        path = scratch / "existing.sqlite3"
        path.write_bytes(content)
        path.chmod(mode)
        return path
    return make


def _a_journal_backup(*, mode: int = 0o644) -> Callable[[Path, Path], Path]:
    def make(data_dir: Path, scratch: Path) -> Path:
        path = scratch / "old-backup.sqlite3"
        with sqlite3.connect(f"file:{data_dir / JOURNAL_FILE_NAME}?mode=ro", uri=True) as src, \
                sqlite3.connect(path) as dst:
            src.backup(dst)
            dst.execute("PRAGMA journal_mode=DELETE")
        path.chmod(mode)
        return path
    return make


def _other_data_dir(data_dir: Path, scratch: Path) -> Path:
    other = scratch / "other-data"
    shutil.copytree(data_dir, other, ignore=shutil.ignore_patterns("*-shm"))
    return other / JOURNAL_FILE_NAME


def _under_a_file(data_dir: Path, scratch: Path) -> Path:
    (scratch / "a-file").write_text("x")
    return scratch / "a-file" / "backup.sqlite3"


TARGETS = [
    Given("the journal", lambda d, s: d / JOURNAL_FILE_NAME, 4, "is the live journal's "
          "usage.sqlite3"),
    Given("its -wal", lambda d, s: d / WAL, 4, "is the live journal's usage.sqlite3-wal"),
    Given("its -shm", lambda d, s: d / SHM, 4, "is the live journal's usage.sqlite3-shm"),
    Given("its watermark", lambda d, s: d / WATERMARK, 4, "is the live journal's "
          "usage.sqlite3.watermark"),
    Given("its rollback journal (not there yet)", lambda d, s: d / f"{JOURNAL_FILE_NAME}"
          "-journal", 4, "is the live journal's usage.sqlite3-journal"),
    Given("the journal, relative from inside the data directory",
          lambda d, s: Path(JOURNAL_FILE_NAME), 4, "is the live journal's",
          cwd_in_data_dir=True),
    Given("the -wal through .. and .", lambda d, s: d / ".." / d.name / "." / WAL, 4,
          "is the live journal's usage.sqlite3-wal"),
    Given("a symbolic link to the journal", _symlink(JOURNAL_FILE_NAME), 4,
          "is the live journal's usage.sqlite3"),
    Given("a symbolic link to the -wal, with --replace", _symlink(WAL), 4,
          "is the live journal's usage.sqlite3-wal", replace=True),
    Given("a hard link to the journal, with --replace", _hard_link(JOURNAL_FILE_NAME), 4,
          "is the live journal's usage.sqlite3", replace=True),
    Given("a hard link to the watermark", _hard_link(WATERMARK), 4,
          "is the live journal's usage.sqlite3.watermark"),
    Given("a name the journal keeps (a copy set aside)",
          lambda d, s: d / f"{JOURNAL_FILE_NAME}.replaced-20260101T000000Z", 4,
          "belong to the journal"),
    Given("a new name starting with the journal's", lambda d, s: d / "usage.sqlite3.bak", 4,
          "belong to the journal"),
    Given("the data directory itself", lambda d, s: d, 2, "is a directory; name the backup"),
    Given("another directory", lambda d, s: s, 2, "is a directory; name the backup"),
    Given("a file in a directory that does not exist", lambda d, s: s / "nope" / "b.sqlite3",
          2, "nope does not exist"),
    Given("a file under a regular file", _under_a_file, 2, "a-file is not a directory"),
    Given("an unrelated file", _made(b"my notes\n"), 4, "exists; pass --replace"),
    Given("an unrelated file, with --replace", _made(b"my notes\n"), 4,
          "is not a journal backup; it is never replaced", replace=True),
    Given("an empty file, with --replace", _made(b""), 4, "is not a journal backup",
          replace=True),
    Given("an earlier backup, without --replace", _a_journal_backup(), 4,
          "exists; pass --replace"),
    Given("a write-protected backup, with --replace", _a_journal_backup(mode=0o444), 4,
          "is write-protected (mode 0444)", replace=True),
    Given("another data directory's journal, with --replace", _other_data_dir, 4,
          "is a recorder's journal", replace=True),
    Given("a device, with --replace", lambda d, s: Path("/dev/null"), 4,
          "/dev/null is not a regular file; not replaced", replace=True),
    Given("a directory where no file can be created", lambda d, s: Path("/sys/backup.sqlite3"),
          1, "cannot write in /sys: Permission denied"),
]


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_every_backup_target_that_would_lose_something_is_refused_with_one_line(
    target: Given, live: RunningRecorder, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    given = target.path(live.data_dir, scratch)
    if target.cwd_in_data_dir:
        monkeypatch.chdir(live.data_dir)
    data_before, scratch_before = _tree(live.data_dir), _tree(scratch)
    args: list[str | Path] = ["backup", "--data-dir", live.data_dir, "--to", given]
    outcome = _in_process(capsys, *args, *(["--replace"] if target.replace else []))
    assert outcome.code == target.code, outcome
    _one_line_error(outcome, "backup", target.says)
    assert _tree(live.data_dir) == data_before
    assert _tree(scratch) == scratch_before
    # The recorder goes on: the refusal took nothing from it.
    _record(live.stub, range(PODS, PODS + 1))
    assert len(_uids(live)) == PODS + 1


_LIVE_NAMES = st.sampled_from([JOURNAL_FILE_NAME, WAL, SHM, WATERMARK])
_STARTS = st.sampled_from(["absolute", "relative", "alias", "relative alias"])
_DETOURS = st.lists(st.sampled_from([".", "sub/..", "../data", "sub/../../data/."]), max_size=4)
"""Ways back to the same directory (the live recorder's is ``data``)."""


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=_LIVE_NAMES, start=_STARTS, detours=_DETOURS)
def test_however_a_live_file_is_spelled_the_backup_is_refused(
    name: str, start: str, detours: list[str], live: RunningRecorder, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    data_dir = live.data_dir
    assert data_dir.name == "data"
    (data_dir / "sub").mkdir(exist_ok=True)
    alias = tmp_path / "alias"
    if not alias.is_symlink():
        alias.symlink_to(data_dir)
    monkeypatch.chdir(tmp_path)
    directory = {"absolute": data_dir, "relative": Path("data"), "alias": alias,
                 "relative alias": Path("alias")}[start]
    path = directory.joinpath(*detours, name)
    before = _tree(data_dir)
    outcome = _in_process(capsys, "backup", "--data-dir", data_dir, "--to", path)
    assert outcome.code == 4, (path, outcome)
    _one_line_error(outcome, "backup", f"is the live journal's {name}")
    assert _tree(data_dir) == before


# -- backup: what it writes --------------------------------------------------------------------


def test_a_backup_is_one_self_contained_file_with_nothing_left_beside_it(
    live: RunningRecorder, tmp_path: Path
) -> None:
    backups = tmp_path / "backups"
    backups.mkdir()
    (backups / "unrelated.txt").write_text("kept")
    target = _backup_of(live, backups / "usage-backup.sqlite3")
    assert sorted(p.name for p in backups.iterdir()) == ["unrelated.txt", "usage-backup.sqlite3"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o600, "it holds what the journal holds"
    header = target.read_bytes()[:20]
    assert header[18:20] == b"\x01\x01", "a rollback-journal file: it needs no -wal"
    # Reading it leaves nothing beside it either (a restore reads it).
    restored = tmp_path / "restored"
    restored.mkdir()
    assert _command("restore", "--data-dir", restored, "--from", target).code == 0
    assert sorted(p.name for p in backups.iterdir()) == ["unrelated.txt", "usage-backup.sqlite3"]


def test_a_backup_beside_the_journal_under_another_name_works_and_harms_nothing(
    live: RunningRecorder, start_recorder: StartRecorder
) -> None:
    # The docs' Kubernetes example writes into the data directory, the pod's only volume.
    target = _backup_of(live, live.data_dir / "backup.sqlite3")
    _record(live.stub, range(PODS, PODS + 5))
    live.stop()
    assert len(_uids(start_recorder(live.data_dir))) == PODS + 5
    assert ".backup.sqlite3.partial" not in {p.name for p in live.data_dir.iterdir()}
    assert target.exists()


def test_replace_takes_an_earlier_backup_and_nothing_else(
    live: RunningRecorder, tmp_path: Path
) -> None:
    target = _backup_of(live, tmp_path / "daily.sqlite3")
    first = target.read_bytes()
    again = _command("backup", "--data-dir", live.data_dir, "--to", target)
    assert again.code == 4 and target.read_bytes() == first, again
    _record(live.stub, range(PODS, PODS + 3))
    replaced = _command("backup", "--data-dir", live.data_dir, "--to", target, "--replace")
    assert replaced.code == 0 and f": {PODS + 3} pods," in replaced.out, replaced
    assert sorted(p.name for p in tmp_path.iterdir() if "daily" in p.name) == ["daily.sqlite3"]


# -- restore: a failed restore changes nothing -------------------------------------------------


def _damaged_backup(data_dir: Path, scratch: Path) -> Path:
    path = _a_journal_backup()(data_dir, scratch)
    with sqlite3.connect(path) as db:
        usage = db.execute("SELECT usage FROM pods WHERE uid = 'uid-007'").fetchone()[0]
        db.execute("UPDATE pods SET usage = ? WHERE uid = 'uid-007'",
                   (usage.replace("107", "907"),))
    return path


def _fifo(data_dir: Path, scratch: Path) -> Path:
    os.mkfifo(scratch / "pipe")
    return scratch / "pipe"


def _an_open_journal(data_dir: Path, scratch: Path) -> Path:
    """A copy of a data directory taken while the recorder wrote: its -wal holds changes."""
    other = scratch / "copied-live"
    shutil.copytree(data_dir, other)
    assert (other / WAL).stat().st_size > 0
    return other / JOURNAL_FILE_NAME


SOURCES = [
    Given("the journal itself", lambda d, s: d / JOURNAL_FILE_NAME, 4,
          "is the live journal's usage.sqlite3"),
    Given("the journal through a symbolic link", _symlink(JOURNAL_FILE_NAME), 4,
          "is the live journal's usage.sqlite3"),
    Given("a hard link to the journal", _hard_link(JOURNAL_FILE_NAME), 4,
          "is the live journal's usage.sqlite3"),
    Given("its watermark", lambda d, s: d / WATERMARK, 4,
          "is the live journal's usage.sqlite3.watermark"),
    Given("a damaged backup", _damaged_backup, 3,
          "1 rows fail their checksum or do not decode (pod uid-007)"),
    Given("a journal copied with changes in its -wal", _an_open_journal, 4,
          "has changes in usage.sqlite3-wal beside it"),
    Given("an unrelated file", _made(b"my notes\n"), 3, "SQLite cannot read it"),
    Given("a file that does not exist", lambda d, s: s / "nope.sqlite3", 2, "does not exist"),
    Given("a directory", lambda d, s: s, 2, "is a directory"),
    Given("a named pipe", _fifo, 2, "is not a regular file"),
]


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s.name)
def test_a_refused_restore_changes_nothing_in_the_data_directory_or_beside_the_backup(
    source: Given, start_recorder: StartRecorder, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    recorder = start_recorder(tmp_path / "data")
    _record(recorder.stub, range(PODS))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    given = source.path(recorder.data_dir, scratch)
    recorder.stop()
    data_before, scratch_before = _tree(recorder.data_dir), _tree(scratch)
    outcome = _in_process(capsys, "restore", "--data-dir", recorder.data_dir, "--from", given)
    assert outcome.code == source.code, outcome
    assert outcome.out == "" and source.says in outcome.err.splitlines()[0], outcome
    assert outcome.err.startswith("hami-accounting journal restore: ")
    assert _tree(recorder.data_dir) == data_before
    assert _tree(scratch) == scratch_before
    assert len(_uids(start_recorder(recorder.data_dir))) == PODS


def test_a_restore_into_a_fresh_directory_that_fails_leaves_it_empty(
    live: RunningRecorder, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged = _damaged_backup(live.data_dir, tmp_path)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    outcome = _in_process(capsys, "restore", "--data-dir", fresh, "--from", damaged)
    assert outcome.code == 3 and list(fresh.iterdir()) == []
    missing = _in_process(capsys, "restore", "--data-dir", tmp_path / "typo", "--from", damaged)
    assert missing.code == 2 and not (tmp_path / "typo").exists()
    _one_line_error(missing, "restore", f"--data-dir {tmp_path / 'typo'} does not exist")


def test_a_restore_that_fails_during_the_swap_puts_everything_back(
    live: RunningRecorder, tmp_path: Path, start_recorder: StartRecorder,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    backup = _backup_of(live, tmp_path / "backup.sqlite3")
    _record(live.stub, range(PODS, PODS + 10))
    live.stop()
    before = _tree(live.data_dir)

    def fail(self: Watermark, journal_id: int, revision: int, *, sync: bool = False) -> None:
        raise WatermarkError(f"cannot write the journal watermark {self.path}: disk on fire")

    monkeypatch.setattr(Watermark, "write", fail)
    outcome = _in_process(capsys, "restore", "--data-dir", live.data_dir, "--from", backup)
    monkeypatch.undo()
    assert outcome.code == 1, outcome
    _one_line_error(outcome, "restore", "disk on fire")
    assert _tree(live.data_dir) == before
    assert len(_uids(start_recorder(live.data_dir))) == PODS + 10


def test_a_swap_that_cannot_move_a_file_is_undone(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    journal = tmp_path / JOURNAL_FILE_NAME
    for name, content in [(JOURNAL_FILE_NAME, b"old"), (WAL, b"frames"), (SHM, b"index"),
                          (WATERMARK, b"mark")]:
        (tmp_path / name).write_bytes(content)
    replacement = tmp_path / ".new"
    replacement.write_bytes(b"new")
    before = _tree(tmp_path)
    real_replace = os.replace

    def refuse_the_last_step(source: str | Path, target: str | Path) -> None:
        if Path(source) == replacement:
            raise OSError(5, "Input/output error")
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", refuse_the_last_step)
    with pytest.raises(OSError, match="Input/output error"):
        keep_aside(journal, "replaced", replacement=replacement)
    monkeypatch.undo()
    assert _tree(tmp_path) == before


def test_where_hard_links_are_refused_backup_and_restore_rename_instead(
    live: RunningRecorder, tmp_path: Path, start_recorder: StartRecorder,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_links(source: str | Path, target: str | Path) -> None:
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    made = _in_process(capsys, "backup", "--data-dir", live.data_dir, "--to",
                       tmp_path / "b.sqlite3")
    assert made.code == 0, made
    again = _in_process(capsys, "backup", "--data-dir", live.data_dir, "--to",
                        tmp_path / "b.sqlite3")
    assert again.code == 4 and "exists; pass --replace" in again.err
    _record(live.stub, range(PODS, PODS + 4))
    live.stop()
    restored = _in_process(capsys, "restore", "--data-dir", live.data_dir, "--from",
                           tmp_path / "b.sqlite3")
    assert restored.code == 0, restored
    monkeypatch.undo()
    (kept,) = [p for p in live.data_dir.iterdir() if ".replaced-" in p.name]
    assert _command("check", "--data-dir", kept).out.count(f": {PODS + 4} pods,") == 1
    assert len(_uids(start_recorder(live.data_dir))) == PODS


def test_restores_in_the_same_second_each_keep_their_own_whole_copy(
    live: RunningRecorder, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = _backup_of(live, tmp_path / "first.sqlite3")
    _record(live.stub, range(PODS, PODS + 7))
    live.stop()
    monkeypatch.setattr(journal_files, "utc_stamp", lambda: "20261201T120000Z")
    outcomes = [_in_process(capsys, "restore", "--data-dir", live.data_dir, "--from", first)
                for _ in range(3)]
    assert [o.code for o in outcomes] == [0, 0, 0], outcomes
    kept = sorted(p.name for p in live.data_dir.iterdir() if ".replaced-" in p.name)
    base = f"{JOURNAL_FILE_NAME}.replaced-20261201T120000Z"
    assert kept == [base, f"{base}-2", f"{base}-3"]
    assert f"kept in {base}-3/" in outcomes[2].out
    assert {stat.S_IMODE((live.data_dir / name).stat().st_mode) for name in kept} == {0o700}
    # Each kept copy is a data directory of its own, with the journal it replaced.
    pods_kept = []
    for name in kept:
        checked = _command("check", "--data-dir", live.data_dir / name)
        assert checked.code == 0, checked
        pods_kept.append(checked.out.split(": ")[-1].split(" pods")[0])
    assert pods_kept == [str(PODS + 7), str(PODS), str(PODS)]


def test_restore_leaves_nothing_beside_a_backup_written_by_an_earlier_build(
    live: RunningRecorder, tmp_path: Path
) -> None:
    # Earlier builds wrote backups in WAL mode; a read-only open of one leaves -shm and -wal.
    old = tmp_path / "old" / "backup.sqlite3"
    old.parent.mkdir()
    with sqlite3.connect(f"file:{live.data_dir / JOURNAL_FILE_NAME}?mode=ro", uri=True) as src, \
            sqlite3.connect(old) as dst:
        src.backup(dst)
    assert old.read_bytes()[18:20] == b"\x02\x02"
    for name in (f"{old.name}-wal", f"{old.name}-shm"):
        (old.parent / name).unlink(missing_ok=True)
    live.stop()
    before = _tree(old.parent)
    restored = _command("restore", "--data-dir", live.data_dir, "--from", old)
    assert restored.code == 0, restored
    assert _tree(old.parent) == before
    assert not [p for p in live.data_dir.iterdir() if p.name.startswith(".")]
    assert _command("check", "--data-dir", live.data_dir).code == 0


# -- check: a mistyped path is not damage ------------------------------------------------------


def test_check_tells_a_mistyped_path_from_a_damaged_journal(
    live: RunningRecorder, tmp_path: Path
) -> None:
    live.stop()
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_text("x")
    for data_dir, code, says in [
        (tmp_path / "no-such-dir", 2, "does not exist"),
        (tmp_path / "a-file", 2, "is not a directory"),
        (tmp_path / "empty", 2, "there is no journal in"),
        (live.data_dir, 0, None),
    ]:
        outcome = _command("check", "--data-dir", data_dir)
        assert outcome.code == code, outcome
        if says is not None:
            _one_line_error(outcome, "check", says)
    lost = tmp_path / "lost"
    shutil.copytree(live.data_dir, lost)
    (lost / JOURNAL_FILE_NAME).unlink()
    gone = _command("check", "--data-dir", lost)
    assert gone.code == 3 and "the file does not exist" in gone.err, gone
    mangled = tmp_path / "mangled"
    shutil.copytree(live.data_dir, mangled)
    with (mangled / WATERMARK).open("ab") as out:
        out.write(b"junk")
    damaged = _command("check", "--data-dir", mangled)
    assert damaged.code == 3 and "watermark" in damaged.err and "is damaged" in damaged.err


def test_check_and_backup_of_a_stopped_journal_leave_its_directory_as_it_was(
    live: RunningRecorder, tmp_path: Path
) -> None:
    live.stop()
    before = _tree(live.data_dir)
    assert sorted(before) == [JOURNAL_FILE_NAME, WATERMARK]
    assert _command("check", "--data-dir", live.data_dir).code == 0
    made = _command("backup", "--data-dir", live.data_dir, "--to", tmp_path / "b.sqlite3")
    assert made.code == 0 and f": {PODS} pods," in made.out, made
    assert _tree(live.data_dir) == before


# -- the watermark: a damaged one is repaired by the ways on -----------------------------------


@settings(max_examples=200, deadline=None)
@given(content=st.binary(max_size=600), journal_id=st.integers(0, 2**63 - 1),
       revision=st.integers(0, 10**20 - 1))
def test_whatever_the_watermark_held_one_write_makes_it_read_back_exactly(
    content: bytes, journal_id: int, revision: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("mark") / "w"
    path.write_bytes(content)
    watermark = Watermark(path, lock=True)
    watermark.write(journal_id, revision)
    watermark.close()
    again = Watermark(path)
    again.close()
    assert (again.problem, again.mark) == (None, Mark(journal_id, revision))


def _lengthen_watermark(data_dir: Path) -> None:
    with (data_dir / WATERMARK).open("ab") as out:
        out.write(b"hami-accounting-watermark 1 id=0000000000000000 revision=0\n")


def test_accepting_the_loss_repairs_a_watermark_longer_than_its_line(
    live: RunningRecorder, start_recorder: StartRecorder
) -> None:
    live.stop()
    _lengthen_watermark(live.data_dir)
    with pytest.raises(JournalDamagedError, match=r"watermark .* is damaged"):
        start_recorder(live.data_dir)
    start_recorder(live.data_dir, journal_on_damage="accept-loss").stop()
    # The next plain start reads it: every pod is back.
    assert len(_uids(start_recorder(live.data_dir))) == PODS


def test_a_restore_repairs_a_watermark_longer_than_its_line(
    live: RunningRecorder, start_recorder: StartRecorder, tmp_path: Path
) -> None:
    backup = _backup_of(live, tmp_path / "backup.sqlite3")
    live.stop()
    _lengthen_watermark(live.data_dir)
    restored = _command("restore", "--data-dir", live.data_dir, "--from", backup)
    assert restored.code == 0, restored
    assert len(_uids(start_recorder(live.data_dir))) == PODS
