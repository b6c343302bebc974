"""FSDP collectives on gloo: step time with one gather per parameter against bucketed (and prefetched) gathers.

    uv run python tools/bench/collectives.py [--models debug,wide] [--modes eager,whole_step] [--steps 8]
                                             [--ranks 4] [--bucket-mb 25] [--sections fsdp_collectives]

Section ``fsdp_collectives``: for each model and step mode, one torchrun launch of ``--ranks``
processes (gloo, one OpenMP thread each) builds the same Llama 3 three times, sharded FSDP over
every rank: ``per_param`` (``fsdp_bucket_mb=0``, one all-gather and one reduce-scatter per
parameter: the baseline), ``buckets`` (``fsdp_bucket_mb=--bucket-mb``: one of each per block) and
``buckets+prefetch`` (block i+1's gather started before block i computes). The three train
on the same random batches, one step each in turn, so load from other processes on the
machine falls on all three alike; the first two rounds are warm-up (and the whole step's
capture), the next ``--steps`` are timed, each between two barriers. Printed: the median and
the fastest step, collectives per step each way, the ratio of the baseline's median to each
one's (above 1 is faster), and the largest loss difference from the baseline over the run
(the three must train alike). Then, per launch, whether gloo overlaps at all: one block's
bucket gathered alone, a block's matmuls alone, and the gather started before the matmuls and
waited for after them (``overlap_probe``).

Models: ``debug`` is the Llama 3 debug flavor (5.6M parameters, 57 tensors); ``wide`` is a
Llama 3 shape of about 30M parameters (dim 512, 8 layers, ffn 1536, vocabulary 8,192; 75 tensors).
Global batch 8 x 128 tokens, split over the ranks.

Section ``cp_sequence_ceiling`` (``--sections cp_sequence_ceiling``): the sequence-length ceiling per
rank at a fixed memory budget with and without cp2 (see ``tools/bench/cp_ceiling.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODELS = {
    "debug": {"flavor": "debug"},
    "wide": {
        "args": {
            "dim": 512,
            "n_layers": 8,
            "n_heads": 8,
            "n_kv_heads": 4,
            "vocab_size": 8192,
            "ffn_dim": 1536,
            "max_seq_len": 512,
        }
    },
}
CONFIGS = {"per_param": (0.0, False), "buckets": (None, False), "buckets+prefetch": (None, True)}
"""Name -> (fsdp_bucket_mb, fsdp_prefetch); None takes ``--bucket-mb``."""
GLOBAL_BATCH, SEQ = 8, 128
WARMUP = 2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def overlap_probe(shard_numel: int, rows: int, dim: int, rounds: int = 10) -> dict[str, float]:
    """Whether gloo moves a gather while this rank computes: median ms of one block's bucket gathered alone,
    of a block's matmuls alone ([rows, dim] x [dim, 4 dim] and back, three times), and of the gather
    started, the matmuls run, then the gather waited for. Each timed between two barriers, interleaved."""
    import torch
    import torch.distributed as dist

    c10d = torch.ops._c10d_functional
    group, ranks = dist.group.WORLD.group_name, dist.get_world_size()  # type: ignore[union-attr]
    shard, x = torch.randn(shard_numel), torch.randn(rows, dim)
    up, down = torch.randn(dim, 4 * dim) / dim**0.5, torch.randn(4 * dim, dim) / (4 * dim) ** 0.5

    def matmuls() -> None:
        h = x
        for _ in range(3):
            h = (h @ up) @ down

    def gather() -> None:
        c10d.wait_tensor(c10d.all_gather_into_tensor(shard, ranks, group))

    def both() -> None:
        pending = c10d.all_gather_into_tensor(shard, ranks, group)
        matmuls()
        c10d.wait_tensor(pending)

    times: dict[str, list[float]] = {"gather": [], "matmuls": [], "both": []}
    for _ in range(rounds):
        for name, run in (("gather", gather), ("matmuls", matmuls), ("both", both)):
            dist.barrier()
            start = time.perf_counter()
            run()
            dist.barrier()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values[1:]) * 1e3 for name, values in times.items()}


def worker(model_name: str, mode: str, steps: int, bucket_mb: float, out: Path) -> None:
    """One rank: build the three configurations, step them in turn, write rank 0's figures as JSON."""
    import torch
    import torch.distributed as dist

    from titanpod.device import ensure_process_group, get_backend
    from titanpod.graph import TrainConfig, build_step
    from titanpod.models import DecoderArgs, Transformer
    from titanpod.parallel import ParallelConfig
    from titanpod.parallel.torch_executor import parallelize
    from titanpod.recipes.families import build_model, sharding_plan

    backend = get_backend("cpu")
    info = ensure_process_group(backend)
    spec = MODELS[model_name]
    runs = {}
    for name, (mb, prefetch) in CONFIGS.items():
        torch.manual_seed(0)
        if "flavor" in spec:
            model = build_model("llama3", spec["flavor"], device="cpu")
        else:
            model = Transformer(DecoderArgs(**spec["args"]))
        model.init_weights(0)
        config = ParallelConfig(fsdp_bucket_mb=bucket_mb if mb is None else mb, fsdp_prefetch=prefetch)
        sharded = parallelize(model, sharding_plan("llama3"), config, backend)
        tensors = len(list(model.parameters()))
        collectives = tensors if sharded.buckets is None else len(sharded.buckets.buckets)
        train_config = TrainConfig(steps=steps + WARMUP, lr=1e-4, warmup_steps=1, step_mode=mode, compiler="none")
        step = build_step(model, train_config, backend)
        runs[name] = {"step": step, "times": [], "losses": [], "collectives": collectives, "tensors": tensors}
    vocab = model.args.vocab_size
    generator = torch.Generator().manual_seed(1)
    per_rank = GLOBAL_BATCH // info.world_size
    for round_index in range(WARMUP + steps):
        tokens = torch.randint(0, vocab, (GLOBAL_BATCH, SEQ + 1), generator=generator)
        mine = tokens[info.rank * per_rank : (info.rank + 1) * per_rank]
        batch = [(mine[:, :-1], mine[:, 1:])]
        for run in runs.values():
            dist.barrier()
            start = time.perf_counter()
            output = run["step"](batch, 1e-4)
            dist.barrier()
            if round_index >= WARMUP:
                run["times"].append(time.perf_counter() - start)
            run["losses"].append(float(output.loss))
    block_numel = sum(p.to_local().numel() for p in model.layers[0].parameters())  # type: ignore[union-attr]
    overlap = overlap_probe(block_numel, per_rank * SEQ, model.args.dim)
    if info.rank == 0:
        figures = {name: {k: v for k, v in run.items() if k != "step"} for name, run in runs.items()}
        out.write_text(json.dumps({"runs": figures, "overlap": overlap}))
    dist.destroy_process_group()


