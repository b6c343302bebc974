"""bf16 autocast on the xla lane: the torch functions torchax runs itself are cast like the aten matmuls.

In a subprocess: torchax must not load in the test process (tests.conftest.XLA_ENV)."""

from tests.conftest import XLA_ENV, run_json_script

SCRIPT = """
import json, torch, torchax
import torch.nn.functional as F
from torchax import amp
from titanpod.graph.xla.precision import bf16_autocast

before = dict(amp.autocast_policy)
env = torchax.default_env()
with env:
    x = torch.randn(2, 4, 8, 16, device="jax")
    weight = torch.randn(32, 16, device="jax")
    with bf16_autocast():
        projected = F.linear(x, weight)
        attended = F.scaled_dot_product_attention(x, x, x, is_causal=True)
        contracted = torch.einsum("bhsd,ed->bhse", x, weight)
        joined = torch.cat((x, x.to(torch.bfloat16)), dim=-1)  # cat promotes by itself
    outside = F.linear(x, weight)
    error = (projected.float() - outside).abs().max().item() / outside.abs().max().item()
dtypes = [str(t.dtype) for t in (projected, attended, contracted, joined, outside)]
print(json.dumps({"dtypes": dtypes, "error": error, "table_restored": amp.autocast_policy == before}))
"""


def test_projections_attention_and_einsum_run_in_bf16_and_the_table_is_restored():
    got = run_json_script(SCRIPT, env=XLA_ENV)
    assert got["dtypes"][:3] == ["torch.bfloat16"] * 3
    assert got["dtypes"][3:] == ["torch.float32"] * 2  # cat of mixed dtypes promotes; outside the context fp32
    assert 0 < got["error"] < 2e-2  # bf16 inputs: rounded, and no further
    assert got["table_restored"]
