"""Each Pallas kernel compiled by Mosaic for a TPU (libtpu, a v5p:2x2x2 topology, no chip needed),
forward and backward, with the flops its compiled program declares.

Each kernel's forward and gradient (``jax.value_and_grad`` of the sum of its output) is jitted on
abstract v5p devices, on one and on four of them, the four through the kernel's ``shard`` rule under
``jax.set_mesh`` as the xla lane's step runs it. Each Pallas call is a Mosaic kernel (a
``tpu_custom_call`` in the lowered program; interpret mode would leave none), and libtpu compiles it. A Pallas
call adds to ``cost_analysis`` only the cost estimate it declares, so the compiled flops per chip are
checked against the analytic count of the kernel's forward and backward, within ``FLOPS_TOLERANCE``:

- Splash, causal: forward 4 B H (S^2 / 2) D (QK^T and PV over the unmasked half); backward 7/2 of
  that (its dq kernel recomputes QK^T, then dP and dQ; its dkv kernel recomputes QK^T, then dV, dP
  and dK). The kernel does whole diagonal tiles: with S / tile = 8 tiles a row it does 36 of 64
  tiles, 9/8 of the half. Document (segment) ids mask inside tiles and skip none.
- The fused loss: 10 N V M (forward logits 2 N V M; each of its two gradient kernels recomputes the
  logits and multiplies back, 4 N V M each).
- The grouped matmul: 6 T I O (gmm forward; gmm and tgmm backward); megablox declares its own cost.

Measured (flops per chip over the analytic count, one chip and four): Splash causal and with document
ids 1.126 (the diagonal tiles' 9/8, and XLA's own elementwise work); the loss 1.000; gmm 1.001 and 1.003.

Legend: B batch, H query heads, K key/value heads, S sequence, D head dim, N rows, M model width,
V vocabulary, E experts, C rows per expert, T = E x C, I/O expert input/output width.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from titanpod.kernels import GroupedMatmulConfig, PallasLossConfig, SplashConfig
from titanpod.kernels.grouped_matmul import MegabloxGroupedMatmul
from titanpod.kernels.jax_custom_op import JaxOp, pallas_interpret
from titanpod.kernels.pallas_loss import PallasLinearCrossEntropy
from titanpod.kernels.splash import SplashAttention

# Compiling only: no chip is opened, so several test processes on one host may load libtpu at once.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

FLOPS_TOLERANCE = 0.25
"""Compiled flops per chip within 25% of the analytic count (XLA's own elementwise work is in them too)."""

BF16 = jnp.bfloat16
B, H, K, S, D = 2, 4, 2, 1024, 128
N, M, V = 2048, 256, 4096
E, C, I, O = 4, 256, 256, 512  # noqa: E741 - I is the legend's input width


@dataclass
class Case:
    """A kernel, its inputs (shape, dtype, spec on the four-chip mesh), that mesh's axes and the analytic
    flops of its forward and backward over all chips."""

    kernel: Any
    inputs: list[tuple[tuple[int, ...], Any, P]]
    axes: tuple[str, str]
    flops: float
    pallas_calls: int
    """Pallas calls in forward and backward: each is one ``tpu_custom_call`` once Mosaic has lowered it."""


CAUSAL_SPLASH_FLOPS = 4 * B * H * (S * S / 2) * D * (1 + 7 / 2)


def cases() -> dict[str, Case]:
    splash = SplashConfig(block_q=128, block_kv=128, interpret=False)
    rows, kv_rows = P("fsdp", "tp", None, None), P("fsdp", "tp", None, None)
    attention = [((B, H, S, D), BF16, rows), ((B, K, S, D), BF16, kv_rows), ((B, K, S, D), BF16, kv_rows)]
    return {
        "splash_causal_gqa": Case(SplashAttention(splash), attention, ("fsdp", "tp"), CAUSAL_SPLASH_FLOPS, 3),
        "splash_documents": Case(
            kernel=SplashAttention(splash),
            inputs=[*attention, ((B, S), jnp.int32, P("fsdp", None))],
            axes=("fsdp", "tp"),
            flops=CAUSAL_SPLASH_FLOPS,
            pallas_calls=3,
        ),
        "pallas_loss": Case(
            kernel=PallasLinearCrossEntropy(PallasLossConfig(interpret=False)),
            inputs=[((N, M), BF16, P("fsdp", None)), ((V, M), BF16, P()), ((N,), jnp.int32, P("fsdp"))],
            axes=("fsdp", "tp"),
            flops=10 * N * V * M,
            pallas_calls=3,
        ),
        "gmm": Case(
            kernel=MegabloxGroupedMatmul(GroupedMatmulConfig(interpret=False)),
            inputs=[((E, C, I), BF16, P("ep", "fsdp", None)), ((E, O, I), BF16, P("ep", None, None))],
            axes=("ep", "fsdp"),
            flops=6 * E * C * I * O,
            pallas_calls=3,
        ),
    }


@pytest.fixture(scope="module")
def v5p_devices() -> list[Any]:
    """The eight abstract devices of a v5p:2x2x2 slice (megacore: one device a chip)."""
    from jax.experimental import topologies

    return topologies.get_topology_desc(
        platform="tpu", topology_name="v5p:2x2x2", chip_config_name="megacore",
        chips_per_host_bounds=(2, 2, 1), num_slices=1,
    ).devices  # fmt: skip


def registered_op(kernel: Any, inputs: list[tuple[tuple[int, ...], Any, P]]) -> JaxOp:
    """The kernel's op for these inputs: the kernel called once on meta tensors registers it."""
    torch_dtypes = {BF16: torch.bfloat16, jnp.int32: torch.int64}
    meta = [torch.zeros(shape, dtype=torch_dtypes[dtype], device="meta") for shape, dtype, _ in inputs]
    kernel(*meta)
    (op,) = kernel._ops.values()
    return op


def lower_for_tpu(op: JaxOp, case: Case, mesh: Mesh) -> Any:
    """``value_and_grad`` of the sum of the op's output, lowered for ``mesh``'s chips."""
    floating = tuple(i for i, (_, dtype, _) in enumerate(case.inputs) if dtype == BF16)

    def total(*arrays: Any) -> Any:
        return op.in_jax(*arrays).astype(jnp.float32).sum()

    def spec(full: P) -> P:
        return full if mesh.size > 1 else P()

    args = [jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec(full)))
            for shape, dtype, full in case.inputs]  # fmt: skip
    with jax.set_mesh(mesh):
        return jax.jit(jax.value_and_grad(total, argnums=floating)).lower(*args)


