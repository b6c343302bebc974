"""Pipeline parallelism (parallel.pp): stage cutting, its refusals, and pipelined training on real processes.

The torchrun cases train the llama3 debug model for 10 steps in fp32 with 2 micro-batches a step and
compare per-step losses with one process training on the same micro-batches: within 1e-5 relative.
"""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from titanpod.graph import TrainConfig
from titanpod.graph.pipeline_step import PipelineStep
from titanpod.parallel import ParallelConfig, PlanError
from titanpod.parallel.torch_executor import pipeline_layout
from titanpod.parallel.torch_executor.pipeline_stages import RankStages, check_pipelinable, cut_stages
from titanpod.recipes.families import build_model, get_flavor

from .test_torchrun import run_worker


def test_stages_keep_the_whole_models_names_and_split_every_parameter_once():
    model = build_model("llama3", "debug")  # 6 layers, on the meta device
    layout = pipeline_layout(ParallelConfig(pp=3), grad_accum_steps=3)
    per_rank = [RankStages(cut_stages(model, layout, rank)) for rank in range(3)]
    names = [[name for name, _ in part.named_parameters()] for part in per_rank]
    assert sorted(name for part in names for name in part) == sorted(name for name, _ in model.named_parameters())
    assert names[0][0] == "tok_embeddings.weight" and all(n.startswith("layers.") for n in names[1])
    assert {n.split(".")[1] for n in names[1]} == {"2", "3"} and names[2][-1] == "output.weight"


def test_interleaved_stages_are_dealt_round_robin():
    model = build_model("llama3", "debug")
    layout = pipeline_layout(ParallelConfig(pp=2, pp_schedule="interleaved_1f1b", pp_stages_per_rank=3), 2)
    stages = cut_stages(model, layout, pp_rank=1)
    assert [stage.index for stage in stages] == [1, 3, 5]
    assert [list(stage.layers) for stage in stages] == [["1"], ["3"], ["5"]]
    assert stages[-1].output is not None and stages[0].tok_embeddings is None


@pytest.mark.parametrize(
    ("config", "accum", "names"),
    [
        (ParallelConfig(pp=2, pp_microbatches=4), 2, "parallel.pp_microbatches"),
        (ParallelConfig(pp=4), 2, "train.grad_accum_steps"),
        (ParallelConfig(pp=2, pp_schedule="interleaved_1f1b"), 3, "a multiple of pp=2"),
        (ParallelConfig(pp=2, pp_stages_per_rank=2), 2, "interleaved_1f1b"),
        (ParallelConfig(pp=2, pp_schedule="interleaved_1f1b", pp_stages_per_rank=1), 2, "pp_stages_per_rank"),
        (ParallelConfig(pp=2, cp=2), 2, "parallel.cp=2"),
    ],
)
def test_layouts_the_schedules_cannot_run_are_refused_naming_the_field(config, accum, names):
    with pytest.raises(PlanError, match=re.escape(names)):
        pipeline_layout(config, accum)


def test_models_a_pipeline_cannot_cut_are_refused():
    layout = pipeline_layout(ParallelConfig(pp=2), 2)
    with pytest.raises(PlanError, match="mixture-of-experts"):
        check_pipelinable(build_model("qwen3_moe", "debug"), layout)
    with pytest.raises(PlanError, match="tied embeddings"):
        check_pipelinable(build_model("qwen3", "debug"), layout)
    with pytest.raises(PlanError, match="6 layers do not divide into 4"):
        check_pipelinable(build_model("llama3", "debug"), pipeline_layout(ParallelConfig(pp=4), 4))
    five = dataclasses.replace(get_flavor("llama3", "debug"), n_layers=5)
    with pytest.raises(PlanError, match=re.escape("parallel.pp")):
        check_pipelinable(build_model("llama3", five), layout)


@pytest.mark.parametrize("mode", ["whole_step", "per_block"])
def test_a_pipeline_step_runs_eager_only(mode):
    with pytest.raises(ValueError, match=re.escape("train.step_mode='eager'")):
        PipelineStep(SimpleNamespace(), TrainConfig(step_mode=mode), backend=None)  # type: ignore[arg-type]


def test_a_stage_computes_what_the_whole_model_does():
    """The stages of one process, run in order, give the model's own loss (no processes needed)."""
    model = build_model("llama3", "debug", device="cpu")
    model.init_weights(0)
    tokens = torch.randint(0, model.args.vocab_size, (2, 16))
    labels = torch.roll(tokens, -1, dims=1)
    layout = pipeline_layout(ParallelConfig(pp=2, pp_schedule="interleaved_1f1b", pp_stages_per_rank=3), 2)
    stages = sorted(cut_stages(model, layout, 0) + cut_stages(model, layout, 1), key=lambda s: s.index)
    x = tokens
    for stage in stages:
        x = stage(x)
    assert stages[-1].loss(x, labels).item() == model.loss(tokens, labels).item()


