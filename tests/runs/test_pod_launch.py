"""titanpod-launch: the launch environment of a host of a slice, and a two-host run on this machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_runs import run_cli
from tests.parallel.test_torchrun import free_port
from titanpod.runs.pod_launch import LaunchError, LaunchRequest, launch_environment
from titanpod.runs.pod_launch.agent import agent_command, run_agent
from titanpod.runs.pod_launch.environment import host_launch, launch_lanes

V5P_HOSTS = tuple(f"t1v-n-{i:02d}-w-{i}" for i in range(64))
"""64 worker VMs of 4 chips: a v5p-512 (256 chips; a v5p-N has N TensorCores, 2 per chip)."""

LAUNCH_VARS = ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "TITANPOD_LANE", "RANK",
               "LOCAL_RANK", "TPU_WORKER_HOSTNAMES", "TPU_WORKER_ID", "JOB_COMPLETION_INDEX",
               "TORCH_TPU_SLICEBUILDER_ADDRESSES", "TORCH_TPU_DEVICES_PER_HOST", "TORCH_TPU_BASE_PORT")  # fmt: skip


def test_a_v5p_host_gets_torch_tpu_variables_and_the_process_group():
    environ = {"TPU_WORKER_HOSTNAMES": ",".join(V5P_HOSTS), "TPU_WORKER_ID": "5", "TPU_ACCELERATOR_TYPE": "v5p-512"}
    launch = launch_environment(LaunchRequest(lane="tpu"), environ)
    assert launch.pinned == frozenset()
    addresses = launch.variables.pop("TORCH_TPU_SLICEBUILDER_ADDRESSES").split(",")
    assert launch.variables == {"NNODES": "64", "NODE_RANK": "5", "MASTER_ADDR": V5P_HOSTS[0],
                                "MASTER_PORT": "29500", "WORLD_SIZE": "256", "TITANPOD_LANE": "tpu"}  # fmt: skip
    assert addresses == [f"{host}:{port}" for host in V5P_HOSTS for port in (8070, 8071, 8072, 8073)]
    # the same from flags alone, the way a launcher that is told everything sees it
    flags = LaunchRequest(lane="tpu", hosts=V5P_HOSTS, node_rank=5, nproc_per_node=4, nnodes=64)
    assert launch_environment(flags, {}).nproc_per_node == 4


def test_variables_already_set_are_kept_and_other_lanes_get_only_the_process_group():
    environ = {"MASTER_PORT": "1234", "NODE_RANK": "1", "TORCH_TPU_SLICEBUILDER_ADDRESSES": "a:1,a:2,b:1,b:2"}
    launch = launch_environment(LaunchRequest(lane="tpu", hosts=("a", "b"), nproc_per_node=2), environ)
    assert launch.pinned == set(environ)
    assert {name: launch.variables[name] for name in environ} == environ
    assert set(launch.to_set) == {"NNODES", "MASTER_ADDR", "WORLD_SIZE", "TITANPOD_LANE"}
    cpu = launch_environment(LaunchRequest(lane="cpu", hosts=("a", "b"), coordinator="a"), environ)
    assert "TORCH_TPU_SLICEBUILDER_ADDRESSES" not in cpu.to_set and cpu.nproc_per_node == 1
    assert (cpu.master_addr, cpu.master_port, cpu.node_rank) == ("a", 1234, 1)  # the pinned port wins


@pytest.mark.parametrize(
    ("request_", "environ", "message"),
    [
        (LaunchRequest(hosts=("a", "b"), node_rank=2, nproc_per_node=4), {}, "Node rank 2 is out of range for 2"),
        (LaunchRequest(nproc_per_node=4), {}, "No worker hosts: pass --hosts"),
        (LaunchRequest(hosts=("a", "b"), node_rank=0, nnodes=3, nproc_per_node=4), {}, "says 3 hosts but"),
        (LaunchRequest(hosts=("a", "b"), nproc_per_node=4), {}, "pass --node-rank N"),
        (LaunchRequest(hosts=("a", "b"), node_rank=0, nproc_per_node=4), {"NODE_RANK": "1"}, "unset NODE_RANK"),
        (LaunchRequest(hosts=("a", "b"), node_rank=0), {}, "pass --nproc-per-node"),
    ],
)
def test_a_launch_that_cannot_work_fails_with_the_fix(request_, environ, message):
    with pytest.raises(LaunchError, match=message):
        launch_environment(request_, environ)


def test_the_lanes_launched_and_how_come_from_their_backend_classes():
    assert launch_lanes() == ("cpu", "cuda", "tpu")
    assert host_launch("tpu").workers_from_vm_metadata and host_launch("tpu").slicebuilder_ports
    assert host_launch("cpu").processes_per_host == 1 and host_launch("cuda").counts_local_devices
    with pytest.raises(LaunchError, match=r"Lane 'xla' cannot be launched.*cpu, cuda, tpu"):
        launch_environment(LaunchRequest(lane="xla", hosts=("a",), nproc_per_node=1), {})
    with pytest.raises(LaunchError, match="Lane cuda: pass --nproc-per-node"):
        launch_environment(LaunchRequest(lane="cuda", hosts=("a",)), {})


def test_the_agent_is_torchrun_and_its_exit_code_and_signals_come_back(tmp_path):
    launch = launch_environment(LaunchRequest(lane="cpu", hosts=("a", "b"), node_rank=1, nproc_per_node=2), {})
    argv = agent_command(launch, ["titanpod-pretrain", "--train.steps", "3"], log_dir=tmp_path)
    assert argv[1:] == ["-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2",
                        "--master-addr", "a", "--master-port", "29500", "--log-dir", str(tmp_path / "node-1"),
                        "--tee", "3", "--no-python", "titanpod-pretrain", "--train.steps", "3"]  # fmt: skip
    assert run_agent([sys.executable, "-c", "raise SystemExit(3)"], os.environ) == 3
    # a launcher stopped with SIGTERM stops its child the same way, and says so in its exit code
    child = "import sys, time; print('ready', flush=True); time.sleep(120)"
    launcher = subprocess.Popen(
        [sys.executable, "-c", f"import os, sys; from titanpod.runs.pod_launch.agent import run_agent; "
                               f"sys.exit(run_agent([sys.executable, '-c', {child!r}], os.environ))"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert launcher.stdout.readline().strip() == "ready"
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=60) == 128 + signal.SIGTERM


RUN = ["--train.steps", "3", "--train.warmup-steps", "1", "--train.log-every", "1", "--data.seq-len", "32",
       "--checkpoint.no-at-end"]  # fmt: skip


def losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_hosts_of_two_processes_train_like_one_process(tmp_path):
    """Two launchers (node ranks 0 and 1 of hosts 127.0.0.1,127.0.0.1) as on two worker VMs: FSDP over 4 ranks."""
    bin_dir = Path(sys.executable).parent
    env = {name: value for name, value in os.environ.items() if name not in LAUNCH_VARS}
    env |= {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    coordinator = f"127.0.0.1:{free_port()}"
    command = [str(bin_dir / "titanpod-pretrain"), *RUN, "--parallel.fsdp", "4", "--data.batch-size", "1",
               "--output.run-name", "pod"]  # fmt: skip
    host = ["--hosts", "127.0.0.1,127.0.0.1", "--nproc-per-node", "2", "--lane", "cpu", "--coordinator", coordinator]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    launch = [str(bin_dir / "titanpod-launch"), *host]
    launchers = [
        subprocess.Popen([*launch, "--node-rank", str(rank), "--", *command], cwd=tmp_path, env=env, **pipes)
        for rank in (0, 1)
    ]
    outputs = [launcher.communicate(timeout=600) for launcher in launchers]
    for launcher, (stdout, stderr) in zip(launchers, outputs, strict=True):
        assert launcher.returncode == 0, stderr[-4000:]
        assert "titanpod-launch: NNODES=2" in stdout and "titanpod-launch: WORLD_SIZE=4" in stdout
    assert "titanpod-launch: NODE_RANK=1" in outputs[1][0]
    single = run_cli("titanpod.pretrain.cli", [*RUN, "--data.batch-size", "4", "--output.run-name", "one"], tmp_path)
    assert single.returncode == 0, single.stderr[-4000:]
    pod, one = losses(tmp_path / "runs" / "pod"), losses(tmp_path / "runs" / "one")
    assert len(pod) == len(one) == 3
    for got, want in zip(pod, one, strict=True):
        assert abs(got - want) <= 1e-5 * want
