"""Save and load time of a trainer-state checkpoint and a weights export, with and without content hashes (XXH3-128),
against the disk's plain write and read.

    uv run python tools/bench/checkpoint_io.py [--folder /tmp/titanpod-ckpt-bench] [--repeats 3] [--dim 512]

The state is a Llama 3 shape (dim ``--dim``, 8 layers, vocabulary 16,384; ~42M parameters with the
default dim 512) with its AdamW moments: parameters, two moments and the step count, all fp32 (about
0.5 GB; the weights export is a third of that). Measured in the same run, best of ``--repeats``:

- plain write: the state's number of bytes from memory to one file, then fsync; plain read: it back;
- save: ``Checkpointer.save`` (DCP files, fsync, trainer.json, rename), synchronous; hashed (each file
  read back once and its hash recorded) and not (``Checkpointer.hash_files = False``, sizes only);
- load: ``Checkpointer.load`` into the live model and optimizer state, of the hashed checkpoint (every
  file hashed and checked first; each load is of a new step folder, so no hash is reused) and of
  the unhashed one (sizes checked only);
- async save: how long training is blocked, and the time until the checkpoint is complete (hashing
  runs after the write, in the background), hashed and not;
- weights export: ``save_weights`` (bytes hashed as they are written, ``checksums.json``) against the
  same with the hashing writer replaced by a plain one; weights load: ``load_weights`` with
  ``checksums.json`` (verified) and without (the folder loads unchecked).

Hashed and unhashed runs alternate within each repeat, so a busy machine slows both alike. Reads are
served from the page cache (the files were just written); writes include fsync. Also printed: how fast
``xxhash.xxh3_128`` digests memory here (the floor of what hashing adds; SHA-256 beside it for
scale). The last line is the figures as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path


def best(function: Callable[[], object], repeats: int) -> float:
    """The shortest of ``repeats`` timed calls of ``function``."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


