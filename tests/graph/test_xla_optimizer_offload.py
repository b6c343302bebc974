"""AdamW's moments in host memory on the xla lane (``train.optimizer_offload``): the same training, with the
moments in JAX's ``pinned_host`` memory between steps and moved to the devices for the update.

On 8 host devices (fsdp=4 x tp=2) the llama3 debug model trains 3 steps with and without the offload from the
same weights and batches: the losses and the parameters are equal bit for bit (the same arithmetic; only where
the moments wait between steps changes). A stopped run with the offload resumes from its checkpoint to the
uninterrupted run's losses. Other lanes refuse the setting before anything is built.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import XLA_ENV, run_json_script
from titanpod.graph import TrainConfig
from titanpod.parallel import ParallelConfig, PlanError
from titanpod.recipes.layout_support import check_layout

SCRIPT = """
import dataclasses, json, jax, numpy as np, torch
from titanpod.device import get_backend
from titanpod.graph import TrainConfig, train
from titanpod.graph.xla import XlaStep
from titanpod.parallel import ParallelConfig
from titanpod.recipes.families import build_model, sharding_plan

generator = torch.Generator().manual_seed(1)
data = [torch.randint(0, 2048, (8, 33), generator=generator) for _ in range(6)]
backend = get_backend("xla")
axes = ParallelConfig(fsdp=4, tp=2).mesh_axes(8)
result = {"like_matches": {}}


def like_matches(step):  # state_like() names state_dict()'s entries with their shapes, dtypes and shardings
    real = jax.tree_util.tree_leaves_with_path(step.state_dict())
    like = jax.tree_util.tree_leaves_with_path(step.state_like())
    return [path for path, _ in real] == [path for path, _ in like] and all(
        (a.shape, a.dtype, a.sharding) == (b.shape, b.dtype, b.sharding) for (_, a), (_, b) in zip(real, like)
    )


for offload in (False, True):
    model = build_model("llama3", "debug", device="cpu")
    model.init_weights(0)
    config = TrainConfig(steps=3, warmup_steps=1, log_every=1, grad_accum_steps=2, step_mode="whole_step",
                         optimizer_offload=offload)
    step = XlaStep(model, config, backend, plan=sharding_plan("llama3"), axes=axes)
    batches = iter([(d[:, :-1], d[:, 1:]) for d in data])
    key = "offload" if offload else "device"
    result[key] = train(model, batches, config, backend, flops_per_token=1.0, step=step).losses
    result[key + "_params"] = [p.detach().clone() for p in model.parameters()]
    result["like_matches"][key] = like_matches(step)
    moments = [m for entry in step.state.exp_avg + step.state.exp_avg_sq for m in (entry if offload else [entry])]
    result[key + "_moment_kinds"] = sorted({m.sharding.memory_kind for m in moments})
    result[key + "_param_kinds"] = sorted({p.sharding.memory_kind for p in step.jax_params})
    result[key + "_moment_specs"] = sorted({str(m.sharding.spec) for m in moments})
# Blocks stacked (train.scan_layers): the checkpoint's tree and a restore keep the moments in host memory, one block
# at a time, and a step after the restore runs (it used to refuse the restored moments' memory).
model = build_model("llama3", "debug", device="cpu")
model.init_weights(0)
config = TrainConfig(steps=3, warmup_steps=1, log_every=1, step_mode="whole_step", optimizer_offload=True,
                     scan_layers=True)
step = XlaStep(model, config, backend, plan=sharding_plan("llama3"), axes=axes)
step([(data[0][:, :-1], data[0][:, 1:])], 1e-3)
tree = step.state_dict()
result["stacked_tree_moment_kinds"] = sorted({m.sharding.memory_kind for m in tree["optim"]["exp_avg"].values()})
step.load_state_dict(tree)
result["stacked_loaded_moment_kinds"] = sorted({m.sharding.memory_kind for entry in step.state.exp_avg for m in entry})
result["stacked_loss_after_restore"] = float(step([(data[1][:, :-1], data[1][:, 1:])], 1e-3).loss)
equal = all(torch.equal(a, b) for a, b in zip(result.pop("device_params"), result.pop("offload_params"), strict=True))
result["params_equal"] = equal


class SmallPieces(XlaStep):
    moment_piece_bytes = 16384  # 4,096 fp32 elements: every large stack and the embedding come in several pieces


