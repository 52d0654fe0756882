"""A rolling update, end to end: the daemons of a previous release beside this build's, in every
mix a rolling update of the three can produce, answer as one release alone does.

Each release of ``side_by_side`` in releases.toml is unpacked from its commit (``git archive``;
no tag is needed) and run with this checkout's interpreter and its tree on PYTHONPATH, which is
right only while the release's dependencies are this build's: the test checks that first. Two
recorders run (the release's and this build's), and beside each an admission and a scheduler
daemon of each version: 8 mixes of (admission, scheduler, recorder). In each, one workload is
walked through the daemons on a node and a namespace of its own:

* a pod that fits is admitted, placed on the node, recorded with its init container running
  (its init share charged), shrunk once the init container exited 0, and forgotten;
* a pod over the namespace's quota is refused (``MemoryQuotaExceeded``);
* a pod larger than every card finds no node.

Every mix must give what this build alone gives and what the release alone gives, and no call
may fail (an ``UNAVAILABLE`` for a policy one side cannot reproduce would). Then the recorder is
rolled on its journal: the release's recorder stops and this build's opens its data directory,
and the reverse, and each finds what the other recorded.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import time
import tomllib
import uuid
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from hami.accounting.v1 import (
    admission_pb2,
    admission_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    usage_pb2,
    usage_pb2_grpc,
)
from services.cli.health import check_health
from tests.e2e.stack import PYTHON, REPO, SERVICE_NAMES, clean_env, free_port, log_tail
from tests.support.pods import (
    app_container,
    gpu_device,
    init_container,
    kube_node,
    kube_pod,
    running,
    terminated,
    to_json,
    waiting,
)

pytestmark = pytest.mark.timeout(300)

RELEASES = tomllib.loads((REPO / "releases.toml").read_text())
COMMITS = {release["version"]: release["commit"] for release in RELEASES["release"]}
HEAD = "head"
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 10.0
CALL_TIMEOUT_S = 10.0
CARD_MIB = 24576
QUOTA_MIB = 32768


# -- the release's tree --------------------------------------------------------------------


def _dependencies(pyproject: Path) -> list[str]:
    return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])


def unpack_release(version: str, into: Path) -> Path:
    """The tree of release ``version`` at its recorded commit, in ``into``."""
    commit = COMMITS[version]
    present = subprocess.run(
        ["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPO, capture_output=True
    )
    if present.returncode != 0:
        pytest.fail(
            f"release {version}'s commit {commit} (releases.toml) is not in this clone; a "
            "shallow clone has no history: run git fetch --unshallow",
            pytrace=False,
        )
    into.mkdir(parents=True)
    archive = subprocess.Popen(["git", "archive", commit], cwd=REPO, stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, check=True)
    assert archive.wait() == 0
    if _dependencies(into / "pyproject.toml") != _dependencies(REPO / "pyproject.toml"):
        pytest.fail(
            f"release {version} depends on other packages than this build: its daemons cannot "
            "run on this checkout's .venv; give the test a virtual environment of its own",
            pytrace=False,
        )
    return into


# -- the daemons ---------------------------------------------------------------------------


@dataclass
class Daemon:
    name: str
    version: str
    addr: str
    process: subprocess.Popen[bytes]
    log: Path
    data_dir: Path | None = None


class Daemons:
    """Daemons of either version, each a subprocess on a free port."""

    def __init__(self, workdir: Path, trees: dict[str, Path]) -> None:
        self.workdir = workdir
        self.trees = trees
        self.all: list[Daemon] = []

    def spawn(
        self, name: str, version: str, *, usage_addr: str = "", data_dir: Path | None = None
    ) -> Daemon:
        tree = self.trees[version]
        addr = f"127.0.0.1:{free_port()}"
        env = clean_env(
            HAMI_ACCOUNTING_LISTEN_ADDR=addr,
            HAMI_ACCOUNTING_METRICS_ADDR="off",
            OTEL_SDK_DISABLED="true",
            PYTHONPATH=os.pathsep.join((str(tree), str(tree / "gen"))),
        )
        if name == "usage":
            assert data_dir is not None
            env["HAMI_ACCOUNTING_DATA_DIR"] = str(data_dir)
        else:
            env["HAMI_ACCOUNTING_USAGE_ADDR"] = usage_addr
        log = self.workdir / f"{name}-{version}-{len(self.all)}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                [PYTHON, "-m", "services.cli", "serve", name],
                cwd=tree,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        daemon = Daemon(name, version, addr, process, log, data_dir)
        self.all.append(daemon)
        return daemon

    @staticmethod
    def wait_serving(daemon: Daemon) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        last = "no answer"
        while time.monotonic() < deadline:
            if (code := daemon.process.poll()) is not None:
                pytest.fail(f"{daemon.name} of {daemon.version} exited with {code}:\n"
                            f"{log_tail(daemon.log)}", pytrace=False)
            try:
                last = check_health(daemon.addr, SERVICE_NAMES[daemon.name], timeout_s=0.5)
                if last == "SERVING":
                    return
            except grpc.RpcError as error:
                last = error.code().name if hasattr(error, "code") else str(error)
            time.sleep(0.05)
        pytest.fail(f"{daemon.name} of {daemon.version} not SERVING after {START_TIMEOUT_S} s "
                    f"(last: {last}):\n{log_tail(daemon.log)}", pytrace=False)

    @staticmethod
    def stop(daemon: Daemon) -> None:
        daemon.process.send_signal(signal.SIGTERM)
        try:
            code = daemon.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            daemon.process.kill()
            daemon.process.wait()
            pytest.fail(f"{daemon.name} of {daemon.version} ignored SIGTERM:\n"
                        f"{log_tail(daemon.log)}", pytrace=False)
        assert code == 0, f"{daemon.name} of {daemon.version} exited {code}"

    def kill_all(self) -> None:
        for daemon in self.all:
            if daemon.process.poll() is None:
                daemon.process.kill()
                daemon.process.wait()

    def logs(self) -> str:
        return "\n".join(f"--- {d.name} of {d.version} ---\n{log_tail(d.log, 15)}"
                         for d in self.all)


# -- one workload --------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What the client saw, with the mix's own names taken out."""

    admitted: tuple[bool, str]
    placed_on_the_node: bool
    placed_mib: int
    recorded: tuple[tuple[str, int], ...]
    over_quota: tuple[bool, str]
    too_large: tuple[str, str, tuple[str, ...]]
    policy_ids: frozenset[str]


