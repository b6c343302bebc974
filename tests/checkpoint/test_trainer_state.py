"""Trainer-state checkpoints in one process: exact resume, background saves, atomicity, errors."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from titanpod.checkpoint import CheckpointConfig, CheckpointError, complete_checkpoints
from titanpod.recipes import Recipe, get_recipe
from titanpod.recipes.families import decoder_adapters
from titanpod.runs import run_pretraining


def recipe(tmp_path, steps: int, run_name: str = "run", stop_at: int = 0, **checkpoint) -> Recipe:
    base = get_recipe("llama3_debug")
    return dataclasses.replace(
        base,
        train=dataclasses.replace(base.train, steps=steps, warmup_steps=2, log_every=5, stop_at_step=stop_at),
        data=dataclasses.replace(base.data, seq_len=32, batch_size=2),
        output=dataclasses.replace(base.output, runs_dir=str(tmp_path / "runs"), run_name=run_name, tensorboard=False),
        checkpoint=CheckpointConfig(**checkpoint),
    )


def final_weights(result) -> dict[str, torch.Tensor]:
    return load_file(result.weights_path)


@pytest.mark.parametrize("step_mode", ["eager", "whole_step"])
def test_ten_steps_resume_ten_steps_equals_twenty_straight(tmp_path, step_mode):
    def with_mode(r: Recipe) -> Recipe:
        return dataclasses.replace(r, train=dataclasses.replace(r.train, step_mode=step_mode, compiler="none"))

    straight = run_pretraining(with_mode(recipe(tmp_path, 20, "straight", resume="never")))
    first = run_pretraining(with_mode(recipe(tmp_path, 20, "split", stop_at=10)))
    assert [step for step, _ in complete_checkpoints(first.run_dir / "checkpoints")] == [10]
    second = run_pretraining(with_mode(recipe(tmp_path, 20, "split")))
    assert second.summary.start_step == 10 and second.summary.steps_done == 20
    assert first.summary.losses + second.summary.losses == straight.summary.losses  # bit for bit
    ours, theirs = final_weights(second), final_weights(straight)
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)


def test_background_saves_keep_the_last_k_and_the_data_position(tmp_path):
    result = run_pretraining(recipe(tmp_path, 12, every=4, keep_last=2, async_save=True))
    kept = complete_checkpoints(result.run_dir / "checkpoints")
    assert [step for step, _ in kept] == [8, 12]
    trainer = json.loads((kept[0][1] / "trainer.json").read_text())
    assert trainer["step"] == 8 and trainer["data"]["index"] == 8
    assert trainer["recipe"]["train"]["steps"] == 12
    assert not list((result.run_dir / "checkpoints").glob(".*"))  # no staging folder left


def test_an_interrupted_save_is_removed_and_the_previous_checkpoint_used(tmp_path, capsys):
    from rich.console import Console

    run_pretraining(recipe(tmp_path, 4))
    checkpoints = tmp_path / "runs" / "run" / "checkpoints"
    partial = checkpoints / ".step-000006.partial" / "state"
    partial.mkdir(parents=True)
    (partial / "__0_0.distcp").write_bytes(b"half a file")
    result = run_pretraining(recipe(tmp_path, 6), console=Console(width=200))
    out = capsys.readouterr().out
    assert "removed" in out and ".step-000006.partial" in out and "incomplete checkpoint" in out
    assert result.summary.start_step == 4 and len(result.summary.losses) == 2
    assert [step for step, _ in complete_checkpoints(checkpoints)] == [4, 6]


def test_a_truncated_checkpoint_is_named_before_anything_loads(tmp_path):
    run_pretraining(recipe(tmp_path, 3))
    folder = tmp_path / "runs" / "run" / "checkpoints" / "step-000003"
    data_file = next((folder / "state").glob("*.distcp"))
    data_file.write_bytes(data_file.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=r"damaged: state/__0_0\.distcp is 100 bytes instead of"):
        run_pretraining(recipe(tmp_path, 5))


def test_a_checkpoint_of_another_model_is_refused_with_the_difference(tmp_path):
    run_pretraining(recipe(tmp_path, 3))
    other = recipe(tmp_path, 4)
    other = dataclasses.replace(other, model=dataclasses.replace(other.model, family="qwen3"))
    with pytest.raises(CheckpointError, match=r"model\.family: 'llama3' -> 'qwen3'"):
        run_pretraining(other)


def test_resume_must_point_at_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="not a complete checkpoint folder"):
        run_pretraining(recipe(tmp_path, 3, resume=str(tmp_path / "nowhere")))


def test_config_fields_are_checked():
    with pytest.raises(ValueError, match=r"checkpoint\.every"):
        CheckpointConfig(every=-1)


def test_the_final_model_can_also_be_exported_for_hugging_face(tmp_path):
    from titanpod.checkpoint import load_hf_checkpoint

    result = run_pretraining(recipe(tmp_path, 3, export_hf=True))
    loaded = load_hf_checkpoint(result.run_dir / "hf", adapters=decoder_adapters())
    ours = final_weights(result)
    assert loaded.model.state_dict().keys() == ours.keys()
    assert all(torch.equal(loaded.model.state_dict()[name], ours[name]) for name in ours)
