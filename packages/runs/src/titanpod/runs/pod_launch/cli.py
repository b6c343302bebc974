"""``titanpod-launch``: run on every worker VM of a slice; sets the launch environment, starts torchrun.

    titanpod-launch [--hosts h0,h1,...] [--node-rank N] [--nproc-per-node K] [--lane tpu|cuda|cpu]
                    [--coordinator host:port] [--log-dir DIR] [--max-restarts N] [--dry-run] -- COMMAND [ARGS...]

Prints every launch variable on its own line (so each host's log shows them), then runs
``torchrun --nnodes ... --node-rank ... --no-python COMMAND ARGS`` and exits with its exit code.
With ``--max-restarts N`` a failed process (a lost host, a killed rank) restarts the job up to N times,
and each restart resumes from the run's newest complete checkpoint; the run must be named
(``--output.run-name``) so every attempt finds the same run directory.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from titanpod.device import LANE_ENV_VAR, backend_class
from titanpod.device.lanes import AUTO
from titanpod.runs.pod_launch import cloud_metadata
from titanpod.runs.pod_launch.agent import agent_command, run_agent
from titanpod.runs.pod_launch.environment import (
    LaunchEnvironment,
    LaunchError,
    LaunchRequest,
    host_launch,
    launch_environment,
    launch_lanes,
)
from titanpod.runs.pod_launch.run_name import names_its_run
from titanpod.runs.pod_launch.torch_tpu_env import FILLED_BY_TORCH_TPU, fill_from_torch_tpu, torch_tpu_installed

PREFIX = "titanpod-launch:"


def build_parser() -> argparse.ArgumentParser:
    """The launcher's options (the command to run follows ``--``)."""
    parser = argparse.ArgumentParser(
        prog="titanpod-launch",
        usage="titanpod-launch [options] -- COMMAND [ARGS...]",
        description="Run on every worker host of a slice: sets torch_tpu's launch environment and the process "
        "group (NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT) and starts COMMAND under torchrun, one process "
        "per device. A variable already set in the environment is kept.",
    )
    parser.add_argument("--hosts", help="every worker host, comma-separated, in the same order on every host "
                        "(default: TPU_WORKER_HOSTNAMES, else the TPU VM's metadata)")  # fmt: skip
    parser.add_argument("--node-rank", type=int, help="this host's index in --hosts (default: NODE_RANK, "
                        "TPU_WORKER_ID, JOB_COMPLETION_INDEX, else the TPU VM's metadata)")  # fmt: skip
    parser.add_argument("--nproc-per-node", type=int, help="processes on this host (default: on tpu, "
                        "TORCH_TPU_DEVICES_PER_HOST or the devices of a TPU_ACCELERATOR_TYPE host; on cuda, "
                        "the GPUs seen; on cpu, 1)")  # fmt: skip
    parser.add_argument("--nnodes", type=int, help="expected number of hosts, checked against --hosts")
    parser.add_argument("--coordinator", help="host[:port] of the process group's store (default: the first "
                        "host, port 29500)")  # fmt: skip
    parser.add_argument("--lane", default=AUTO, choices=(*launch_lanes(), AUTO), help="tpu, cuda or cpu "
                        "(default auto: TITANPOD_LANE, else what this machine has)")  # fmt: skip
    parser.add_argument("--base-port", type=int, help="first slicebuilder port on each host (lane tpu; "
                        "default TORCH_TPU_BASE_PORT or 8070)")  # fmt: skip
    parser.add_argument("--log-dir", type=Path, help="also write each process's output to "
                        "DIR/node-<NODE_RANK>/ (torchrun --log-dir --tee 3)")  # fmt: skip
    parser.add_argument("--max-restarts", type=int, default=0, help="restart the job up to N times when a "
                        "process fails; each restart resumes from the newest complete checkpoint (default 0; "
                        "the run needs --output.run-name)")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="print the environment and the command, run nothing")
    return parser


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The launcher's own arguments and the command after the first ``--``."""
    if "--" not in argv:
        return list(argv), []
    cut = list(argv).index("--")
    return list(argv[:cut]), list(argv[cut + 1 :])


