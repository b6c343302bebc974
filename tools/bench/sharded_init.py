"""Memory and time of sharded initialisation and of the final save, per rank, under torchrun.

    uv run python tools/bench/sharded_init.py [--ranks 1 2 4] [--flavor 1B] [--folder /tmp/titanpod-sharded-init]

A Llama 3 (``--flavor``, default ``1B``: Llama 3.2 1B, about 1.24B parameters, 4.6 GiB in fp32) is
built as a pretraining run builds it (``titanpod.runs.pretrain.build_seeded_model``: whole on one
process; under torchrun on the meta device, then ``parallelize`` with the region init, so each rank
creates only its own FSDP shards), then its final weights are written as a run writes them:
``RunSession.save_final_weights`` saving ``<run>/model`` with ``save_model`` (a sharded model is gathered
one tensor at a time and streamed into the file by rank 0). Each job is one torchrun launch on gloo.

Memory is each rank's resident set: the baseline is VmRSS after imports and joining the process
group; each phase starts by resetting the peak (``/proc/self/clear_refs``) and reports VmHWM less the
baseline. So the init figure is what creating the model costs, and the save figure is the model this
rank holds plus what saving adds. The goal: with 4 ranks, each rank's peaks are at most 1/4 of the
model's fp32 bytes plus 25%.

The last line printed is one JSON object:
``{"ranks": [...], "init_peak_gib": [...], "save_peak_gib": [...], "init_seconds": [...],
"save_seconds": [...], "full_fp32_gib": X}`` (peaks: the largest over a job's ranks).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

GIB = 1024**3


def _status_kib(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE).group(1))  # type: ignore[union-attr]


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM back to the current VmRSS


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def worker(flavor: str, folder: Path) -> None:
    """One rank: build the model as a run does, save it as a run does; write this rank's figures as JSON."""
    import torch
    import torch.distributed as dist

    from titanpod.checkpoint import save_model
    from titanpod.device import ensure_process_group, get_backend, process_info
    from titanpod.graph import TrainConfig, TrainSummary
    from titanpod.graph.optimizer import AdamWState
    from titanpod.graph.step_base import StepOutput, TrainStep
    from titanpod.parallel.torch_executor import parallelize
    from titanpod.recipes.families import sharding_plan
    from titanpod.recipes.recipe import ModelConfig, OutputConfig, Recipe
    from titanpod.runs.pretrain import build_seeded_model
    from titanpod.runs.session import RunSession

    class Unstepped(TrainStep):
        """Registers the model with the session; holds no optimizer state (this measures the save alone)."""

        def initial_state(self) -> AdamWState:
            return AdamWState(torch.zeros(()), [], [])

        def state_dict(self) -> dict:
            return {}  # no optimizer state: nothing to save, and nothing for the space check to count

        def __call__(self, micro_batches: list, lr: float) -> StepOutput:
            raise NotImplementedError("this benchmark saves; it does not train")

    class Unread:
        def state_dict(self) -> dict:
            return {}

        def load_state_dict(self, state: dict) -> None:
            pass

    backend = get_backend("cpu")
    info = process_info()
    if info.world_size > 1:
        ensure_process_group(backend)
    recipe = Recipe(
        name="sharded-init-bench",
        model=ModelConfig(family="llama3", flavor=flavor),
        output=OutputConfig(runs_dir=str(folder / f"runs-{info.world_size}"), tensorboard=False),
    )
    baseline = _status_kib("VmRSS")
    say = print if info.is_main else (lambda *_, **__: None)

    _reset_peak()
    start = time.perf_counter()
    model, initial_values = build_seeded_model(recipe, backend)
    if info.world_size > 1:
        parallelize(model, sharding_plan("llama3"), recipe.parallel, backend, initial_values)
        dist.barrier()
    init_seconds = time.perf_counter() - start
    init_peak = _status_kib("VmHWM") - baseline
    say(f"  {info.world_size} ranks: initialised in {init_seconds:.1f} s; saving model/", flush=True)

    _reset_peak()
    with RunSession(recipe, backend) as session:
        session.resume(model, Unstepped(model, TrainConfig(), backend), Unread())
        summary = TrainSummary(steps_done=1, losses=[], tokens_per_second=0.0, mfu=0.0,
                               peak_memory_gib=0.0, wall_seconds=0.0)  # fmt: skip
        start = time.perf_counter()
        session.save_final_weights(summary, lambda: save_model(model, "llama3", session.run_dir / "model"))
        if info.world_size > 1:
            dist.barrier()
        save_seconds = time.perf_counter() - start
        save_peak = _status_kib("VmHWM") - baseline
        figures = {
            "rank": info.rank,
            "baseline_gib": baseline * 1024 / GIB,
            "init_peak_gib": init_peak * 1024 / GIB,
            "save_peak_gib": save_peak * 1024 / GIB,
            "init_seconds": init_seconds,
            "save_seconds": save_seconds,
            "full_fp32_gib": sum(p.numel() for p in model.parameters()) * 4 / GIB,
        }
        (folder / f"figures-{info.world_size}-{info.rank}.json").write_text(json.dumps(figures))


