"""titanpod-launch computes the same launch environment torch_tpu's ``set_tpu_launch_env`` does.

Both run from the same inputs a TPU VM of a 4-host slice gives (the worker list, this host's index,
4 devices per host); torch_tpu's runs in its own interpreter, as it sets process-wide variables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from titanpod.runs.pod_launch.environment import LaunchRequest, launch_environment

SLICE = {
    "TPU_WORKER_HOSTNAMES": "10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4",
    "JOB_COMPLETION_INDEX": "2",
    "TORCH_TPU_DEVICES_PER_HOST": "4",
}
"""What the slice tells each host: the workers in order, and (here) that this is the third."""

SHARED = ("TORCH_TPU_SLICEBUILDER_ADDRESSES", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")
"""The variables both compute."""

TORCH_TPU = """
import json, os
import torch.tpu.distributed as tpu_distributed
tpu_distributed.set_tpu_launch_env(nnodes=4, nproc_per_node=4)
print("ENV " + json.dumps(dict(os.environ)))
"""


def test_titanpod_launch_and_torch_tpu_agree_on_a_four_host_slice():
    base = {k: v for k, v in os.environ.items() if k not in SHARED and not k.startswith("TPU_WORKER")}
    done = subprocess.run(
        [sys.executable, "-c", "import torch_tpu\n" + TORCH_TPU],
        env={**base, **SLICE},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("ENV ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    theirs = json.loads(lines[-1].removeprefix("ENV "))

    ours = launch_environment(LaunchRequest(lane="tpu", nproc_per_node=4), {**base, **SLICE}).variables
    assert {name: ours[name] for name in SHARED} == {name: theirs[name] for name in SHARED}
    assert ours["NODE_RANK"] == "2" and ours["MASTER_ADDR"] == "10.0.0.1"
    assert ours["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(",")[8:12] == [f"10.0.0.3:{8070 + i}" for i in range(4)]
