"""Naming the rank a job lost, from the store every rank checked in on, and each attempt of a restarted job
keeping keys of its own."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch.distributed as dist

from tests.parallel.test_torchrun import free_port
from titanpod.device.distributed import attempt_store
from titanpod.runs.peer_loss import lost_a_peer, lost_ranks, process_gone, report_lost_peer
from titanpod.runs.pod_launch import LaunchRequest, launch_environment
from titanpod.runs.pod_launch.agent import agent_command


def gone_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_backend_errors_of_a_lost_rank_are_told_from_other_errors():
    assert lost_a_peer(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:3207"))
    assert lost_a_peer(dist.DistBackendError("Read error [127.0.0.1]:1: Connection reset by peer"))
    assert not lost_a_peer(RuntimeError("CUDA out of memory"))
    assert not lost_a_peer(ValueError("Connection closed by peer"))


def test_a_process_that_exited_is_gone_and_a_live_one_is_not():
    assert process_gone(gone_pid())
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not process_gone(live.pid)
    finally:
        live.kill()
        live.wait()


def test_the_lost_rank_of_this_host_is_named_by_one_survivor_only():
    store = dist.HashStore()
    host = socket.gethostname()
    for rank, pid in enumerate([os.getpid(), os.getpid(), gone_pid(), os.getpid()]):
        store.set(f"member-{rank}", f"{host} {pid}")
    assert lost_ranks(store, 1, 4) == ("rank 2", True)
    assert lost_ranks(store, 3, 4) == ("rank 2", False)  # the first to claim it speaks


def test_ranks_of_another_host_that_do_not_check_in_are_named_as_not_answering():
    store = dist.HashStore()
    for rank in range(4):
        store.set(f"member-{rank}", f"elsewhere-{rank // 2} {rank + 1}")
    store.set("peer-loss-survivor-0", "1")
    assert lost_ranks(store, 1, 4, wait_s=0.0) == ("rank 2, 3 (not answering)", True)


def test_a_lost_peer_is_reported_with_the_newest_checkpoint_and_other_errors_are_not(capsys):
    said: list[str] = []
    error = RuntimeError("Connection closed by peer [127.0.0.1]:1")
    report_lost_peer(error, 1, 4, lambda: "runs/x/checkpoints/step-000010", said.append, environ={})
    assert said == [
        "titanpod: the job lost a rank (it is not known which) of 4 ranks (rank 1 saw: Connection closed by peer "
        "[127.0.0.1]:1); newest complete checkpoint runs/x/checkpoints/step-000010: titanpod-launch --max-restarts N "
        "resumes from it by itself; by hand, run the same command again (same --output.run-name)"
    ]
    report_lost_peer(RuntimeError("out of memory"), 1, 4, lambda: None, said.append, environ={})
    report_lost_peer(error, 0, 1, lambda: None, said.append, environ={})
    assert len(said) == 1


def test_each_attempt_of_a_restarted_job_has_keys_of_its_own():
    assert attempt_store({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}) is None  # torchrun without its store
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, 1, is_master=True)
    environ = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "1",
               "TORCHELASTIC_USE_AGENT_STORE": "True"}  # fmt: skip
    first = attempt_store({**environ, "TORCHELASTIC_RESTART_COUNT": "0"})
    second = attempt_store({**environ, "TORCHELASTIC_RESTART_COUNT": "1"})
    first.set("rank_0", "old address")
    assert not second.check(["rank_0"])
    again = attempt_store({**environ, "TORCHELASTIC_RESTART_COUNT": "0"})
    assert again.check(["rank_0"]) and again.get("rank_0") == b"old address"
    assert server.num_keys() >= 1


def test_the_launcher_asks_torchrun_for_restarts():
    launch = launch_environment(LaunchRequest(lane="cpu", hosts=("a",), node_rank=0, nproc_per_node=4), {})
    argv = agent_command(launch, ["titanpod-pretrain"], max_restarts=3)
    assert argv[argv.index("--max-restarts") + 1] == "3" and argv.index("--max-restarts") < argv.index("--no-python")
    assert "--max-restarts" not in agent_command(launch, ["titanpod-pretrain"])
    with pytest.raises(ValueError, match="--max-restarts is -1"):
        agent_command(launch, ["titanpod-pretrain"], max_restarts=-1)
