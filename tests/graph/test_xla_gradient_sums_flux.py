"""``train.sum_gradients_in_loop`` for FLUX: both block lists sum their gradients inside their loops, and every
block reads the modulation vector, which the parameters outside the blocks make, so its cotangents from every block
must come out of the loop summed. The step trains as the one that sums after each backward.

One subprocess on 8 host CPU devices, fp32, FSDP over 8, memory policy ``recompute``, 3 steps of 2 micro-batches
of named flow-matching batches, a debug-width FLUX with 2 double- and 2 single-stream blocks, adaLN modulations
moved off zero. Tolerances (fp32): losses within 1e-6 relative, every parameter and AdamW moment within 1e-5
absolute (as tests/graph/test_xla_scan_flux.py).
"""

from __future__ import annotations

import pytest

from tests.conftest import XLA_ENV, run_json_script

SCRIPT = """
import dataclasses, json, numpy as np, torch
from titanpod.device import get_backend
from titanpod.graph import TrainConfig
from titanpod.graph.xla import XlaStep
from titanpod.models.flux import FLUX_FLAVORS, build_flux_transformer
from titanpod.models.flux.flow_matching import FlowMatchingModel
from titanpod.parallel import ParallelConfig
from titanpod.recipes.families import sharding_plan

args = dataclasses.replace(FLUX_FLAVORS["debug"], depth=2, depth_single=2)
generator = torch.Generator().manual_seed(1)
B, L, T = 8, 16, 8

def batch():
    return {"latents": torch.randn(B, L, args.in_channels, generator=generator),
            "noise": torch.randn(B, L, args.in_channels, generator=generator),
            "timesteps": torch.rand(B, generator=generator),
            "text": torch.randn(B, T, args.context_dim, generator=generator),
            "pooled": torch.randn(B, args.pooled_dim, generator=generator),
            "img_ids": torch.stack([torch.zeros(L), torch.arange(L) // 4, torch.arange(L) % 4], 1).float(),
            "txt_ids": torch.zeros(T, 3), "guidance": torch.ones(B)}

data = [batch() for _ in range(6)]
backend = get_backend("xla")

def flat(tree, prefix=()):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from flat(value, (*prefix, key))
        else:
            yield "/".join(map(str, (*prefix, key))), np.asarray(value)

def run(in_loop):
    config = TrainConfig(steps=3, warmup_steps=1, step_mode="whole_step", memory_policy="recompute",
                         scan_layers=True, grad_accum_steps=2, sum_gradients_in_loop=in_loop, weight_decay=0.0)
    transformer = build_flux_transformer(args, device="cpu")
    transformer.init_weights(0)
    with torch.no_grad():  # adaLN-zero starts every block as the identity: move the modulations off zero
        for name, p in transformer.named_parameters():
            if "mod" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)) * 0.02)
    model = FlowMatchingModel(transformer)
    step = XlaStep(model, config, backend, plan=sharding_plan("flux"), axes=ParallelConfig().mesh_axes(8))
    losses = [float(step(data[2 * i : 2 * i + 2], 1e-3).loss) for i in range(3)]
    return losses, dict(flat(step.state_dict()))

after, inside = run(False), run(True)
keys = sorted(after[1])
print(json.dumps({
    "losses": [after[0], inside[0]],
    "same_keys": keys == sorted(inside[1]),
    "state_max_abs": max(float(np.abs(after[1][k] - inside[1][k]).max()) for k in keys),
    "state_worst": max(keys, key=lambda k: float(np.abs(after[1][k] - inside[1][k]).max())),
}))
"""


@pytest.mark.slow  # compiles two FLUX steps with XLA in a process of its own
def test_flux_summing_in_its_loops_trains_like_summing_after_each_backward():
    runs = run_json_script(SCRIPT, env=XLA_ENV, timeout=900)
    after, inside = runs["losses"]
    assert len(after) == 3 and after[0] != after[-1]
    assert inside == pytest.approx(after, rel=1e-6)
    assert runs["same_keys"]
    assert runs["state_max_abs"] <= 1e-5, runs["state_worst"]
