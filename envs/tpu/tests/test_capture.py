"""The llama3 and Qwen3-MoE debug recipes with the pod recipes' kernels, captured on the tpu device.

The model is built on fake tensors on the ``tpu`` device and its forward and loss are traced with
``make_fx``, as the whole step traces them: every kernel slot goes through torch_tpu's ops (their
fake implementations export the Pallas kernels for the TPU) and the loss comes out as one fp32 value.

Not run here: the backward half of the whole step. PyTorch's autograd engine sizes its per-device
queues from the device count torch_tpu reports, which is 0 without a chip, so any backward over
``tpu`` tensors stops at an internal assertion (engine.cpp) on a chip-less host. Each kernel's
gradient op is checked directly instead (test_kernels.py).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from titanpod.graph.loss_metrics import loss_and_metrics
from titanpod.kernels import SplashConfig, model_ops
from titanpod.recipes import get_recipe
from titanpod.recipes.families import build_model

POD_KERNELS = dataclasses.replace(get_recipe("llama3_8b").kernels, splash=SplashConfig(block_q=128, block_kv=128))
"""The kernels every pod recipe sets (splash, pallas, gmm), with tiles for the debug recipes' 256 tokens."""


def torch_tpu_kernels(graph: torch.fx.GraphModule) -> set[str]:
    """The torch_tpu kernel ops the traced graph calls, by kind (``splash``, ``pallas_ce``, ``gmm``)."""
    kinds = set()
    for node in graph.graph.nodes:
        target = str(node.target)
        if node.op == "call_function" and target.startswith("titanpod.") and "_tpu" in target:
            kinds.add(target.removeprefix("titanpod.").split("_")[0].replace("pallas", "pallas_ce"))
    return kinds


@pytest.mark.parametrize(
    ("recipe_name", "expected"),
    [("llama3_debug", {"splash", "pallas_ce"}), ("qwen3_moe_debug", {"splash", "pallas_ce", "gmm"})],
)
def test_debug_recipe_with_pod_kernels_traces_on_the_tpu_device(recipe_name, expected, tpu_backend):
    recipe = get_recipe(recipe_name)
    batch, seq_len = 2, recipe.data.seq_len
    mode = FakeTensorMode()
    with mode:
        model = build_model(
            recipe.model.family, recipe.model.flavor, model_ops(POD_KERNELS), device=tpu_backend.device_type
        )
        tokens_BS = torch.zeros(batch, seq_len, dtype=torch.long, device="tpu")

    def loss(tokens_BS: torch.Tensor, labels_BS: torch.Tensor) -> torch.Tensor:
        value, _ = loss_and_metrics(model, tokens_BS, labels_BS)
        return value

    graph = make_fx(loss, tracing_mode="fake")(tokens_BS, tokens_BS)
    assert torch_tpu_kernels(graph) == expected
    (output,) = [node for node in graph.graph.nodes if node.op == "output"]
    value = output.args[0]
    value = value[0] if isinstance(value, (tuple, list)) else value
    fake = value.meta["val"]
    assert fake.device.type == "tpu" and fake.shape == () and fake.dtype == torch.float32


def test_the_lanes_compile_backend_is_registered_by_torch_tpu(tpu_backend):
    from torch._dynamo.backends.registry import lookup_backend

    assert tpu_backend.compile_backend == "tpu"
    assert callable(lookup_backend(tpu_backend.compile_backend))