def launch(ranks: int, flavor: str, folder: Path) -> list[dict]:
    """Run the worker on ``ranks`` processes (torchrun, gloo); each rank's figures."""
    command = [sys.executable, __file__, "--worker", "--flavor", flavor, "--folder", str(folder)]
    if ranks > 1:
        command[1:1] = ["-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
                        "--master-addr", "127.0.0.1", "--master-port", str(_free_port())]  # fmt: skip
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "OMP_NUM_THREADS": "1"}
    subprocess.run(command, check=True, env=env)
    return [json.loads((folder / f"figures-{ranks}-{rank}.json").read_text()) for rank in range(ranks)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--flavor", default="1B", help="a Llama 3 flavor (titanpod.models.llama3.flavors)")
    parser.add_argument("--folder", type=Path, default=Path("/tmp/titanpod-sharded-init"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.flavor, args.folder)
        return
    shutil.rmtree(args.folder, ignore_errors=True)
    args.folder.mkdir(parents=True)
    jobs = {}
    for ranks in args.ranks:
        print(f"llama3 {args.flavor} on {ranks} rank(s)", flush=True)
        jobs[ranks] = launch(ranks, args.flavor, args.folder)
        shutil.rmtree(args.folder / f"runs-{ranks}", ignore_errors=True)  # the saved model: GiBs of disk
    full = jobs[args.ranks[0]][0]["full_fp32_gib"]
    print(f"\nmodel: {full:.2f} GiB in fp32; peaks are RSS above each rank's baseline (after imports)")
    print(f"{'ranks':>5} {'init peak GiB':>14} {'save peak GiB':>14} {'init s':>8} {'save s':>8} {'goal GiB':>9}")
    for ranks, figures in jobs.items():
        goal = full / ranks * 1.25
        init_peak = max(f["init_peak_gib"] for f in figures)
        save_peak = max(f["save_peak_gib"] for f in figures)
        init_s = max(f["init_seconds"] for f in figures)
        save_s = max(f["save_seconds"] for f in figures)
        print(f"{ranks:>5} {init_peak:>14.2f} {save_peak:>14.2f} {init_s:>8.1f} {save_s:>8.1f} {goal:>9.2f}")
    for ranks, figures in jobs.items():
        per_rank = ", ".join(f"{f['init_peak_gib']:.2f}/{f['save_peak_gib']:.2f}" for f in figures)
        print(f"  {ranks} ranks, init/save peak per rank (GiB): {per_rank}")
    summary = {
        "ranks": list(jobs),
        "init_peak_gib": [round(max(f["init_peak_gib"] for f in figures), 3) for figures in jobs.values()],
        "save_peak_gib": [round(max(f["save_peak_gib"] for f in figures), 3) for figures in jobs.values()],
        "init_seconds": [round(max(f["init_seconds"] for f in figures), 1) for figures in jobs.values()],
        "save_seconds": [round(max(f["save_seconds"] for f in figures), 1) for figures in jobs.values()],
        "full_fp32_gib": round(full, 3),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
