"""A whole step can leave AdamW to run after its compiled program (``TrainConfig.whole_step_update``).

On the tpu lane torch_tpu's ``torch.compile`` backend donates no input, so a program that updated the parameters
and moments in place would hold them twice (on a v5e, Qwen 3 0.6B's step asked for 15.83 GiB of temporaries where
the xla lane's asks for 9.80). With the update after the program, the program returns the gradients and the
eager step's AdamW applies them in place. Tolerances (fp32, cpu lane): the captured graph run op by op and the
eager AdamW perform the same ops in the same order, so the run equals the update inside the program exactly;
compiled by inductor (which fuses the update differently) to 1e-6 relative in the losses and 5e-5 in the
parameters after 10 steps, as the step modes' own tests allow.
"""

from __future__ import annotations

import pytest
import torch

from tests.graph.test_step_modes import (
    PoisonedLoss,
    batches_with_poison_at,
    debug_model,
    max_param_difference,
    one_batch_repeated,
    random_batches,
    run,
    tiny_model,
)
from titanpod.device import get_backend
from titanpod.device.backends.tpu import TpuBackend
from titanpod.graph import TrainConfig
from titanpod.graph.capture import step_outputs
from titanpod.graph.steps import WholeStep, update_after_program


@pytest.mark.parametrize("policy", ["save", "recompute"])
def test_the_update_after_the_captured_program_trains_exactly_like_the_update_inside_it(policy):
    inside_model, after_model = debug_model(), debug_model()
    common = {"step_mode": "whole_step", "memory_policy": policy, "compiler": "none"}
    inside = run(inside_model, one_batch_repeated(2048), whole_step_update="in_program", **common)
    after = run(after_model, one_batch_repeated(2048), whole_step_update="after_program", **common)
    assert after.losses == inside.losses and inside.losses[-1] < inside.losses[0]
    assert max_param_difference(after_model, inside_model) == 0.0


def test_the_compiled_program_with_the_update_after_it_matches_the_update_inside_it():
    inside_model, after_model = tiny_model(), tiny_model()
    inside = run(inside_model, random_batches(64), step_mode="whole_step", whole_step_update="in_program")
    after = run(after_model, random_batches(64), step_mode="whole_step", whole_step_update="after_program")
    assert after.losses == pytest.approx(inside.losses, rel=1e-6)
    assert max_param_difference(after_model, inside_model) < 5e-5


def test_a_nan_step_is_still_skipped_with_the_update_after_the_program():
    constant = {"warmup_steps": 0, "decay": "constant", "compiler": "none", "step_mode": "whole_step",
                "whole_step_update": "after_program"}  # fmt: skip
    poisoned, clean = PoisonedLoss(), PoisonedLoss()
    summary = run(poisoned, batches_with_poison_at(2), steps=5, **constant)
    reference = run(clean, batches_with_poison_at(None), steps=4, **constant)
    assert summary.skipped_steps == [3]
    assert summary.losses[:2] + summary.losses[3:] == reference.losses
    assert max_param_difference(poisoned, clean) == 0.0


def test_the_program_without_the_update_returns_the_gradients_and_leaves_the_state_alone():
    model = tiny_model()
    step = WholeStep(model, TrainConfig(step_mode="whole_step", whole_step_update="after_program"), get_backend("cpu"))
    tokens = torch.randint(0, 64, (1, 2, 16), generator=torch.Generator().manual_seed(0))
    graph = step.prepare(tokens, tokens)
    grads = step_outputs(graph.graph)[1]
    assert len(grads) == len(list(model.parameters()))

    def writes(graph) -> list[str]:  # ops that write into their arguments (in place), by name
        targets = (str(node.target) for node in graph.graph.nodes if node.op == "call_function")
        return [target for target in targets if "." in target and target.split(".")[-2].endswith("_")]

    assert writes(graph) == []  # no AdamW: nothing writes into the parameters or moments
    with_update = WholeStep(tiny_model(), TrainConfig(step_mode="whole_step"), get_backend("cpu")).prepare(
        tokens, tokens
    )
    assert "titanpod.fused_adamw_.default" in writes(with_update)


def test_auto_updates_after_the_program_only_where_the_lanes_compile_donates_no_input():
    auto = TrainConfig(step_mode="whole_step")
    assert not TpuBackend.compiled_step_donates_inputs
    assert update_after_program(auto, TpuBackend) and not update_after_program(auto, get_backend("cpu"))
    inside = TrainConfig(step_mode="whole_step", whole_step_update="in_program")
    assert not update_after_program(inside, TpuBackend)
    with pytest.raises(ValueError, match="whole_step_update"):
        TrainConfig(whole_step_update="later")