# Blocks stacked, the moments in host memory in pieces of the default size (each tensor whole here) and in small
# pieces: the same training and checkpoint, bit for bit.
pieces = {}
overlapping = dataclasses.replace(config, optimizer_offload_overlap=True)
for step_class, step_config, key in ((XlaStep, config, "XlaStep"), (SmallPieces, config, "SmallPieces"),
                                     (SmallPieces, overlapping, "overlap")):
    model = build_model("llama3", "debug", device="cpu")
    model.init_weights(0)
    step = step_class(model, step_config, backend, plan=sharding_plan("llama3"), axes=axes)
    losses = [float(step([(d[:, :-1], d[:, 1:])], 1e-3).loss) for d in data[:3]]
    tree = step.state_dict()
    result["like_matches"][key] = like_matches(step)
    step.load_state_dict(tree)  # split into pieces again, then one more step
    losses.append(float(step([(data[3][:, :-1], data[3][:, 1:])], 1e-3).loss))
    optim = step.state_dict()["optim"]
    pieces[key] = {
        "losses": losses,
        "pieces": sum(len(entry) for entry in step.state.exp_avg),
        "entries": len(step.state.exp_avg),
        "kinds": sorted({m.sharding.memory_kind for entry in step.state.exp_avg for m in entry}),
        "moments": {name: np.asarray(optim["exp_avg_sq"][name]) for name in optim["exp_avg_sq"]},
    }
small, whole = pieces["SmallPieces"], pieces["XlaStep"]
result["pieces_losses"], result["whole_losses"] = small["losses"], whole["losses"]
result["pieces_counts"] = [small["pieces"], small["entries"], whole["pieces"], whole["entries"]]
result["pieces_kinds"] = small["kinds"]
result["overlap_losses"] = pieces["overlap"]["losses"]
result["pieces_moments_equal"] = all(
    pieces[key]["moments"].keys() == whole["moments"].keys()
    and all(np.array_equal(pieces[key]["moments"][name], whole["moments"][name]) for name in whole["moments"])
    for key in ("SmallPieces", "overlap")
)
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def runs() -> dict:
    return run_json_script(SCRIPT, env=XLA_ENV)


def test_moments_in_host_memory_train_bit_for_bit_like_moments_on_the_devices(runs):
    assert len(runs["offload"]) == 3
    assert runs["offload"] == runs["device"]
    assert runs["params_equal"]


def test_the_moments_wait_in_pinned_host_memory_sharded_as_the_parameters(runs):
    assert runs["offload_moment_kinds"] == ["pinned_host"]
    assert runs["device_moment_kinds"] == runs["offload_param_kinds"] == ["device"]
    assert runs["offload_moment_specs"] == runs["device_moment_specs"]
    assert any("fsdp" in spec for spec in runs["offload_moment_specs"])


def test_moments_in_pieces_train_and_checkpoint_bit_for_bit_like_whole_moments_overlapped_or_not(runs):
    pieces, entries, whole_pieces, whole_entries = runs["pieces_counts"]
    assert whole_pieces == whole_entries == entries and pieces > 2 * entries  # the small pieces did split them
    assert runs["pieces_kinds"] == ["pinned_host"]
    assert len(runs["pieces_losses"]) == 4
    assert runs["pieces_losses"] == runs["whole_losses"]
    assert runs["overlap_losses"] == runs["whole_losses"]  # one piece coming in while the one before goes out
    assert runs["pieces_moments_equal"]


def test_a_restore_reads_into_the_states_shapes_and_shardings_without_joining_the_moments(runs):
    # state_like() (what a restore reads into) is state_dict()'s tree as shapes, dtypes and shardings: whole moments
    # and pieces, on the devices and in host memory, blocks stacked or not.
    assert runs["like_matches"] == dict.fromkeys(["device", "offload", "XlaStep", "SmallPieces", "overlap"], True)


def test_stacked_blocks_keep_their_moments_in_host_memory_through_a_checkpoint(runs):
    assert runs["stacked_tree_moment_kinds"] == runs["stacked_loaded_moment_kinds"] == ["pinned_host"]
    assert math.isfinite(runs["stacked_loss_after_restore"])