TWO = ["--pp-microbatches", "2"]
"""Two micro-batches a step, in every run here (pipelined or not)."""

PARITY_CASES = {  # name: (worker arguments, processes, layers of the model); pp2 itself is the module's fixture
    "pp2_fsdp2": (["--pp", "2", "--fsdp", "2"], 4, 6),
    "pp2_tp2": (["--pp", "2", "--tp", "2"], 4, 6),  # with sequence parallelism between the stages
    "pp2_interleaved": (["--pp", "2", "--pp-schedule", "interleaved_1f1b", "--n-layers", "4"], 2, 4),
}


@pytest.fixture(scope="module")
def reference_runs(tmp_path_factory):
    """One process with 4 and with 6 layers, and pp2 with 6, each 10 steps of two micro-batches."""
    folder = tmp_path_factory.mktemp("pipeline")
    runs = {f"single{n}": run_worker(folder / f"single{n}.json", *TWO, "--n-layers", str(n)) for n in (4, 6)}
    runs["pp2"] = run_worker(folder / "pp2.json", *TWO, "--pp", "2", processes=2)
    return {name: run["losses"] for name, run in runs.items()}


def assert_same_losses(got: list[float], want: list[float], name: str) -> None:
    assert len(got) == len(want) == 10, name
    for step, (g, w) in enumerate(zip(got, want, strict=True), 1):
        assert abs(g - w) <= 1e-5 * abs(w), f"{name} step {step}: {g} vs {w}"


@pytest.mark.slow
def test_pipelined_losses_equal_single_process(reference_runs, tmp_path):
    """pp2, pp2 x fsdp2, pp2 x tp2 and interleaved pp2 (2 stages a rank) train as one process does."""
    assert_same_losses(reference_runs["pp2"], reference_runs["single6"], "pp2")
    for name, (args, processes, layers) in PARITY_CASES.items():
        got = run_worker(tmp_path / f"{name}.json", *TWO, *args, processes=processes)["losses"]
        assert_same_losses(got, reference_runs[f"single{layers}"], name)
    assert reference_runs["single6"][-1] < reference_runs["single6"][0]  # it learns


@pytest.mark.slow
def test_pipelined_checkpoint_resumes_and_loads_into_one_process(reference_runs, tmp_path):
    """A pp2 run saved after 5 of 10 steps and resumed gives the uninterrupted run's losses, and its checkpoint
    loads into one process as exactly the weights the pipeline had (gathered from both stages)."""
    whole = reference_runs["pp2"]
    saved = tmp_path / "checkpoint"
    saved.mkdir()
    first = run_worker(
        tmp_path / "first.json", *TWO, "--pp", "2", "--stop-at", "5", "--save-dir", str(saved),
        "--params-out", str(tmp_path / "at5.st"), processes=2,
    )["losses"]  # fmt: skip
    resumed = run_worker(tmp_path / "resumed.json", *TWO, "--pp", "2", "--resume-dir", str(saved), processes=2)
    assert first + resumed["losses"] == whole
    single = run_worker(
        tmp_path / "single.json", *TWO, "--resume-dir", str(saved), "--loaded-params-out", str(tmp_path / "l.st")
    )
    at5, loaded = load_file(tmp_path / "at5.st"), load_file(tmp_path / "l.st")
    assert sorted(at5) == sorted(loaded) and len(at5) == 57
    assert all(torch.equal(at5[name], loaded[name]) for name in at5)
    assert single["losses"] == pytest.approx(whole[5:], rel=1e-5)


def test_recomputed_stages_give_the_same_gradients():
    """parallel.pp_recompute recomputes each layer in the backward: the same loss and gradients, bit for bit."""
    tokens = torch.randint(0, 1152, (2, 16), generator=torch.Generator().manual_seed(0))
    labels = torch.roll(tokens, -1, dims=1)
    grads = []
    for recompute in (False, True):
        model = build_model("llama3", "debug", device="cpu")
        model.init_weights(0)
        layout = pipeline_layout(ParallelConfig(pp=2, pp_recompute=recompute), 2)
        stages = cut_stages(model, layout, 0) + cut_stages(model, layout, 1)
        x = tokens
        for stage in stages:
            stage.recompute = recompute
            x = stage(x)
        stages[-1].loss(x, labels).backward()
        grads.append({name: p.grad for name, p in model.named_parameters()})
    assert all(torch.equal(grads[0][name], grads[1][name]) for name in grads[0])
