"""Save and load throughput of a ~1.2 GB trainer state against the disk's plain write and read.

    uv run python tools/bench/checkpoint_io.py [--folder /tmp/titanpod-ckpt-bench] [--repeats 2]

The state is a ~100M-parameter Llama 3 shape (dim 768, 12 layers, vocabulary 16,384) with
its AdamW moments: parameters, two moments and the step count, all fp32, about 1.2 GB.
Measured in the same run, best of ``--repeats``:

- plain write: the same number of bytes from memory to one file, then fsync;
- plain read: that file back into memory;
- save: ``Checkpointer.save`` (DCP files, fsync, trainer.json, rename), synchronous;
- async save: how long training is blocked (the copy to host memory), and the time until
  the checkpoint is complete;
- load: ``Checkpointer.load`` into the live model and optimizer state (checks included).

Reads are served from the page cache in both the plain and the checkpoint case (the
files were just written); writes include fsync to the disk.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/titanpod-ckpt-bench"))
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    import torch

    from titanpod.checkpoint import CheckpointConfig, Checkpointer
    from titanpod.device import get_backend
    from titanpod.graph import EagerStep, TrainConfig
    from titanpod.models import DecoderArgs, Transformer

    shape = DecoderArgs(dim=768, n_layers=12, n_heads=12, n_kv_heads=4, vocab_size=16384, ffn_dim=2048, max_seq_len=512)
    model = Transformer(shape)
    model.init_weights(0)
    step = EagerStep(model, TrainConfig(), get_backend("cpu"))
    for moment in (*step.state.exp_avg, *step.state.exp_avg_sq):
        moment.normal_()
    state_bytes = sum(p.numel() * 4 * 3 for p in model.parameters())
    gb = state_bytes / 1e9
    shutil.rmtree(args.folder, ignore_errors=True)
    args.folder.mkdir(parents=True)

    def best(function) -> float:
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            function()
            times.append(time.perf_counter() - start)
        return min(times)

    blob = torch.empty(state_bytes, dtype=torch.uint8).random_().numpy()
    plain = args.folder / "plain.bin"

    def plain_write() -> None:
        with plain.open("wb") as handle:
            handle.write(memoryview(blob))
            handle.flush()
            os.fsync(handle.fileno())

    def plain_read() -> None:
        with plain.open("rb") as handle:
            handle.readinto(memoryview(blob))

    write_s, read_s = best(plain_write), best(plain_read)
    plain.unlink()

    recipe_json = '{"name": "bench", "model": {"family": "llama3", "flavor": "custom"}}'
    sync = Checkpointer(args.folder / "sync", CheckpointConfig(keep_last=1), recipe_json, say=lambda m: None)
    counter = iter(range(1, 1000))
    save_s = best(lambda: sync.save(next(counter), model, step, {}))
    latest = sorted((args.folder / "sync" / "checkpoints").glob("step-*"))[-1]
    recipe = {"name": "bench", "model": {"family": "llama3", "flavor": "custom"}}
    load_s = best(lambda: sync.load(latest, model, step, recipe))

    background = Checkpointer(
        args.folder / "async", CheckpointConfig(keep_last=1, async_save=True), recipe_json, say=lambda m: None
    )
    blocked, total = [], []
    for number in range(1, args.repeats + 1):
        start = time.perf_counter()
        background.save(number, model, step, {})
        blocked.append(time.perf_counter() - start)
        background.wait()
        total.append(time.perf_counter() - start)

    print(f"trainer state: {gb:.2f} GB ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters)")
    rows = [
        ("plain write + fsync", write_s, None),
        ("plain read", read_s, None),
        ("checkpoint save (sync)", save_s, write_s),
        ("checkpoint load", load_s, read_s),
        ("async save: training blocked", min(blocked), write_s),
        ("async save: until complete", min(total), write_s),
    ]
    for name, seconds, baseline in rows:
        ratio = f"{seconds / baseline:5.2f}x plain" if baseline else ""
        print(f"{name:30s} {seconds:6.2f} s  {gb / seconds:6.2f} GB/s  {ratio}")
    shutil.rmtree(args.folder, ignore_errors=True)


if __name__ == "__main__":
    main()
