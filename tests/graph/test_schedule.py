"""Learning-rate schedule against values worked out by hand."""

import math

import pytest

from titanpod.graph import TrainConfig, lr_multiplier


def test_warmup_then_cosine_to_the_floor():
    config = TrainConfig(steps=14, warmup_steps=4, decay="cosine", min_lr_ratio=0.1)
    assert [lr_multiplier(s, config) for s in (1, 2, 4)] == [0.25, 0.5, 1.0]
    # step 9 is halfway through the 10 decay steps: cos(pi/2) = 0 -> 0.1 + 0.9 * 0.5
    assert lr_multiplier(9, config) == pytest.approx(0.55)
    assert lr_multiplier(14, config) == pytest.approx(0.1)
    assert lr_multiplier(6, config) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.2)))


def test_linear_and_constant_decay():
    linear = TrainConfig(steps=10, warmup_steps=0, decay="linear", min_lr_ratio=0.0)
    assert [lr_multiplier(s, linear) for s in (1, 5, 10)] == pytest.approx([0.9, 0.5, 0.0])
    constant = TrainConfig(steps=10, warmup_steps=2, decay="constant")
    assert [lr_multiplier(s, constant) for s in (1, 2, 3, 10)] == [0.5, 1.0, 1.0, 1.0]


def test_bad_schedules_are_rejected_with_the_field_name():
    with pytest.raises(ValueError, match=r"train.warmup_steps"):
        TrainConfig(steps=5, warmup_steps=5)
    with pytest.raises(ValueError, match=r"train.decay"):
        TrainConfig(decay="exponential")
    with pytest.raises(ValueError, match=r"train.steps"):
        TrainConfig(steps=0)