def chosen_lane(flag: str, environ: Mapping[str, str]) -> str:
    """``--lane``, else ``TITANPOD_LANE``, else the lane this machine would pick."""
    if flag != AUTO:
        return flag
    from_env = environ.get(LANE_ENV_VAR, "").strip().lower()
    if from_env and from_env != AUTO:
        return from_env
    from titanpod.device.lanes import auto_lane

    return auto_lane()


def request_from(args: argparse.Namespace, environ: Mapping[str, str]) -> LaunchRequest:
    """The launch request: flags first; then what the lane's ``HostLaunch`` allows: the TPU VM's metadata for
    hosts and rank neither flag nor variable gives (lane tpu), this host's devices counted (lane cuda)."""
    lane = chosen_lane(args.lane, environ)
    launch = host_launch(lane)
    hosts = tuple(h.strip() for h in args.hosts.split(",") if h.strip()) if args.hosts else None
    node_rank, nproc = args.node_rank, args.nproc_per_node
    if launch.workers_from_vm_metadata and hosts is None and not environ.get("TPU_WORKER_HOSTNAMES"):
        hosts = cloud_metadata.tpu_worker_hosts()
    rank_vars = ("NODE_RANK", "TPU_WORKER_ID", "JOB_COMPLETION_INDEX")
    if launch.workers_from_vm_metadata and node_rank is None and not any(var in environ for var in rank_vars):
        node_rank = cloud_metadata.tpu_worker_number()
    if launch.counts_local_devices and nproc is None:
        nproc = backend_class(lane)().device_count() or None
    return LaunchRequest(lane, hosts, node_rank, nproc, args.nnodes, args.coordinator, args.base_port)


def report(launch: LaunchEnvironment, environ: Mapping[str, str]) -> None:
    """Print every launch variable on its own line, marking those the environment already had."""
    names = [*launch.variables, *(name for name in FILLED_BY_TORCH_TPU if name in environ)]
    for name in names:
        value = launch.variables.get(name, environ.get(name, ""))
        note = "  (already set)" if name in launch.pinned else ""
        print(f"{PREFIX} {name}={value}{note}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``titanpod-launch``; returns the command's exit code."""
    own, command = split_command(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(own)
    if not command:
        parser.error("give the command to run after --, e.g. titanpod-launch -- titanpod-pretrain --recipe NAME")
    if args.max_restarts > 0 and not names_its_run(command):
        parser.error(
            "--max-restarts restarts the job after a failure, and each restart resumes the run it finds by name: "
            "name the run in the command (--output.run-name NAME, or output.run_name in its recipe file)"
        )
    try:
        request = request_from(args, os.environ)
        launch = launch_environment(request, os.environ)
    except LaunchError as error:
        print(f"{PREFIX} error: {error}", file=sys.stderr)
        return 2
    os.environ.update(launch.to_set)
    if host_launch(request.lane).slicebuilder_ports:
        if torch_tpu_installed():
            fill_from_torch_tpu(launch.nnodes, launch.nproc_per_node)
        elif not args.dry_run:
            print(f"{PREFIX} error: lane {request.lane} needs torch_tpu in the launcher's environment, to set "
                  f"{' and '.join(FILLED_BY_TORCH_TPU)}: run it from the TPU environment "
                  "(uv run --project envs/tpu titanpod-launch ...).", file=sys.stderr)  # fmt: skip
            return 2
    report(launch, os.environ)
    if args.max_restarts < 0:
        parser.error(f"--max-restarts is {args.max_restarts}: give 0 (no restarts) or more")
    argv_agent = agent_command(launch, command, args.log_dir, args.max_restarts)
    print(f"{PREFIX} {'would run' if args.dry_run else 'running'}: {shlex.join(argv_agent)}", flush=True)
    if args.dry_run:
        return 0
    return run_agent(argv_agent, os.environ)


if __name__ == "__main__":
    sys.exit(main())
