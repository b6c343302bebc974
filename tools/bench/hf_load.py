"""Load time and peak memory of a ~1 GB Hugging Face checkpoint: titanpod against a plain read.

    uv run python tools/bench/hf_load.py [--layers 13] [--shard-size 256MB] [--repeats 2]

Writes a random fp32 Llama-shaped checkpoint (about 1.1 GB with the defaults) with
titanpod's exporter, then in fresh processes, alternating, times

- plain: ``safetensors.torch.load_file`` of every shard, each tensor then copied into fresh
  process memory (``load_file`` alone maps the file and reads nothing until touched);
- titanpod: ``load_hf_checkpoint``: config, header validation, meta build, one allocation,
  shard-by-shard copy into the model.

Both read the same files through the same page cache; each process imports PyTorch and
loads its meta kernels before the clock starts. The best of ``--repeats`` runs is
reported, with each process's peak resident memory over the checkpoint size.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _phase(kind: str, folder: Path) -> None:
    import torch

    # Process warm-up, outside the clock in both phases: the first meta-device init imports
    # torch._dynamo, seconds of one-time work when Python may not cache bytecode.
    torch.nn.Embedding(2, 2, device="meta")
    start = time.perf_counter()
    if kind == "plain":
        from safetensors.torch import load_file

        tensors = {}
        for shard in sorted(folder.glob("*.safetensors")):
            tensors.update((name, t.clone()) for name, t in load_file(str(shard)).items())
        count = sum(t.numel() for t in tensors.values())
    else:
        from titanpod.checkpoint import load_hf_checkpoint
        from titanpod.recipes.families import decoder_adapters

        model = load_hf_checkpoint(folder, adapters=decoder_adapters()).model
        count = sum(p.numel() for p in model.parameters())
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"seconds": seconds, "peak_rss_bytes": peak, "parameters": count}))


def _run(kind: str, folder: Path) -> dict:
    result = subprocess.run(
        [sys.executable, __file__, "--phase", kind, str(folder)], capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=13)
    parser.add_argument("--shard-size", default="256MB")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--phase", nargs=2, metavar=("KIND", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        _phase(args.phase[0], Path(args.phase[1]))
        return

    from titanpod.checkpoint import save_hf_checkpoint
    from titanpod.models import DecoderArgs
    from titanpod.recipes.families import build_model, hf_adapter

    shape = DecoderArgs(dim=1024, n_layers=args.layers, n_heads=16, n_kv_heads=8, vocab_size=32000, ffn_dim=4096)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model("llama3", shape, device="cpu")
        model.init_weights(0)
        folder = Path(tmp) / "checkpoint"
        start = time.perf_counter()
        save_hf_checkpoint(model, hf_adapter("llama3"), folder, max_shard_size=args.shard_size)
        save_seconds = time.perf_counter() - start
        del model
        size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
        shards = len(list(folder.glob("*.safetensors")))
        print(f"checkpoint: {size / 1e9:.2f} GB in {shards} shards; titanpod export took {save_seconds:.2f} s "
              f"({size / save_seconds / 1e9:.2f} GB/s)")  # fmt: skip
        runs: dict[str, list[dict]] = {"plain": [], "titanpod": []}
        for _ in range(args.repeats):
            for kind in runs:
                runs[kind].append(_run(kind, folder))
        best = {kind: min(results, key=lambda r: r["seconds"]) for kind, results in runs.items()}
        for kind, result in best.items():
            print(f"{kind:9s} load {result['seconds']:.2f} s ({size / result['seconds'] / 1e9:.2f} GB/s), "
                  f"peak RSS {result['peak_rss_bytes'] / 1e9:.2f} GB = {result['peak_rss_bytes'] / size:.2f}x "
                  f"the checkpoint")  # fmt: skip
        ratio = best["titanpod"]["seconds"] / best["plain"]["seconds"]
        print(f"titanpod / plain load time: {ratio:.2f}x")


if __name__ == "__main__":
    main()
