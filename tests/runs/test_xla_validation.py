"""Validation on the xla lane runs on the step's devices, with the parameters where they train.

The step's forward-only program (``XlaStep.held_out_loss``) must give the loss the host model gives with
the same trained weights (``finish()`` then the model run eagerly on the CPU), with the Pallas kernels
(Splash attention, the Pallas loss) compiled into it as in the training step. Off a TPU they run in
interpret mode on the mesh; on a TPU the same program compiles them by Mosaic, where the host model
would have lowered them for the CPU backend (the error a chip run ended with).

One subprocess with 8 host devices (torchax must not load in the pytest process): llama3 debug, fsdp 4
x tp 2, 3 steps of 8 x 128 tokens (Splash tiles are 128); then qwen3_moe debug on one device with scanned layers.
Tolerance (fp32): 1e-5 relative between the two computations of the same loss (they differ only in
the order of float sums and in the kernels against their references).
"""

from __future__ import annotations

import pytest

from tests.conftest import XLA_ENV, run_json_script

SCRIPT = """
import json, torch
from titanpod.device import get_backend
from titanpod.graph import TrainConfig, train
from titanpod.graph.xla import XlaStep
from titanpod.kernels import KernelConfig, model_ops
from titanpod.parallel import ParallelConfig
from titanpod.recipes.families import build_model, sharding_plan
from titanpod.runs.validation import validation_loss

generator = torch.Generator().manual_seed(1)
data = [torch.randint(0, 2048, (8, 129), generator=generator) for _ in range(6)]
train_batches = [(d[:, :-1], d[:, 1:]) for d in data[:3]]
held_out = [(d[:, :-1], d[:, 1:]) for d in data[3:]]
backend = get_backend("xla")
result = {}

def trained(family, kernels, axes, **config):
    model = build_model(family, "debug", model_ops(kernels), device="cpu")
    model.init_weights(0)
    cfg = TrainConfig(steps=3, warmup_steps=1, log_every=3, step_mode="whole_step", **config)
    step = XlaStep(model, cfg, backend, plan=sharding_plan(family) if axes else None, axes=axes)
    train(model, iter(train_batches), cfg, backend, flops_per_token=1.0, step=step)
    return model, cfg, step

def compare(name, family, kernels, axes, **config):
    model, cfg, step = trained(family, kernels, axes, **config)
    before = [array.copy() for array in step.jax_params[:2]]
    on_devices = validation_loss(model, held_out, torch.device("cpu"), cfg, step=step)
    unchanged = all(bool((a == b).all()) for a, b in zip(before, step.jax_params[:2]))
    step.finish()
    host = build_model(family, "debug", model_ops(KernelConfig()), device="cpu")  # the reference ops
    host.load_state_dict(model.state_dict())
    on_host = validation_loss(host, held_out, torch.device("cpu"), cfg)
    result[name] = {"devices": on_devices, "host": on_host, "unchanged": unchanged,
                    "compiled": step.compiled_programs}

axes = ParallelConfig(fsdp=4, tp=2).mesh_axes(8)
splash = KernelConfig(attention="splash", head_loss="pallas")
compare("llama3_splash_fsdp_tp", "llama3", splash, axes, memory_policy="recompute")
compare("qwen3_moe_scan", "qwen3_moe", KernelConfig(), None, scan_layers=True)
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def results() -> dict:
    return run_json_script(SCRIPT, env=XLA_ENV)


@pytest.mark.parametrize("case", ["llama3_splash_fsdp_tp", "qwen3_moe_scan"])
def test_held_out_loss_on_the_devices_equals_the_host_models(results, case):
    figures = results[case]
    assert figures["devices"] == pytest.approx(figures["host"], rel=1e-5)
    assert 0 < figures["devices"] < 20  # a cross-entropy over a 2,048-token vocabulary, not a placeholder


@pytest.mark.parametrize("case", ["llama3_splash_fsdp_tp", "qwen3_moe_scan"])
def test_validating_leaves_the_parameters_and_the_training_program_alone(results, case):
    figures = results[case]
    assert figures["unchanged"]  # not donated: the next step still has its parameters
    assert figures["compiled"] == 1  # the training step was not compiled again for the held-out batches
