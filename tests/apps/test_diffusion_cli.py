"""titanpod-diffusion end to end: a short flux_debug run writes metrics, sample PNGs and a transformer that
diffusers loads; sampling from the run; the flux1_12b dry run."""

import json
import os
import subprocess
import sys

from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from titanpod.diffusion.cli import main

SHORT = [
    "--train.steps", "6", "--train.warmup-steps", "1", "--train.log-every", "3",
    "--data.resolution", "16", "--data.batch-size", "4", "--data.shapes-count", "32",
    "--samples.prompts", "2", "--samples.steps", "3", "--samples.every", "3",
]  # fmt: skip


def diffusion(*args, cwd):
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "titanpod.diffusion.cli", *args],
        capture_output=True, text=True, cwd=cwd, env=env, timeout=600, check=False,
    )  # fmt: skip


def test_a_short_run_writes_metrics_samples_and_a_diffusers_transformer_then_samples_from_it(tmp_path):
    result = diffusion(*SHORT, "--output.run-name", "short", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = tmp_path / "runs" / "short"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [3, 6] and all(row["loss"] > 0 for row in rows)
    samples = sorted((run_dir / "samples").glob("step-*.png"))
    assert [path.name for path in samples] == ["step-000003.png", "step-000006.png"]
    assert Image.open(samples[-1]).size[0] >= 2 * 16
    assert "titanpod-diffusion summary" in result.stdout
    board = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0})
    board.Reload()
    assert [(image.step, image.encoded_image_string) for image in board.Images("samples")] == [
        (3, samples[0].read_bytes()),
        (6, samples[1].read_bytes()),
    ]  # the grids as TensorBoard images

    from diffusers import FluxTransformer2DModel

    from titanpod.checkpoint.flux_files import load_flux_transformer

    loaded = FluxTransformer2DModel.from_pretrained(run_dir / "transformer")
    ours = load_flux_transformer(run_dir / "transformer")
    assert sum(p.numel() for p in loaded.parameters()) == sum(p.numel() for p in ours.parameters())

    out = tmp_path / "drawn.png"
    drawn = diffusion(
        "sample", "--checkpoint", str(run_dir), "--prompt", "a large red circle on the left", "--steps", "2",
        "--out", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert drawn.returncode == 0, drawn.stdout + drawn.stderr
    assert Image.open(out).size[0] >= 128  # one 16-pixel sample, enlarged to a readable cell


def test_flux1_12b_dry_run_reports_11_9_billion_parameters(capsys):
    assert main(["--recipe", "flux1_12b", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "11,901,408,320 (11.90B)" in out and "fits" in out


def test_recipes_are_listed_and_a_bad_name_gets_the_closest(capsys):
    assert main(["--list-recipes"]) == 0
    listed = capsys.readouterr().out
    assert "flux_debug" in listed and "flux1_12b" in listed
    assert main(["--recipe", "flux_debgu"]) == 2
    assert "Did you mean 'flux_debug'" in capsys.readouterr().err


def test_sampling_from_a_folder_that_is_not_a_run_says_what_it_needs(tmp_path, capsys):
    assert main(["sample", "--checkpoint", str(tmp_path), "--prompt", "x"]) == 1
    assert "needs recipe.json and transformer/" in capsys.readouterr().err


def test_a_run_stopped_and_resumed_ends_with_the_weights_of_an_uninterrupted_one(tmp_path):
    from safetensors.torch import load_file

    base = [SHORT[0], "4", *SHORT[2:], "--samples.every", "0", "--checkpoint.every", "2"]
    straight = diffusion(*base, "--output.run-name", "straight", cwd=tmp_path)
    assert straight.returncode == 0, straight.stdout + straight.stderr
    first = diffusion(*base, "--output.run-name", "split", "--train.stop-at-step", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    second = diffusion(*base, "--output.run-name", "split", cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resumed from" in second.stdout
    weights = "transformer/diffusion_pytorch_model.safetensors"
    expected = load_file(tmp_path / "runs" / "straight" / weights)
    resumed = load_file(tmp_path / "runs" / "split" / weights)
    assert expected.keys() == resumed.keys()
    for name, tensor in expected.items():
        assert resumed[name].equal(tensor), name


def test_attention_kernel_is_chosen_like_titanpod_pretrains_and_kernels_flux_lacks_are_refused(capsys):
    assert main(["--kernels.attention", "splash", "--print-recipe"]) == 0
    assert json.loads(capsys.readouterr().out)["kernels"]["attention"] == "splash"
    assert main(["--recipe", "flux1_12b", "--print-recipe"]) == 0
    assert json.loads(capsys.readouterr().out)["kernels"]["attention"] == "splash"
    assert main(["--kernels.head-loss", "chunked", "--kernels.expert-matmul", "gmm", "--print-recipe"]) == 2
    err = capsys.readouterr().err
    assert "kernels.head_loss 'chunked': FLUX has no vocabulary head" in err
    assert "kernels.expert_matmul 'gmm': FLUX has no experts" in err
