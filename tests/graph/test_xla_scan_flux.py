"""``train.scan_layers`` for FLUX: its double- and single-stream block lists each run as one ``lax.scan``, and the
step trains exactly as the unrolled one.

Both steps run in one subprocess on 8 host CPU devices (torchax must not load in the pytest process), fp32,
FSDP over 8, memory policy ``recompute``, on the same 3 steps of named flow-matching batches (random latents,
noise, timesteps and text states) of a debug-width FLUX with 2 double- and 2 single-stream blocks. Tolerances
(fp32), as for the decoders' scan (``test_xla_scan_layers``): losses within 1e-6 relative, every parameter and
AdamW moment within 1e-5 absolute.
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

data = [batch() for _ in range(3)]
backend = get_backend("xla")

def run(scan):
    config = TrainConfig(steps=3, warmup_steps=1, step_mode="whole_step", memory_policy="recompute",
                         scan_layers=scan, weight_decay=0.0)
    transformer = build_flux_transformer(args, device="cpu")
    transformer.init_weights(0)
    with torch.no_grad():  # adaLN-zero starts every block as the identity: move the modulations off zero
        for name, p in transformer.named_parameters():
            if "mod" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)) * 0.02)
    model = FlowMatchingModel(transformer)
    step = XlaStep(model, config, backend, plan=sharding_plan("flux"), axes=ParallelConfig().mesh_axes(8))
    losses = [float(step([b], 1e-3).loss) for b in data]
    state = {}
    def flat(tree, prefix=()):
        for key, value in tree.items():
            if isinstance(value, dict):
                yield from flat(value, (*prefix, key))
            else:
                yield "/".join(map(str, (*prefix, key))), np.asarray(value)
    state = dict(flat(step.state_dict()))
    hlo = step.lower([data[0]]).as_text()
    return losses, state, hlo.count("stablehlo.while"), step

unrolled, scanned = run(False), run(True)
keys = sorted(unrolled[1])
step = scanned[3]
print(json.dumps({
    "losses": [unrolled[0], scanned[0]],
    "same_keys": keys == sorted(scanned[1]),
    "state_max_abs": max(float(np.abs(unrolled[1][k] - scanned[1][k]).max()) for k in keys),
    "moved": float(np.abs(unrolled[1]["model/transformer.single_blocks.1.linear1.weight"]).max()),
    "whiles": [unrolled[2], scanned[2]],
    "lists": [list(item) for item in step.layer_stack.lists],
    "stacked_shape": list(step.jax_params[step.layer_stack.entries.index(
        "transformer.single_blocks.*.linear1.weight")].shape),
}))
"""


@pytest.fixture(scope="module")
def flux_runs() -> dict:
    return run_json_script(SCRIPT, env=XLA_ENV, timeout=900)


@pytest.mark.slow  # compiles two FLUX steps with XLA in a process of its own
def test_scanned_flux_blocks_train_like_unrolled_blocks(flux_runs):
    unrolled, scanned = flux_runs["losses"]
    assert len(unrolled) == 3 and unrolled[0] != unrolled[-1]
    assert scanned == pytest.approx(unrolled, rel=1e-6)
    assert flux_runs["same_keys"]  # checkpoints name every block's parameters, stacked or not
    assert flux_runs["state_max_abs"] <= 1e-5
    assert flux_runs["lists"] == [["transformer.double_blocks", 2], ["transformer.single_blocks", 2]]
    assert flux_runs["stacked_shape"][0] == 2
    assert flux_runs["whiles"][1] > flux_runs["whiles"][0]  # the two lists' loops, forward and backward
