"""The xla lane on a TPU chip: each decoder family trains with the Pallas kernels in its step, validates, saves,
stops and resumes bit for bit, and exports weights that transformers reloads to the same logits.

Each run is ``titanpod-pretrain`` called in this process (one program holds the chip): the family's debug recipe
on the xla lane with Splash attention and the Pallas loss (and gmm for the MoE family), 10 steps, checkpoints
at steps 5 and 10, validation at the end, Hugging Face export. Tolerances: a resumed run's losses and weights
equal the uninterrupted run's exactly (the same programs on the same chip from the same saved state); the
reloaded Hugging Face model's logits agree with titanpod's own model on the CPU to 1e-4 of their largest
magnitude (float32, the same weights); the loss with the logits kept for the backward starts equal to the loss
without (the forward is the same kernel) and stays within 2% over 10 bf16 steps.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.chip

KERNELS = ["--kernels.attention", "splash", "--kernels.head-loss", "pallas"]
FAMILIES = {
    "llama3_debug": KERNELS,
    "qwen3_debug": KERNELS,
    "qwen3_moe_debug": [*KERNELS, "--kernels.expert-matmul", "gmm"],
}
RUN = ["--device.lane", "xla", "--train.steps", "10", "--train.warmup-steps", "2", "--train.log-every", "1",
       "--checkpoint.every", "5", "--checkpoint.no-async-save", "--checkpoint.export-hf",
       "--data.validation-fraction", "0.1", "--data.validation-batches", "2"]  # fmt: skip


def pretrain(runs: Path, name: str, recipe: str, *flags: str) -> int:
    """``titanpod-pretrain`` in this process; its exit code."""
    from titanpod.pretrain.cli import main

    return main(["--recipe", recipe, *FAMILIES[recipe], *RUN, "--output.runs-dir", str(runs),
                 "--output.run-name", name, *flags])  # fmt: skip


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def step_losses(run: Path) -> dict[int, float]:
    return {row["step"]: row["loss"] for row in rows(run) if "loss" in row}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chip-runs")


@pytest.fixture(scope="module")
def whole(runs: Path) -> dict[str, Path]:
    """Each family's uninterrupted 10-step run."""
    done = {}
    for recipe in FAMILIES:
        assert pretrain(runs, f"{recipe}-whole", recipe) == 0
        done[recipe] = runs / f"{recipe}-whole"
    return done


@pytest.mark.parametrize("recipe", list(FAMILIES))
def test_a_run_with_the_pallas_kernels_trains_validates_and_keeps_everything(whole, recipe):
    run = whole[recipe]
    losses = step_losses(run)
    assert sorted(losses) == list(range(1, 11)) and all(math.isfinite(v) for v in losses.values())
    assert losses[10] < losses[1]
    validation = [row["validation_loss"] for row in rows(run) if "validation_loss" in row]
    assert len(validation) == 1 and math.isfinite(validation[0])
    for step in (5, 10):
        assert (run / "checkpoints" / f"step-{step:06d}" / "COMMITTED").is_file()
    assert (run / "model" / "model.safetensors").is_file() and (run / "hf" / "config.json").is_file()


@pytest.mark.parametrize("recipe", list(FAMILIES))
def test_a_stopped_run_resumes_to_the_same_losses_and_weights_bit_for_bit(whole, runs, recipe):
    name = f"{recipe}-stopped"
    assert pretrain(runs, name, recipe, "--train.stop-at-step", "5") == 0
    assert pretrain(runs, name, recipe) == 0  # the same command resumes from step 5
    assert step_losses(runs / name) == step_losses(whole[recipe])
    from safetensors.torch import load_file

    resumed, uninterrupted = (load_file(p / "model" / "model.safetensors") for p in (runs / name, whole[recipe]))
    assert resumed.keys() == uninterrupted.keys()
    assert all(torch.equal(resumed[key], uninterrupted[key]) for key in resumed)


@pytest.mark.parametrize("recipe", ["llama3_debug", "qwen3_debug"])
def test_the_exported_weights_reload_in_transformers_to_titanpods_logits(whole, recipe):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from titanpod.recipes import get_recipe
    from titanpod.recipes.families import build_model

    run = whole[recipe]
    ours = build_model(get_recipe(recipe).model.family, "debug", device="cpu")
    ours.load_state_dict(load_file(run / "model" / "model.safetensors"))
    theirs = AutoModelForCausalLM.from_pretrained(run / "hf", dtype=torch.float32).eval()
    tokens = torch.randint(0, ours.args.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, got = ours(tokens), theirs(tokens).logits
    assert (got - expected).abs().max() <= 1e-4 * expected.abs().max()


def test_keeping_the_logits_for_the_backward_trains_like_recomputing_them(whole, runs):
    assert pretrain(runs, "kept-logits", "llama3_debug", "--kernels.pallas-loss.keep-logits") == 0
    kept, recomputed = step_losses(runs / "kept-logits"), step_losses(whole["llama3_debug"])
    assert kept[1] == pytest.approx(recomputed[1], rel=1e-5)
    assert all(kept[s] == pytest.approx(recomputed[s], rel=2e-2) for s in recomputed)


def test_the_kernels_inside_the_step_train_like_the_xla_references(whole, runs):
    """The same 10 steps with SDPA and the reference loss (XLA's own attention and cross-entropy) in place of Splash
    and the Pallas loss: bf16 steps, so the losses agree to 1% at the first step and 2% over the run."""
    from titanpod.pretrain.cli import main

    reference = ["--kernels.attention", "sdpa", "--kernels.head-loss", "reference"]
    assert main(["--recipe", "llama3_debug", *RUN, *reference, "--output.runs-dir", str(runs),
                 "--output.run-name", "references"]) == 0  # fmt: skip
    theirs, ours = step_losses(runs / "references"), step_losses(whole["llama3_debug"])
    assert ours[1] == pytest.approx(theirs[1], rel=1e-2)
    assert all(ours[s] == pytest.approx(theirs[s], rel=2e-2) for s in theirs)


PALLAS_CASES = ["splash_causal", "splash_full", "splash_full_ragged", "pallas_loss", "pallas_loss_kept", "gmm"]
"""``tools/bench/pallas_on_tpu.py``'s cases, one test each: on a chip each compiles and runs its float32 reference at
the kernel's real shape, and the six together outlast one 10-minute call."""


@pytest.mark.parametrize("case", PALLAS_CASES)
def test_each_pallas_kernel_matches_its_float32_reference_forward_and_backward(case):
    """The bench's case at its real shape, compiled by Mosaic, within its dtype's bound (bf16: 2e-2 of the
    reference's largest magnitude for outputs, 4e-2 for gradients)."""
    import importlib.util
    import sys

    from tests.chip.conftest import ON_CPU

    bench_path = Path(__file__).resolve().parents[2] / "tools" / "bench" / "pallas_on_tpu.py"
    spec = importlib.util.spec_from_file_location("pallas_on_tpu", bench_path)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up by name
    spec.loader.exec_module(bench)
    (result,) = bench.main(["--reps", "2", "--only", case, *(["--interpret", "--tiny"] if ON_CPU else [])])
    assert result.failure is None and result.passed, (result.name, result.failure, result.errors)