@pytest.mark.parametrize("lane", ["cpu", "cuda", "tpu"])
def test_a_lane_without_one_jax_program_refuses_the_offload_with_the_fix(lane):
    from titanpod.device import backend_class

    train = TrainConfig(step_mode="whole_step", optimizer_offload=True)
    with pytest.raises(PlanError, match=f"the {lane} lane has no such step: use --device.lane xla"):
        check_layout("pretrain", lane, backend_class(lane), ParallelConfig(), train)


def _pretrain(tmp_path, name: str, *flags: str) -> list[float]:
    command = [sys.executable, "-m", "titanpod.pretrain.cli", "--device.lane", "xla", "--train.optimizer-offload",
               "--train.steps", "4", "--train.warmup-steps", "1", "--train.log-every", "1", "--checkpoint.every", "2",
               "--checkpoint.no-async-save", "--data.validation-every", "0", "--output.runs-dir", str(tmp_path),
               "--output.run-name", name, *flags]  # fmt: skip
    two_devices = XLA_ENV["XLA_FLAGS"].replace("device_count=8", "device_count=2")  # fsdp 2: moments still sharded
    env = {**XLA_ENV, "XLA_FLAGS": two_devices, **_path()}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [row["loss"] for row in rows if "loss" in row]


def _path() -> dict[str, str]:
    import os

    return {key: os.environ[key] for key in ("PATH", "HOME", "XDG_CACHE_HOME") if key in os.environ}


@pytest.mark.slow
def test_a_stopped_run_with_the_moments_in_host_memory_resumes_to_the_same_losses(tmp_path):
    whole = _pretrain(tmp_path, "whole")
    _pretrain(tmp_path, "stopped", "--train.stop-at-step", "2")
    resumed = _pretrain(tmp_path, "stopped")
    assert len(whole) == len(resumed) == 4
    assert resumed == whole


def _llama32_1b_plan(*flags: str) -> Any:
    """The planner's memory for Llama 3.2 1B on one v5e chip, on the xla lane, with ``flags``."""
    from titanpod.device import chip_by_name
    from titanpod.pretrain.command import parse_command
    from titanpod.recipes.planner import plan_run

    base = ["--recipe", "llama3_8b", "--model.flavor", "1B", "--parallel.fsdp", "1", "--device.lane", "xla"]
    return plan_run(parse_command([*base, *flags]).recipe, chip_by_name("TPU v5 lite"), 1, 0.4).memory


def test_the_plan_keeps_the_moments_on_the_host_and_brings_them_in_one_piece_at_a_time():
    shape = ["--data.seq-len", "4096", "--data.batch-size", "2"]
    on_devices = _llama32_1b_plan(*shape)
    offloaded = _llama32_1b_plan(*shape, "--train.optimizer-offload")
    assert offloaded.optimizer == 0 and offloaded.host_offload == on_devices.optimizer + on_devices.host_offload
    # The update streams piece by piece, after the backward has let go of the activations: the largest piece's two
    # fp32 moments in, their new values and its new parameter rows out. Here the largest tensor is a block's MLP
    # matrix, 8192 x 2048, stacked over the 16 blocks (the recipe scans its blocks): 1 GiB a moment, so pieces of at
    # most 256 MiB hold 4 blocks each.
    largest_update = (8 + 8 + 4) * 4 * 8192 * 2048
    assert offloaded.transient == max(on_devices.transient, largest_update - on_devices.activations)
    assert offloaded.total == on_devices.total - on_devices.optimizer + offloaded.transient - on_devices.transient


def test_the_plan_counts_two_pieces_at_once_when_their_trips_overlap():
    shape = ["--data.seq-len", "128", "--data.batch-size", "1"]
    on_devices = _llama32_1b_plan(*shape)
    one = _llama32_1b_plan(*shape, "--train.optimizer-offload")
    two = _llama32_1b_plan(*shape, "--train.optimizer-offload", "--train.optimizer-offload-overlap")
    piece = (8 + 8 + 4) * 4 * 8192 * 2048  # 4 of the 16 stacked MLP matrices, as above
    assert one.transient == max(on_devices.transient, piece - one.activations)
    assert two.transient == max(on_devices.transient, 2 * piece - two.activations) > one.transient
    assert two.total - one.total == two.transient - one.transient


def test_overlapping_the_trips_without_the_offload_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"set --train\.optimizer-offload too"):
        TrainConfig(optimizer_offload_overlap=True)
