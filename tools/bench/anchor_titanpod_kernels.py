"""titanpod on the anchor harness's shape and clock with a kernel in a slot: the ``+kernel`` rows of vs_anchors.py.

    uv run python tools/bench/anchor_titanpod_kernels.py --anchors ../shared/anchors \
        --mode whole_step --attention cpu_flash [--precision bf16] [--peak-flops X]

The harness's ``run_product.py`` builds the model with the reference ops; this runner is the
same measurement (the harness's ``common`` config, data, clock and record, imported from
``--anchors``) with the model's slots filled by ``titanpod.kernels.model_ops`` from
``--attention`` and ``--head-loss``. Prints one JSON record, system
``titanpod-<mode>+<attention>-<precision>``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from anchor_harness import import_harness, start_run, timed_steps


def main() -> None:
    common = import_harness()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--anchors", type=Path, required=True)
    parser.add_argument("--mode", default="whole_step", choices=["eager", "per_block", "whole_step"])
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--attention", default="cpu_flash", help="kernels.attention")
    parser.add_argument("--head-loss", default="reference", help="kernels.head_loss")
    common.add_common_args(parser)
    args = parser.parse_args()
    with common.stdout_to_stderr():
        import torch

        from titanpod.device import get_backend
        from titanpod.graph import TrainConfig, build_step
        from titanpod.kernels import KernelConfig, model_ops
        from titanpod.models import DecoderArgs, Transformer, parameter_count
        from titanpod.models.common.rope import Llama3RopeScaling

        quiet, peak, config = start_run(common, args)
        hidden = common.swiglu_hidden_dim(config["dim"], config["ffn_multiple_of"])
        model_args = DecoderArgs(
            dim=config["dim"], n_layers=config["n_layers"], n_heads=config["n_heads"],
            n_kv_heads=config["n_kv_heads"], vocab_size=config["vocab_size"], ffn_dim=hidden,
            rope_theta=config["rope_theta"], rope_scaling=Llama3RopeScaling(), max_seq_len=config["seq_len"],
        )  # fmt: skip
        kernels = KernelConfig(attention=args.attention, head_loss=args.head_loss)
        torch.manual_seed(args.seed)
        model = Transformer(model_args, model_ops(kernels))
        model.init_weights(args.seed)
        train = TrainConfig(steps=config["steps"], lr=config["lr"], warmup_steps=0, decay="constant",
                            weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8, grad_clip=1.0, log_every=1,
                            step_mode=args.mode, precision=args.precision)  # fmt: skip
        step = build_step(model, train, get_backend("cpu"))
        n_params = parameter_count(model)
        n_embed = model.tok_embeddings.weight.numel()
        fpt = common.flops_per_token(n_params - n_embed, config["n_layers"], config["n_heads"],
                                     config["dim"] // config["n_heads"], config["seq_len"])  # fmt: skip

        def one_step(ids: torch.Tensor) -> float:
            return float(step([(ids[:, :-1], ids[:, 1:])], config["lr"]).loss)

        stats = timed_steps(common, config, one_step, extra_token=1)
        losses, first_step_s = stats.pop("losses"), stats.pop("first_step_s")
        record_config = dict(config)
        record_config.update(ffn_hidden_dim=hidden, n_params=n_params, n_params_embedding=n_embed,
                             step_mode=args.mode, precision=args.precision, attention=args.attention,
                             head_loss=args.head_loss, optimizer="titanpod functional AdamW, clip 1.0, constant lr",
                             loss_first_last=[round(losses[0], 4), round(losses[-1], 4)],
                             first_step_s=first_step_s)  # fmt: skip
        system = f"titanpod-{args.mode}+{args.attention}-{args.precision}"
        record = common.finish_record(system, stats, fpt, peak, record_config,
                                      common.versions(["torch", "titanpod-graph", "titanpod-kernels"]),
                                      extra={"host_quiet_before": quiet})  # fmt: skip
    common.emit(record, args.out)


if __name__ == "__main__":
    main()