@contextlib.contextmanager
def unhashed_weight_writes() -> Iterator[None]:
    """Weight files written with a plain writer: what saving cost before checksums (the recorded hashes are
    then wrong, so the caller deletes ``checksums.json``)."""
    from titanpod.checkpoint import checksums, safetensors_stream

    class PlainWriter(checksums.HashingWriter):
        def write(self, data: bytes | memoryview) -> int:
            self.size += memoryview(data).nbytes
            return self.handle.write(data)

    safetensors_stream.HashingWriter = PlainWriter  # type: ignore[misc]
    try:
        yield
    finally:
        safetensors_stream.HashingWriter = checksums.HashingWriter  # type: ignore[misc]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/titanpod-ckpt-bench"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dim", type=int, default=512)
    args = parser.parse_args()

    import torch
    import xxhash

    from titanpod.checkpoint import CheckpointConfig, Checkpointer, load_weights, save_weights
    from titanpod.checkpoint.checksums import CHECKSUMS_FILE
    from titanpod.device import get_backend
    from titanpod.graph import EagerStep, TrainConfig
    from titanpod.models import DecoderArgs, Transformer

    shape = DecoderArgs(
        dim=args.dim, n_layers=8, n_heads=8, n_kv_heads=4, vocab_size=16384, ffn_dim=3 * args.dim, max_seq_len=512
    )
    model = Transformer(shape)
    model.init_weights(0)
    step = EagerStep(model, TrainConfig(), get_backend("cpu"))
    for moment in (*step.state.exp_avg, *step.state.exp_avg_sq):
        moment.normal_()
    parameters = sum(p.numel() for p in model.parameters())
    state_bytes = parameters * 4 * 3
    gb = state_bytes / 1e9
    shutil.rmtree(args.folder, ignore_errors=True)
    args.folder.mkdir(parents=True)
    repeats = args.repeats

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

    write_s, read_s = best(plain_write, repeats), best(plain_read, repeats)
    plain.unlink()

    digest_buffer = os.urandom(256 * 2**20)
    sha256_gb_s = 256 * 2**20 / 1e9 / best(lambda: hashlib.sha256(digest_buffer).digest(), repeats)
    xxh3_gb_s = 256 * 2**20 / 1e9 / best(lambda: xxhash.xxh3_128(digest_buffer).digest(), repeats)

    recipe_json = '{"name": "bench", "model": {"family": "llama3", "flavor": "custom"}}'
    recipe = json.loads(recipe_json)
    counter = iter(range(1, 10_000))
    times: dict[str, list[float]] = {}

    def timed(key: str, function: Callable[[], object]) -> None:
        start = time.perf_counter()
        function()
        times.setdefault(key, []).append(time.perf_counter() - start)

    savers = {}
    for label in ("unhashed", "hashed"):
        for kind, config in (
            ("sync", CheckpointConfig(keep_last=1)),
            ("async", CheckpointConfig(keep_last=1, async_save=True)),
        ):
            savers[kind, label] = Checkpointer(args.folder / f"{kind}-{label}", config, recipe_json, lambda m: None)
            savers[kind, label].hash_files = label == "hashed"
    weights = {label: args.folder / f"weights-{label}" for label in ("unhashed", "hashed")}

    def save_unhashed_weights() -> None:
        with unhashed_weight_writes():
            save_weights(model, weights["unhashed"])
        (weights["unhashed"] / CHECKSUMS_FILE).unlink()  # its recorded hashes are wrong: load it unchecked

    for _ in range(repeats):  # hashed and unhashed alternate, so a busy machine slows both alike
        for label in ("unhashed", "hashed"):
            sync, background = savers["sync", label], savers["async", label]
            timed(f"save_{label}", lambda: sync.save(next(counter), model, step, {}))  # noqa: B023
            latest = sorted((args.folder / f"sync-{label}" / "checkpoints").glob("step-*"))[-1]
            timed(f"load_{label}", lambda: sync.load(latest, model, step, recipe))  # noqa: B023
            start = time.perf_counter()
            background.save(next(counter), model, step, {})
            times.setdefault(f"async_blocked_{label}", []).append(time.perf_counter() - start)
            background.wait()
            times.setdefault(f"async_total_{label}", []).append(time.perf_counter() - start)
            if label == "hashed":
                timed("weights_save_hashed", lambda: save_weights(model, weights["hashed"]))
            else:
                timed("weights_save_unhashed", save_unhashed_weights)
            timed(f"weights_load_{label}", lambda: load_weights(model, weights[label]))  # noqa: B023
    figures = {key: min(values) for key, values in times.items()}
    weights_bytes = parameters * 4
    shutil.rmtree(args.folder, ignore_errors=True)

    print(f"trainer state: {gb:.2f} GB ({parameters / 1e6:.1f}M parameters, fp32 + AdamW); ", end="")
    print(f"weights: {weights_bytes / 1e9:.2f} GB; best of {repeats}")
    print(f"{'plain write + fsync':34s} {write_s:6.2f} s  {gb / write_s:6.2f} GB/s")
    print(f"{'plain read':34s} {read_s:6.2f} s  {gb / read_s:6.2f} GB/s")
    print(f"{'xxh3_128 of memory (the hash used)':34s} {xxh3_gb_s:6.2f} GB/s")
    print(f"{'sha256 of memory (hashlib)':34s} {sha256_gb_s:6.2f} GB/s")
    print(f"{'':34s} {'unhashed':>8s}  {'hashed':>8s}  hashed/unhashed")
    rows = [
        ("checkpoint save (sync)", "save", gb),
        ("checkpoint load", "load", gb),
        ("async save: training blocked", "async_blocked", gb),
        ("async save: until complete", "async_total", gb),
        ("weights export (save_weights)", "weights_save", weights_bytes / 1e9),
        ("weights load (load_weights)", "weights_load", weights_bytes / 1e9),
    ]
    ratios = {}
    for name, key, size in rows:
        off, on = figures[f"{key}_unhashed"], figures[f"{key}_hashed"]
        ratios[f"{key}_ratio"] = on / off
        print(f"{name:34s} {off:6.2f} s  {on:6.2f} s  {on / off:5.2f}x   ({size / on:.2f} GB/s hashed)")
    summary = {
        "state_gb": round(gb, 3),
        "plain_write_s": write_s,
        "plain_read_s": read_s,
        "xxh3_128_gb_s": xxh3_gb_s,
        "sha256_gb_s": sha256_gb_s,
        **figures,
        **{key: round(value, 3) for key, value in ratios.items()},
    }
    print(json.dumps({key: round(value, 3) if isinstance(value, float) else value for key, value in summary.items()}))


if __name__ == "__main__":
    main()