@dataclass
class Clients:
    usage: usage_pb2_grpc.UsageRecorderStub
    admission: admission_pb2_grpc.AdmissionStub
    scheduler: scheduler_pb2_grpc.SchedulerStub


def walk_workload(clients: Clients, mix: str) -> tuple[Outcome, str]:
    """The workload in namespace and on node ``ru-<mix>``; the outcome and the fitting pod's
    uid (still recorded: only its ForgetPod is left to the recorder's roll)."""
    node, namespace = f"ru-{mix}", f"ru-{mix}"
    t = CALL_TIMEOUT_S
    clients.usage.RegisterNode(usage_pb2.RegisterNodeRequest(
        node_name=node,
        kubernetes_node_json=to_json(kube_node(node, [gpu_device(f"GPU-{mix}-0",
                                                                 memory_mib=CARD_MIB)])),
    ), timeout=t)
    clients.usage.SetQuota(usage_pb2.SetQuotaRequest(
        namespace=namespace, limits={"limits.nvidia.com/gpumem": QUOTA_MIB}
    ), timeout=t)
    policy_ids = {clients.usage.GetPolicy(usage_pb2.GetPolicyRequest(), timeout=t)
                  .policy.policy_id}

    uid = str(uuid.uuid4())
    pod: dict[str, Any] = kube_pod(
        "fits", uid=uid, namespace=namespace,
        init=[init_container("convert-weights", gpumem=20480)],
        apps=[app_container("server", gpumem=10240)],
    )
    checked = clients.admission.CheckQuota(
        admission_pb2.CheckQuotaRequest(kubernetes_pod_json=to_json(pod)), timeout=t
    )
    policy_ids.add(checked.policy_id)
    placed = clients.scheduler.Filter(
        scheduler_pb2.FilterRequest(kubernetes_pod_json=to_json(pod), node_names=[node]),
        timeout=t,
    )
    policy_ids.add(placed.policy_id)
    pod["metadata"]["annotations"].update(placed.annotations)
    pod["spec"]["nodeName"] = placed.node_name
    recorded = []
    for init, app, phase in (
        (running("convert-weights"), waiting("server"), "Pending"),
        (terminated("convert-weights"), running("server"), "Running"),
    ):
        pod["status"] = {"phase": phase, "initContainerStatuses": [init],
                         "containerStatuses": [app]}
        answer = clients.usage.RecordPod(
            usage_pb2.RecordPodRequest(kubernetes_pod_json=to_json(pod)), timeout=t
        )
        recorded.append((answer.decision, sum(u.memory_mib for u in answer.stored)))

    over = kube_pod("over-quota", uid=str(uuid.uuid4()), namespace=namespace,
                    apps=[app_container("server", gpumem=QUOTA_MIB)])
    refused = clients.admission.CheckQuota(
        admission_pb2.CheckQuotaRequest(kubernetes_pod_json=to_json(over)), timeout=t
    )
    policy_ids.add(refused.policy_id)
    large = kube_pod("too-large", uid=str(uuid.uuid4()), namespace=namespace,
                     apps=[app_container("server", gpumem=CARD_MIB + 1024)])
    unplaced = clients.scheduler.Filter(
        scheduler_pb2.FilterRequest(kubernetes_pod_json=to_json(large), node_names=[node]),
        timeout=t,
    )
    policy_ids.add(unplaced.policy_id)
    outcome = Outcome(
        admitted=(checked.allowed, checked.reason),
        placed_on_the_node=placed.node_name == node,
        placed_mib=sum(u.memory_mib for u in placed.reserved),
        recorded=tuple(recorded),
        over_quota=(refused.allowed, refused.reason),
        too_large=(unplaced.node_name, unplaced.reason,
                   tuple(sorted(unplaced.failed_nodes.values()))),
        policy_ids=frozenset(policy_ids),
    )
    return outcome, uid


