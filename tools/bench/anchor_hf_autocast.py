"""The anchors' transformers loop under ``torch.autocast(bfloat16)`` on the CPU: the bf16 row of vs_anchors.py.

    /tmp/anchor-venv-hf/bin/python tools/bench/anchor_hf_autocast.py --anchors ../shared/anchors [--peak-flops X]

The model, shape, data, optimizer and clock are the anchor harness's own (its ``run_hf.build_model``
and ``common`` helpers, imported from ``--anchors``); only the forward runs under autocast, with fp32
parameters and a fused fp32 AdamW. Prints one JSON record, system ``hf-transformers-llama-autocast``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from anchor_harness import import_harness, start_run, timed_steps


def main() -> None:
    common = import_harness()
    from run_hf import build_model

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--anchors", type=Path, required=True)
    common.add_common_args(parser)
    args = parser.parse_args()
    with common.stdout_to_stderr():
        import torch

        quiet, peak, config = start_run(common, args)
        torch.manual_seed(args.seed)
        model, _, hidden = build_model(config, "sdpa")
        model.train()
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=config["lr"],
            betas=common.ADAMW_BETAS,
            eps=common.ADAMW_EPS,
            weight_decay=common.ADAMW_WEIGHT_DECAY,
            fused=True,
        )
        n_params = sum(p.numel() for p in model.parameters())
        n_embed = model.model.embed_tokens.weight.numel()
        fpt = common.flops_per_token(n_params - n_embed, config["n_layers"], config["n_heads"],
                                     config["dim"] // config["n_heads"], config["seq_len"])  # fmt: skip

        def one_step(ids: torch.Tensor) -> float:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            return loss.item()

        stats = timed_steps(common, config, one_step, extra_token=0)
        losses = stats.pop("losses")
        stats.pop("first_step_s")
        config.update(ffn_hidden_dim=hidden, n_params=n_params, precision="bf16 autocast, fp32 parameters",
                      loss_first_last=[round(losses[0], 4), round(losses[-1], 4)])  # fmt: skip
        versions = common.versions(["torch", "transformers"])
        extra = {"host_quiet_before": quiet}
        record = common.finish_record("hf-transformers-llama-autocast", stats, fpt, peak, config, versions, extra=extra)
    common.emit(record, args.out)


if __name__ == "__main__":
    main()
