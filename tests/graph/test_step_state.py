"""A step's ``state_dict()`` loaded into a fresh step continues exactly where the first one was.

Each case trains a step for two steps, keeps a copy of its state (and, for the torch steps, of
the model's parameters, which those steps update in place), takes a third step, then loads the
copy into a fresh step on a fresh model and takes the same third step: loss, parameters and
optimizer state must agree bit for bit. A fresh step that was not given the state must not
(its AdamW moments start at zero), so the comparison can fail. The xla step runs in a subprocess
with 8 host devices (fsdp=4 x tp=2), as in test_xla_step.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.conftest import XLA_ENV, run_json_script
from tests.graph.test_step_modes import BACKEND, random_batches, tiny_model
from titanpod.graph import TrainConfig, build_step


def cloned(tree: Any) -> Any:
    """A deep copy of nested dicts of tensors."""
    if isinstance(tree, dict):
        return {key: cloned(value) for key, value in tree.items()}
    return tree.detach().clone()


def same(a: Any, b: Any) -> bool:
    """Nested dicts of tensors with the same keys and bit-equal tensors."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    return torch.equal(a, b)


@pytest.mark.parametrize("mode", ["eager", "whole_step"])
def test_a_loaded_state_dict_steps_on_like_the_step_it_came_from(mode):
    config = TrainConfig(step_mode=mode, compiler="none")
    batches = random_batches(64)
    first, second, third = ([next(batches)] for _ in range(3))
    model = tiny_model()
    step = build_step(model, config, BACKEND)
    assert step.state_format == "torch"
    step(first, 1e-3)
    step(second, 1e-3)
    saved_state = cloned(step.state_dict())
    saved_params = cloned(dict(model.named_parameters()))
    continued = step(third, 1e-3)

    resumed_model = tiny_model()
    resumed_model.load_state_dict(saved_params)
    resumed = build_step(resumed_model, config, BACKEND)
    resumed.load_state_dict(saved_state)
    assert same(resumed.state_dict(), saved_state)
    out = resumed(third, 1e-3)
    assert torch.equal(out.loss, continued.loss) and torch.equal(out.grad_norm, continued.grad_norm)
    assert same(dict(resumed_model.named_parameters()), dict(model.named_parameters()))
    assert same(resumed.state_dict(), step.state_dict())
    assert float(resumed.state_dict()["step"]) == 3.0

    unloaded_model = tiny_model()
    unloaded_model.load_state_dict(saved_params)
    build_step(unloaded_model, config, BACKEND)(third, 1e-3)
    assert not same(dict(unloaded_model.named_parameters()), dict(model.named_parameters()))


def test_load_state_dict_names_a_missing_or_mis_shaped_entry():
    step = build_step(tiny_model(), TrainConfig(), BACKEND)
    state = cloned(step.state_dict())
    del state["exp_avg"]["norm.weight"]
    state["exp_avg"]["extra.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"missing \[exp_avg / norm\.weight\], unexpected \[exp_avg / extra\.weight\]"):
        step.load_state_dict(state)
    state = cloned(step.state_dict())
    state["exp_avg_sq"]["norm.weight"] = torch.zeros(7)
    with pytest.raises(ValueError, match=r"exp_avg_sq / norm\.weight is float32\[7\] in the state tree; the step"):
        step.load_state_dict(state)
    assert float(step.state_dict()["step"]) == 0.0  # nothing was loaded


XLA_SCRIPT = """
import json
import numpy as np, torch
from titanpod.device import get_backend
from titanpod.graph import TrainConfig
from titanpod.graph.xla import XlaStep
from titanpod.models import DecoderArgs, Transformer
from titanpod.parallel import ParallelConfig
from titanpod.recipes.families import sharding_plan

def tiny_model():
    model = Transformer(DecoderArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_dim=128))
    model.init_weights(0)
    return model

def flat(tree, prefix=""):
    out = {}
    for key, value in tree.items():
        out.update(flat(value, prefix + key + "/") if isinstance(value, dict) else {prefix + key: value})
    return out

def on_host(tree):  # copies: the step donates its arrays to the next step
    return {key: on_host(value) if isinstance(value, dict) else np.array(value) for key, value in tree.items()}

def same(a, b):
    a, b = flat(on_host(a)), flat(on_host(b))
    return sorted(a) == sorted(b) and all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)

generator = torch.Generator().manual_seed(0)
data = [torch.randint(0, 64, (8, 17), generator=generator) for _ in range(3)]
first, second, third = ([(d[:, :-1], d[:, 1:])] for d in data)
backend = get_backend("xla")
axes = ParallelConfig(fsdp=4, tp=2).mesh_axes(8)
config = TrainConfig(step_mode="whole_step")

def new_step():
    return XlaStep(tiny_model(), config, backend, plan=sharding_plan("llama3"), axes=axes)

step = new_step()
result = {"format": step.state_format}
step(first, 1e-3)
step(second, 1e-3)
saved = on_host(step.state_dict())
continued = step(third, 1e-3)
resumed = new_step()
resumed.load_state_dict(saved)
result["loaded_exact"] = same(resumed.state_dict(), saved)
result["sharding_kept"] = str(resumed.state_dict()["optim"]["exp_avg"]["layers.0.attention.wq.weight"].sharding.spec)
out = resumed(third, 1e-3)
result["loss"] = [float(continued.loss), float(out.loss)]
result["state_exact"] = same(resumed.state_dict(), step.state_dict())
result["step_count"] = float(resumed.state_dict()["optim"]["step"])
unloaded = new_step()
unloaded.load_state_dict({**saved, "optim": on_host(new_step().state_dict())["optim"]})
unloaded(third, 1e-3)
result["unloaded_differs"] = not same(unloaded.state_dict()["model"], step.state_dict()["model"])
print(json.dumps(result))
"""


def test_an_xla_step_loaded_from_its_state_dict_steps_on_identically():
    runs = run_json_script(XLA_SCRIPT, env=XLA_ENV)
    assert runs["format"] == "jax"
    assert runs["loaded_exact"] and runs["sharding_kept"] == "P('tp', 'fsdp')"
    first, second = runs["loss"]
    assert first == second
    assert runs["state_exact"] and runs["step_count"] == 3.0
    assert runs["unloaded_differs"]  # the optimizer state matters: the comparison can fail