def _launch(model_name: str, mode: str, steps: int, ranks: int, bucket_mb: float) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "figures.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
                   "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), __file__, "--worker",
                   "--models", model_name, "--modes", mode, "--steps", str(steps), "--bucket-mb", str(bucket_mb),
                   "--out", str(out)]  # fmt: skip
        env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "OMP_NUM_THREADS": "1"}
        run = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        if run.returncode != 0:
            raise RuntimeError(f"{model_name} {mode} failed:\n{run.stderr[-3000:]}")
        return json.loads(out.read_text())


def fsdp_collectives(args: argparse.Namespace) -> None:
    """The step-time table: per-parameter collectives (baseline) against bucketed and prefetched ones."""
    print(f"FSDP={args.ranks} on gloo, {args.steps} timed steps each, buckets of {args.bucket_mb:g} MB")
    print(f"{'model':6s} {'mode':10s} {'config':17s} {'coll/step':>9s} {'median ms':>9s} {'best ms':>8s} "
          f"{'vs per_param':>12s} {'max |dloss|':>11s}")  # fmt: skip
    overlaps = {}
    for model_name in args.models.split(","):
        for mode in args.modes.split(","):
            launched = _launch(model_name, mode, args.steps, args.ranks, args.bucket_mb)
            figures, overlaps[f"{model_name} {mode}"] = launched["runs"], launched["overlap"]
            baseline = figures["per_param"]
            base_median = statistics.median(baseline["times"])
            for name, run in figures.items():
                median = statistics.median(run["times"])
                drift = max(abs(a - b) for a, b in zip(run["losses"], baseline["losses"], strict=True))
                print(
                    f"{model_name:6s} {mode:10s} {name:17s} {run['collectives']:9d} {median * 1e3:9.1f} "
                    f"{min(run['times']) * 1e3:8.1f} {base_median / median:11.2f}x {drift:11.1e}",
                    flush=True,
                )
    print(
        "coll/step: all-gathers per forward, as many reduce-scatters per backward; "
        "vs per_param: its median / this one's"
    )
    print("\nDoes gloo overlap a gather with compute? One block's bucket against a block's matmuls, median ms:")
    print(f"{'launch':17s} {'gather':>7s} {'matmuls':>8s} {'both':>7s} {'hidden':>7s}")
    for launch, figures in overlaps.items():
        gather, matmuls, both = figures["gather"], figures["matmuls"], figures["both"]
        hidden = (gather + matmuls - both) / min(gather, matmuls)
        print(f"{launch:17s} {gather:7.1f} {matmuls:8.1f} {both:7.1f} {hidden:7.0%}")
    print("both: the gather started, the matmuls run, the gather waited for; hidden: the part of the shorter")
    print("of the two that both saves against running them one after the other.")


def cp_sequence_ceiling(args: argparse.Namespace) -> None:
    """The sequence-length ceiling per rank with and without cp2 (``tools/bench/cp_ceiling.py``, which also
    runs alone): the memory a row of each of ``--seq-lens`` costs a rank, and the longest within ``--budget-mib``."""
    sys.path.insert(0, str(Path(__file__).parent))
    from cp_ceiling import ceiling_table

    seq_lens = [int(s) for s in args.seq_lens.split(",")]
    print("\nsequence-length ceiling per rank: llama3 debug, one row, eager, fp32; cp 1 against cp 2", flush=True)
    print("\n".join(ceiling_table(seq_lens, [1, 2], args.budget_mib)))


SECTIONS = {"fsdp_collectives": fsdp_collectives, "cp_sequence_ceiling": cp_sequence_ceiling}
"""Section name -> the function that measures and prints it."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="debug,wide", help=f"comma-separated: {', '.join(MODELS)}")
    parser.add_argument("--modes", default="eager,whole_step", help="comma-separated step modes (whole_step: op by op)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    parser.add_argument("--sections", default="fsdp_collectives", help=f"comma-separated: {', '.join(SECTIONS)}")
    parser.add_argument("--seq-lens", default="1024,2048,4096,8192,16384", help="cp_sequence_ceiling: row lengths")
    parser.add_argument("--budget-mib", type=float, default=1024.0, help="cp_sequence_ceiling: memory per rank")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.models, args.modes, args.steps, args.bucket_mb, args.out)
        return
    for section in args.sections.split(","):
        if section not in SECTIONS:
            parser.error(f"unknown section {section!r}; choose from {', '.join(SECTIONS)}")
        SECTIONS[section](args)


if __name__ == "__main__":
    main()
