"""gmm's whole-expert-MLP op (``MegabloxGroupedMatmul.swiglu``) on the xla lane over a mesh (fsdp 4 x ep 2 on 8
host devices): each expert's rows travel to the ep rank holding its weights once for gate, up and down, and the
results come back once.

The buffers are laid out as the MoE layer routes them (every data shard's rows of every expert); the op under
``jax.jit`` (forward, and gradients of a fixed random projection of its output) is checked against the PyTorch
reference (``swiglu_experts``: three ``torch.bmm``) on the CPU, fp32, outputs to 2e-5 and gradients to 8e-5 (the
kernel parity tests' tolerances), and its compiled forward holds two all-to-alls where three separate grouped
matmuls hold more.

Legend: E experts, G data shards, C rows per expert a shard, M model width, F expert hidden width.
"""

from __future__ import annotations

import numpy as np
import torch

from tests.conftest import XLA_ENV, run_json_script
from titanpod.models.common.ops import swiglu_experts

E, G, C, M, F = 4, 8, 8, 16, 24

SCRIPT = """
import json
import jax, jax.numpy as jnp, numpy as np, torch, torchax
from jax.sharding import NamedSharding, PartitionSpec as P
from torchax.interop import jax_view, torch_view
from titanpod.kernels import GroupedMatmulConfig, MegabloxGroupedMatmul
from titanpod.models.common.ops import swiglu_experts
from tests.kernels.test_moe_exchange import inputs

gmm = MegabloxGroupedMatmul(GroupedMatmulConfig(tile_rows=8, tile_in=8, tile_out=8))
mesh = jax.sharding.Mesh(np.asarray(jax.devices()).reshape(4, 2), ("fsdp", "ep"))  # as the xla step builds it
arrays = [jnp.asarray(t.numpy()) for t in inputs()]
probe = arrays.pop()

def output(whole_mlp, *arrays):
    tensors = torch_view(list(arrays))
    out = gmm.swiglu(*tensors) if whole_mlp else swiglu_experts(*tensors, expert_matmul=gmm)
    return jax_view(out)

with jax.set_mesh(mesh), torchax.default_env():
    rows = NamedSharding(mesh, P(None, ("fsdp", "ep"), None))  # each data shard's rows of every expert
    experts = NamedSharding(mesh, P("ep", None, None))
    placed = [jax.device_put(arrays[0], rows), *(jax.device_put(a, experts) for a in arrays[1:])]
    forward = jax.jit(lambda *a: output(True, *a))
    grads = jax.jit(jax.grad(lambda *a: (output(True, *a) * probe).sum(), argnums=(0, 1, 2, 3)))(*placed)
    all_to_alls = {
        kind: jax.jit(lambda *a: output(kind == "whole_mlp", *a)).lower(*placed).compile().as_text().count(
            "all-to-all(")
        for kind in ("whole_mlp", "three_matmuls")
    }
    print(json.dumps({"out": np.asarray(forward(*placed)).tolist(), "grads": [np.asarray(d).tolist() for d in grads],
                      "all_to_alls": all_to_alls}))
"""


def inputs() -> list[torch.Tensor]:
    """Buffers [E, G x C, M] with empty rows, gate and up weights [E, F, M], down weights [E, M, F] and a probe
    [E, G x C, M] for the gradients, fp32."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(E, G * C, M, generator=g)
    x[:, 5::7] = 0  # rows no token filled
    w1, w3 = (torch.randn(E, F, M, generator=g) * 0.3 for _ in range(2))
    w2 = torch.randn(E, M, F, generator=g) * 0.3
    return [x, w1, w3, w2, torch.randn(E, G * C, M, generator=g)]


def test_whole_expert_mlp_exchanged_once_over_ep_matches_the_reference():
    got = run_json_script(SCRIPT, env=XLA_ENV)
    *tensors, probe = inputs()
    leaves = [t.clone().requires_grad_() for t in tensors]
    want = swiglu_experts(*leaves)
    (want * probe).sum().backward()
    torch.testing.assert_close(torch.tensor(got["out"]), want.detach(), atol=2e-5, rtol=2e-5)
    for grad, leaf in zip(got["grads"], leaves, strict=True):
        torch.testing.assert_close(torch.tensor(grad), leaf.grad, atol=8e-5, rtol=2e-5)
    assert not np.asarray(got["out"])[:, 5::7].any()  # empty rows come back empty
    # rows out and results back, once; three matmuls exchange around each of them
    assert got["all_to_alls"]["whole_mlp"] == 2
    assert got["all_to_alls"]["three_matmuls"] > 2
