"""The FLUX transformer with Splash attention in its slot (``kernels.attention splash``) against SDPA.

The small FLUX objective of ``tests.graph.flux_steps`` (two double- and two single-stream blocks; 8 text +
16 image tokens, a length Splash pads to its 128-row tile). Tolerances, fp32:

one forward and backward on the cpu lane (2 samples): loss within 1e-5 relative, each gradient within 1e-4
of its own norm (measured beside the assertion). Training on the xla lane with Splash is checked in
``tests/parallel/test_flux_xla.py``.
"""

from __future__ import annotations

import pytest
import torch

from tests.graph.flux_steps import flux_batches, flux_objective
from titanpod.kernels import KernelConfig, SplashConfig, flux_ops


def loss_and_grads(attention: str) -> tuple[float, dict[str, torch.Tensor]]:
    kernels = KernelConfig(attention=attention, splash=SplashConfig(block_q=128, block_kv=128))  # type: ignore[arg-type]
    model = flux_objective(flux_ops(kernels))
    shared = ("img_ids", "txt_ids")  # position ids have no batch dimension
    batch = {name: value if name in shared else value[:2] for name, value in flux_batches(1)[0].items()}
    loss = model.loss(**batch)
    loss.backward()
    return loss.item(), {name: param.grad.clone() for name, param in model.named_parameters()}


def test_flux_with_splash_equals_sdpa_on_the_cpu_lane():
    splash_loss, splash_grads = loss_and_grads("splash")
    sdpa_loss, sdpa_grads = loss_and_grads("sdpa")
    assert abs(splash_loss - sdpa_loss) <= 1e-5 * abs(sdpa_loss), (splash_loss, sdpa_loss)  # measured: equal
    assert splash_grads.keys() == sdpa_grads.keys()
    for name, want in sdpa_grads.items():
        # measured: worst tensor 5.3e-7 of its norm (double_blocks.0.img_attn.wk.bias); every gradient nonzero
        assert (splash_grads[name] - want).norm() <= 1e-4 * want.norm(), name


def test_flux_refuses_kernels_it_does_not_have():
    with pytest.raises(ValueError, match=r"kernels\.head_loss 'chunked'") as error:
        flux_ops(KernelConfig(head_loss="chunked", expert_matmul="gmm"))
    assert "kernels.expert_matmul 'gmm'" in str(error.value)
    with pytest.raises(ValueError, match=r"kernels\.attention 'cpu_flash'"):
        flux_ops(KernelConfig(attention="cpu_flash"))