# -- the test ------------------------------------------------------------------------------


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Daemons]:
    trees = {HEAD: REPO}
    for version in RELEASES["side_by_side"]:
        trees[version] = unpack_release(version, tmp_path / f"release-{version}")
    running_daemons = Daemons(tmp_path, trees)
    try:
        yield running_daemons
    finally:
        running_daemons.kill_all()
        for version in RELEASES["side_by_side"]:
            shutil.rmtree(tmp_path / f"release-{version}", ignore_errors=True)


@pytest.mark.parametrize("release", RELEASES["side_by_side"])
def test_every_mix_of_a_rolling_update_answers_as_one_release(
    daemons: Daemons, tmp_path: Path, release: str
) -> None:
    versions = (release, HEAD)
    recorders = {
        v: daemons.spawn("usage", v, data_dir=tmp_path / f"data-{v}") for v in versions
    }
    callers = {
        (name, v, u): daemons.spawn(name, v, usage_addr=recorders[u].addr)
        for name in ("admission", "scheduler") for v in versions for u in versions
    }
    with futures.ThreadPoolExecutor(len(recorders) + len(callers)) as pool:
        list(pool.map(daemons.wait_serving, [*recorders.values(), *callers.values()]))

    outcomes: dict[tuple[str, str, str], Outcome] = {}
    recorded_uids: dict[str, list[str]] = {v: [] for v in versions}
    channels: list[grpc.Channel] = []
    try:
        for admission, scheduler, usage in itertools.product(versions, repeat=3):
            dial = [grpc.insecure_channel(d.addr) for d in (
                recorders[usage], callers[("admission", admission, usage)],
                callers[("scheduler", scheduler, usage)],
            )]
            channels += dial
            clients = Clients(usage_pb2_grpc.UsageRecorderStub(dial[0]),
                              admission_pb2_grpc.AdmissionStub(dial[1]),
                              scheduler_pb2_grpc.SchedulerStub(dial[2]))
            mix = "".join("o" if v == release else "n" for v in (admission, scheduler, usage))
            try:
                outcomes[(admission, scheduler, usage)], uid = walk_workload(clients, mix)
            except grpc.RpcError as error:
                pytest.fail(
                    f"admission {admission}, scheduler {scheduler}, recorder {usage}: "
                    f"{error.code().name}: {error.details()}\n{daemons.logs()}", pytrace=False
                )
            recorded_uids[usage].append(uid)

        alone = {v: outcomes[(v, v, v)] for v in versions}
        # The workload means something: admitted, placed, init share charged then released,
        # and the two refusals, under one policy.
        head = alone[HEAD]
        assert head.admitted[0], head
        assert head.placed_on_the_node and head.placed_mib == 20480, head
        assert [mib for _, mib in head.recorded] == [20480, 10240], head
        assert head.over_quota == (False, "MemoryQuotaExceeded"), head
        assert head.too_large[0] == "" and head.too_large[2], head
        assert len(head.policy_ids) == 1 and "" not in head.policy_ids, head
        assert alone[release] == head, (
            f"release {release} alone answers otherwise than this build alone:\n"
            f"{alone[release]}\n{head}"
        )
        for (admission, scheduler, usage), outcome in outcomes.items():
            assert outcome == head, (
                f"admission {admission}, scheduler {scheduler}, recorder {usage} answer "
                f"otherwise than either release alone:\n{outcome}\n{head}"
            )

        # The recorder rolled on its journal, each way: the other version finds every pod.
        for before, after in ((release, HEAD), (HEAD, release)):
            daemons.stop(recorders[before])
            successor = daemons.spawn("usage", after, data_dir=recorders[before].data_dir)
            daemons.wait_serving(successor)
            with grpc.insecure_channel(successor.addr) as channel:
                stub = usage_pb2_grpc.UsageRecorderStub(channel)
                for uid in recorded_uids[before]:
                    found = stub.GetPodUsage(usage_pb2.GetPodUsageRequest(pod_uid=uid),
                                             timeout=CALL_TIMEOUT_S)
                    assert found.found and found.init_released, (before, after, uid)
                    assert sum(u.memory_mib for u in found.stored) == 10240
                    forgotten = stub.ForgetPod(usage_pb2.ForgetPodRequest(pod_uid=uid),
                                               timeout=CALL_TIMEOUT_S)
                    assert sum(u.memory_mib for u in forgotten.released) == 10240
            daemons.stop(successor)
    finally:
        for channel in channels:
            channel.close()
