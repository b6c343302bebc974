"""Every parallel layout trains the model one process trains, from the command line, at the same global batch.

The xla lane's layouts run as its one process over 8 host devices (``XLA_FLAGS``), against the cpu lane.

Each layout runs ``titanpod-pretrain`` under torchrun (gloo, 2 or 4 ranks) with ``data.batch_size`` 2 a data
rank; its reference is one process with 2 x the layout's data ranks (``parallel.DATA_AXES``: dp_replicate, fsdp,
ep). Step 1's loss agrees within 1e-6 relative, all 4 steps' within 1e-5, and model.json counts the same tokens.
Sequences are 128 tokens: at 32, the debug recipe's first large AdamW steps enlarge the rounding of a split
sequence to about 1e-5 by step 4 (cp2: 9e-6, cp2 x fsdp2: 1.2e-5, with step 1 within 6e-8), at 128 to 4e-7.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_runs import run_cli

BATCH = 2
"""Sequences a data rank a step."""
RUN = ["--train.steps", "4", "--train.warmup-steps", "1", "--train.log-every", "1", "--data.seq-len", "128",
       "--data.validation-fraction", "0", "--output.no-tensorboard", "--checkpoint.no-at-end"]  # fmt: skip
LAYERS_4 = ["--model.shape.n-layers", "4"]
"""Interleaved pp2 needs the layers in 2 x 2 stages."""
MOE = ["--recipe", "qwen3_moe_debug"]

LAYOUTS = {
    # name: (flags, processes, data ranks, model flags)
    "fsdp2": (["--parallel.fsdp", "2"], 2, 2, []),
    "tp2": (["--parallel.tp", "2"], 2, 1, []),
    "cp2": (["--parallel.cp", "2"], 2, 1, []),
    "pp2": (["--parallel.pp", "2"], 2, 1, []),
    "pp2_interleaved": (["--parallel.pp", "2", "--parallel.pp-schedule", "interleaved_1f1b"], 2, 1, LAYERS_4),
    "ep2_moe": (["--parallel.ep", "2"], 2, 2, MOE),
    "hsdp_2x2": (["--parallel.dp-replicate", "2", "--parallel.fsdp", "2"], 4, 4, []),
    "cp2_fsdp2": (["--parallel.cp", "2", "--parallel.fsdp", "2"], 4, 2, []),
    "pp2_fsdp2": (["--parallel.pp", "2", "--parallel.fsdp", "2"], 4, 2, []),
    "pp2_tp2": (["--parallel.pp", "2", "--parallel.tp", "2"], 4, 1, []),
}


XLA_LAYOUTS = {
    # name: (flags, data ranks, model flags), on the xla lane's one process over 8 host devices
    "xla_fsdp8": (["--parallel.fsdp", "8"], 8, []),
    "xla_fsdp4_tp2": (["--parallel.fsdp", "4", "--parallel.tp", "2"], 4, []),
    "xla_hsdp_2x4": (["--parallel.dp-replicate", "2", "--parallel.fsdp", "4"], 8, []),
    "xla_cp2_fsdp4": (["--parallel.cp", "2", "--parallel.fsdp", "4"], 4, []),
    "xla_ep2_fsdp4_moe": (["--parallel.ep", "2", "--parallel.fsdp", "4"], 8, MOE),
}
"""The xla lane's layouts, each against the cpu lane's one process at the same global batch."""


def rows(run_dir: Path) -> list[dict]:
    """The step rows of a run's metrics.jsonl."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if "loss" in row]


def tokens(run_dir: Path) -> int:
    """The tokens the run trained on, as its model.json says."""
    return json.loads((run_dir / "model" / "model.json").read_text())["about"]["tokens"]


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, ...], Path]:
    """One process's run directory for each (model flags, global batch), made when first asked for."""
    made: dict[tuple[str, ...], Path] = {}
    root = tmp_path_factory.mktemp("one_process")

    class Made(dict):
        def __missing__(self, key: tuple[str, ...]) -> Path:
            name = f"one-{len(made)}"
            *model, batch = key
            done = run_cli(
                "titanpod.pretrain.cli",
                [*model, *RUN, "--data.batch-size", batch, "--output.run-name", name],
                root,
            )
            assert done.returncode == 0, done.stderr[-3000:]
            made[key] = self[key] = root / "runs" / name
            return made[key]

    return Made()


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_layout_from_the_command_line_trains_as_one_process_at_the_same_global_batch(tmp_path, references, layout):
    flags, processes, data_ranks, model = LAYOUTS[layout]
    run = [*model, *RUN, *flags, "--data.batch-size", str(BATCH), "--output.run-name", layout]
    done = run_cli("titanpod.pretrain.cli", run, tmp_path, processes=processes)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    one = references[(*model, str(BATCH * data_ranks))]
    got, want = rows(tmp_path / "runs" / layout), rows(one)
    assert [row["step"] for row in got] == [row["step"] for row in want] == [1, 2, 3, 4]
    assert got[0]["loss"] == pytest.approx(want[0]["loss"], rel=1e-6)
    assert [row["loss"] for row in got] == pytest.approx([row["loss"] for row in want], rel=1e-5)
    assert tokens(tmp_path / "runs" / layout) == tokens(one) == 4 * BATCH * data_ranks * 128


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(XLA_LAYOUTS))
def test_an_xla_layout_trains_as_the_cpu_lanes_one_process_at_the_same_global_batch(
    tmp_path, references, monkeypatch, layout
):
    flags, data_ranks, model = XLA_LAYOUTS[layout]
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    run = [*model, *RUN, "--device.lane", "xla", *flags, "--data.batch-size", str(BATCH), "--output.run-name", layout]
    done = run_cli("titanpod.pretrain.cli", run, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    monkeypatch.delenv("XLA_FLAGS")
    one = references[(*model, str(BATCH * data_ranks))]
    got, want = rows(tmp_path / "runs" / layout), rows(one)
    assert [row["step"] for row in got] == [row["step"] for row in want] == [1, 2, 3, 4]
    assert got[0]["loss"] == pytest.approx(want[0]["loss"], rel=1e-6)
    assert [row["loss"] for row in got] == pytest.approx([row["loss"] for row in want], rel=1e-5)
    assert tokens(tmp_path / "runs" / layout) == tokens(one) == 4 * BATCH * data_ranks * 128
