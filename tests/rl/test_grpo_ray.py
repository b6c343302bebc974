"""GRPO's distributed mode on a local Ray cluster: rollout workers are Ray actors in their own processes.

Ray starts once for the module (a local cluster of 2 CPUs); both tests are marked slow because every
worker is a new Python process that imports torch and titanpod.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.rl.test_grpo_run import sft_folder, tiny  # noqa: F401  (sft_folder: a fixture)
from tests.rl.test_rollout import tiny_model
from titanpod.checkpoint import load_model
from titanpod.recipes.posttrain.rollout_config import RolloutConfig
from titanpod.rl.grpo.run import run_grpo
from titanpod.rl.rollout import (
    BuiltinEngine,
    SamplingParams,
    sync_weights,
    trainer_state,
    weights_checksum,
)
from titanpod.rl.rollout.ray_rollout import RayRollout, import_ray, split_evenly

pytestmark = [
    pytest.mark.slow,
    # Ray starts its processes with fork + exec, which JAX (loaded by other tests) warns about; exec replaces the child.
    pytest.mark.filterwarnings(r"ignore:os\.fork\(\) was called:RuntimeWarning"),
]


@pytest.fixture(scope="module")
def ray_cluster():
    ray = import_ray()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


def test_split_evenly_keeps_order_and_drops_empty_blocks():
    assert split_evenly(5, 2) == [(0, 3), (3, 5)]
    assert split_evenly(2, 3) == [(0, 1), (1, 2)]
    assert split_evenly(4, 1) == [(0, 4)]


def test_two_workers_sample_what_one_engine_samples_and_sync_by_checksum(ray_cluster):
    model = tiny_model()
    prompts = [[1, 2, 3], [9, 8, 7, 6, 5], [42], [5, 6], [7, 7, 7]]
    params = SamplingParams(max_new_tokens=6, temperature=1.0, top_p=0.9, seed=3, n=3)
    expected = BuiltinEngine(model).generate(prompts, params)

    with RayRollout(model, workers=2) as rollout:
        assert len({info.pid for info in rollout.infos}) == 2  # two separate worker processes
        assert rollout.checksum() == weights_checksum(trainer_state(model))
        got = rollout.generate(prompts, params)
        assert [(c.prompt_index, c.sample_index, c.token_ids) for c in got] == [
            (c.prompt_index, c.sample_index, c.token_ids) for c in expected
        ]
        for mine, theirs in zip(got, expected, strict=True):
            torch.testing.assert_close(mine.logprobs, theirs.logprobs, rtol=0, atol=1e-5)

        with torch.no_grad():
            model.output.weight.mul_(1.5)
        report = sync_weights(model, rollout, version=1)
        trainer_checksum = weights_checksum(trainer_state(model))
        assert report.checksum == trainer_checksum == rollout.checksum()
        assert report.extra["workers"] == 2 and rollout.weights_version == 1
        assert all(c.weights_version == 1 for c in rollout.generate(prompts[:1], params))
        with pytest.raises(ValueError, match="not newer"):
            sync_weights(model, rollout, version=1)

        ray_cluster.kill(rollout.workers[1])  # a worker that dies is named, not a hang or a bare Ray error
        with pytest.raises(RuntimeError, match="worker failed while sampling"):
            rollout.generate(prompts, params)


def test_one_grpo_step_with_a_ray_rollout_worker_equals_the_local_step(tmp_path, sft_folder, ray_cluster):  # noqa: F811
    def alternating(prompt, completion, answer):
        return float(len(completion) % 2)

    local = tiny(tmp_path, sft_folder, "local", steps=1)
    on_ray = dataclasses.replace(local, rollout=RolloutConfig(mode="ray", workers=1))
    on_ray = dataclasses.replace(on_ray, output=dataclasses.replace(local.output, run_name="ray"))
    local_result = run_grpo(local, reward=alternating)
    ray_result = run_grpo(on_ray, reward=alternating)

    assert "1 Ray rollout worker" in ray_result.rollout
    assert ray_result.steps_done == 1 and ray_result.weights_version == 1
    _, trained = load_model(ray_result.weights_path.parent)
    # The worker reported this checksum after loading version 1; it equals the trainer's saved weights.
    assert ray_result.checksum == weights_checksum(trainer_state(trained))
    assert ray_result.history[0].samples == local_result.history[0].samples
    assert ray_result.history[0].reward_mean == local_result.history[0].reward_mean
    # The old logprobs come from the worker's process, whose float sums may round apart from the driver's
    # (1e-7 or so; the test above allows 1e-5). Through the loss that moves a gradient element by ~1e-11, which is
    # nothing except where an element is itself a near-cancelling sum of order AdamW's eps (1e-8): AdamW's
    # first update there is lr * g / (|g| + eps), which such a change can move by a sizeable fraction of lr
    # (measured: no element apart when run alone; one element of the 78k 1.2e-5 apart, lr * 1.2e-3, in
    # one full-suite run). So: at most one element in a thousand more than 1e-6 apart, none more than lr / 100;
    # a real difference between the two steps moves most elements by about lr.
    _, trained_locally = load_model(local_result.weights_path.parent)
    lr = local.train.lr
    apart, total = 0, 0
    for name, tensor in trainer_state(trained).items():
        torch.testing.assert_close(tensor, trainer_state(trained_locally)[name], rtol=0, atol=lr / 100)
        apart += int(((tensor - trainer_state(trained_locally)[name]).abs() > 1e-6).sum())
        total += tensor.numel()
    assert apart <= total / 1000, f"{apart} of {total} parameter elements more than 1e-6 apart"