@pytest.mark.parametrize("chips", [1, 4])
@pytest.mark.parametrize("name", list(cases()))
def test_kernel_compiles_by_mosaic_for_a_tpu_and_declares_its_flops(name, chips, v5p_devices):
    case = cases()[name]
    op = registered_op(case.kernel, case.inputs)
    devices = np.array(v5p_devices[:chips])
    mesh = Mesh(devices.reshape(1) if chips == 1 else devices.reshape(2, 2), case.axes[:1] if chips == 1 else case.axes)
    lowered = lower_for_tpu(op, case, mesh)
    # Each Pallas call lowered to a Mosaic kernel; compiling it (libtpu's Mosaic compiler) raises if it cannot.
    assert lowered.as_text().count("stablehlo.custom_call @tpu_custom_call") == case.pallas_calls
    compiled = lowered.compile()

    # Per chip: the kernel's work is split over all four chips, or over the two along the
    # data axis where the other (the loss's tp) repeats it.
    sharing = 1 if chips == 1 else (2 if name == "pallas_loss" else 4)
    costs = compiled.cost_analysis()
    ratio = costs["flops"] / (case.flops / sharing)
    print(f"{name} on {chips} chip(s): flops / analytic {ratio:.4f}, estimated {costs['optimal_seconds'] * 1e6:.0f} us")
    assert abs(ratio - 1) <= FLOPS_TOLERANCE, f"{name}: compiled flops {ratio:.3f}x the analytic count"


def test_kernels_under_a_tpu_mesh_compile_unless_told_to_interpret(v5p_devices):
    mesh = Mesh(np.array(v5p_devices[:1]), ("fsdp",))
    cpu = torch.device("cpu")
    assert pallas_interpret(None, cpu)  # this host's JAX backend is the CPU
    with jax.set_mesh(mesh):
        assert not pallas_interpret(None, cpu)
        assert pallas_interpret(True, cpu)
