"""AdamW as one program through torch_tpu's ``jax_op`` (``titanpod.graph.adamw_program``), checked without a chip:
the op's schema (lists of tensors, then 0-d tensors, a list out), which arguments torch_tpu is told to donate, and
the fake outputs torch_tpu computes by exporting the program for the TPU platform. That it runs, and how fast, is
for the chip (docs/tpu-chip.md)."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from titanpod.graph import TrainConfig
from titanpod.graph.adamw_program import ARRAYS, DONATED, LISTS, AdamWProgram
from titanpod.graph.optimizer import AdamWState, weight_decays


def test_adamw_program_registers_as_one_op_that_donates_the_state_and_returns_its_new_values(tpu_backend):
    config = TrainConfig()
    shapes = [(256, 128), (128,), (512, 128)]
    mode = FakeTensorMode()
    with mode:
        params = [torch.zeros(shape, device="tpu") for shape in shapes]
        grads = [torch.zeros(shape, device="tpu") for shape in shapes]
        state = AdamWState(
            step=torch.zeros((), device="tpu"),
            exp_avg=[torch.zeros(shape, device="tpu") for shape in shapes],
            exp_avg_sq=[torch.zeros(shape, device="tpu") for shape in shapes],
        )
        program = AdamWProgram(config, weight_decays(params, config))
        outputs = program.program(params, grads, state.exp_avg, state.exp_avg_sq, state.step,
                                  torch.zeros((), device="tpu"), torch.zeros((), device="tpu"))  # fmt: skip

    namespace, name = program.program.name.split("::")
    schema = str(getattr(getattr(torch.ops, namespace), name).default._schema)
    arguments = ", ".join([*(f"Tensor[] {n}" for n in LISTS), *(f"Tensor {n}" for n in ARRAYS)])
    assert schema == f"{program.program.name}({arguments}) -> Tensor[]"
    assert sorted(program.program._tpu_op._init_fn.donate_argnums) == sorted(
        [*LISTS, *ARRAYS].index(n) for n in DONATED
    )

    assert len(outputs) == 3 * len(shapes) + 2
    for out, shape in zip(outputs, [*shapes, *shapes, *shapes], strict=False):
        assert out.device.type == "tpu" and tuple(out.shape) == shape and out.dtype == torch.float32
    step, applied = outputs[-2:]
    assert step.shape == () and step.dtype == torch.float32
    assert applied.shape == () and applied.dtype == torch.bool
