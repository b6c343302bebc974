"""The dry-run planner: published parameter totals, memory accounting, advice, and the prediction
against measured peak memory of real CPU training steps."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
from rich.console import Console

from titanpod.device import chip_by_name
from titanpod.device.chips import GB
from titanpod.kernels import model_ops
from titanpod.pretrain.cli import main
from titanpod.recipes import RECIPES, get_recipe
from titanpod.recipes.families import build_model
from titanpod.recipes.planner import plan_run
from titanpod.recipes.planner.activations import head_saved_bytes
from titanpod.recipes.planner.plan import with_changes
from titanpod.recipes.planner.report import dry_run

GIB = 1024**3

PUBLISHED_BILLIONS = {  # the published totals (shared/REFERENCE.md), to the digits published
    "llama3_8b": (8.030, 3),
    "llama3_70b": (70.554, 3),
    "llama3_405b": (405.853, 3),
    "qwen3_8b": (8.191, 3),
    "qwen3_32b": (32.762, 3),
    "qwen3_235b_a22b": (235.09, 2),
}


def quiet_console() -> Console:
    return Console(file=open(os.devnull, "w"), width=200)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_passes_the_dry_run_on_its_target(name, capsys):
    assert main(["--recipe", name, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "fits" in out and "does not fit" not in out
    plan = dry_run(get_recipe(name), quiet_console())
    if name in PUBLISHED_BILLIONS:
        billions, digits = PUBLISHED_BILLIONS[name]
        assert round(plan.parameters / 1e9, digits) == billions
        assert f"{plan.parameters:,}" in out


def test_moe_plan_counts_active_parameters():
    recipe = get_recipe("qwen3_235b_a22b")
    plan = plan_run(recipe, chip_by_name(recipe.target.chip), recipe.target.chips, 0.4)
    assert round(plan.active_parameters / 1e9, 2) == 22.19  # published: 22.19B active


def test_an_xla_expert_mesh_holds_the_vocabulary_gradients_whole():
    recipe = get_recipe("qwen3_235b_a22b")  # fsdp 16 x ep 8 on a v5p-256
    v5p = chip_by_name("v5p")
    xla = plan_run(with_changes(recipe, device={"lane": "xla"}), v5p, 128, 0.4)
    cpu = plan_run(with_changes(recipe, device={"lane": "cpu"}), v5p, 128, 0.4)
    # an fp32 embedding gradient and a bf16 head gradient, each 151,936 x 4,096 whole
    assert xla.memory.transient - cpu.memory.transient == 151936 * 4096 * (4 + 2)


def test_state_memory_is_each_parameters_share_on_the_mesh():
    recipe = get_recipe("llama3_405b")  # fsdp 64 x tp 8 on 512 chips
    plan = plan_run(recipe, chip_by_name("v5p"), 512, 0.4)
    assert plan.mesh == {"pp": 1, "dp_replicate": 1, "fsdp": 64, "cp": 1, "ep": 1, "tp": 8}
    dim, layers, vocab = 16384, 126, 128256
    fsdp_only = (2 * layers + 1) * dim + 2 * vocab * dim  # norms, embedding and output have no tp dimension
    expected = (plan.parameters - fsdp_only) / 512 + fsdp_only / 64
    assert plan.memory.parameters == pytest.approx(4 * expected, rel=1e-9)
    assert plan.memory.optimizer == 2 * plan.memory.parameters == 2 * plan.memory.gradients
    assert plan.tokens_per_step == 2 * 8192 * 64


def test_context_parallelism_splits_activations_and_counts_the_key_value_traffic():
    recipe = with_changes(get_recipe("llama3_405b"), data={"seq_len": 32768})
    whole = plan_run(recipe, chip_by_name("v5p"), 512, 0.4)
    split = plan_run(with_changes(recipe, parallel={"cp": 2}), chip_by_name("v5p"), 512, 0.4)
    assert split.mesh["cp"] == 2 and split.mesh["fsdp"] == whole.mesh["fsdp"] // 2
    assert split.memory.parameters == whole.memory.parameters  # cp ranks share the parameter shards as fsdp ones
    assert split.tokens_per_step == whole.tokens_per_step // 2  # half the data ranks, rows as long as before
    # recompute keeps each block's input: half the row per device
    assert split.memory.activations == pytest.approx(whole.memory.activations / 2, rel=0.01)
    assert whole.context_parallel_bytes == 0
    # per layer: keys and values of 8 kv heads / tp 8 x 128 dims, bf16, whole rows of 2 x 32768 tokens; half come
    # from the other rank; gathered forward, again in the recomputed forward, and reduce-scattered back
    kv_bytes = 2 * 2 * 32768 * 1 * 128 * 2
    assert split.context_parallel_bytes == 3 * 126 * kv_bytes // 2


def test_the_xla_lane_keeps_block_inputs_whole_over_tp():
    """Sequence parallelism splits what recompute keeps of a block (its input) over tp on the torch lanes; the xla
    lane's step keeps it as the batch is laid out, whole over tp: 126 x 2 x 8192 x 16384 bf16 = 63 GiB for 405B."""
    recipe = get_recipe("llama3_405b")
    assert recipe.parallel.sequence_parallel
    torch_lanes = plan_run(with_changes(recipe, device={"lane": "tpu"}), chip_by_name("v5p"), 512, 0.4)
    xla = plan_run(with_changes(recipe, device={"lane": "xla"}), chip_by_name("v5p"), 512, 0.4)
    block_inputs = 126 * 2 * 8192 * 16384 * 2
    assert xla.memory.activations - torch_lanes.memory.activations == pytest.approx(block_inputs * 7 / 8, rel=1e-6)
    assert xla.memory.parameters == torch_lanes.memory.parameters


def test_memory_policies_order_activation_memory():
    recipe = get_recipe("llama3_8b")
    chip = chip_by_name("v6e")
    totals = {
        policy: plan_run(with_changes(recipe, train={"memory_policy": policy}), chip, 256, 0.4).memory
        for policy in ("save", "selective", "recompute", "offload")
    }
    assert totals["save"].activations > totals["selective"].activations > totals["recompute"].activations
    assert totals["offload"].activations < totals["recompute"].activations
    assert totals["offload"].host_offload > 0 == totals["recompute"].host_offload


def test_step_time_follows_from_flops_and_the_target_mfu():
    recipe = get_recipe("qwen3_8b")
    plan = plan_run(recipe, chip_by_name("v6e"), 64, 0.5)
    flops = plan.flops_per_token * plan.tokens_per_step
    assert plan.step_seconds == pytest.approx(flops / (64 * 918e12 * 0.5))
    assert plan.step_seconds == pytest.approx(plan_run(recipe, chip_by_name("v6e"), 64, 0.25).step_seconds / 2)


def test_a_plan_that_does_not_fit_says_so_and_suggests_changes_that_do(capsys):
    code = main(["--recipe", "llama3_8b", "--dry-run", "--chips", "16", "--train.memory-policy", "save"])
    out = capsys.readouterr().out
    assert code == 1
    assert "does not fit" in out and "Changes that lower it" in out
    row = next(line for line in out.splitlines() if "--train.memory-policy recompute" in line)
    assert "yes" in row


def test_a_mesh_the_model_cannot_split_is_named(capsys):
    assert main(["--recipe", "llama3_405b", "--dry-run", "--chips", "12"]) == 2  # 12 is not a multiple of tp 8
    assert "does not divide into 12 processes" in capsys.readouterr().err


def test_unknown_chip_suggests_the_closest(capsys):
    assert main(["--recipe", "llama3_8b", "--dry-run", "--chip", "v5q"]) == 2
    assert "Did you mean" in capsys.readouterr().err


@pytest.mark.slow
def test_memory_prediction_is_within_15_percent_of_measured_cpu_runs(repo_root):
    """Each debug recipe (and the recompute policy) trains a few steps in a fresh process; the planner's
    per-device total must be within 15% of how far the peak resident memory rose."""
    cases = ["llama3_debug", "qwen3_debug", "qwen3_moe_debug", "llama3_debug whole_step recompute"]
    args = [sys.executable, str(repo_root / "tools" / "bench" / "planner_memory.py"), "--json", "--steps", "2"]
    for case in cases:
        args += ["--case", case]
    out = subprocess.run(args, capture_output=True, text=True, timeout=900, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    results = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["case"] for r in results] == cases
    for result in results:
        assert 0.85 <= result["ratio"] <= 1.15, result


def recorded_console() -> Console:
    return Console(file=open(os.devnull, "w"), width=200, record=True)


def test_llama3_405b_dry_run_states_host_memory_per_worker_vm_and_fits(capsys):
    assert main(["--recipe", "llama3_405b", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "host memory per v5p VM (tpu lane)" in out and "(448 GB)" in out
    assert "4 processes per v5p VM, one per device" in out
    console = recorded_console()
    plan = dry_run(get_recipe("llama3_405b"), console)
    assert plan.host is not None and plan.host.fits is True
    assert plan.host.processes_per_host == 4 and plan.host.host_bytes == 448 * GB
    # the peak: four processes each staging its shard of weights and two moments for the async checkpoint
    assert plan.host.per_host.peak == ("checkpoint", 4 * 3 * plan.memory.parameters)
    peak = plan.host.per_host.peak[1]
    assert f"trainer-state checkpoint: {peak / 1024**3:,.2f} GiB of 417.23 GiB (448 GB)" in console.export_text()


def test_a_worker_vm_too_small_says_so_naming_host_memory_and_the_fix():
    small = dataclasses.replace(chip_by_name("v5p"), host_vm_bytes=40 * GB)  # made up: v5p VMs have 448 GB
    console = recorded_console()
    plan = dry_run(get_recipe("llama3_405b"), console, chip=small)  # async checkpoints stage 38 GiB per VM
    text = console.export_text()
    assert not plan.fits and plan.device_fits and plan.host.fits is False
    assert "does not fit: host memory: a v5p worker VM needs 38.01 GiB at its trainer-state checkpoint" in text
    assert "Fix: --checkpoint.no-async-save writes one tensor at a time" in text
    row = next(line for line in text.splitlines() if line.startswith("│ --checkpoint.no-async-save"))
    assert "yes" in row  # without async saves the peak is the final save's 16 GiB


def test_host_memory_of_a_chip_without_published_vm_figures_is_not_checked():
    console = recorded_console()
    plan = dry_run(with_changes(get_recipe("llama3_8b"), target={"chip": "v4"}), console)
    assert plan.host.fits is None and plan.fits  # unknown is said, not counted as a failure
    assert "host memory of v4 VMs unknown: not checked" in console.export_text()


def _debug_local_numels(args, fsdp: int, tp: int) -> tuple[dict[str, int], dict[str, int]]:
    """Full and per-rank elements of each parameter of a Llama debug model, written out from the plan's
    rules: embedding and output split their width over fsdp; wq, wk, wv, w1, w3 split rows over tp and
    columns over fsdp; wo, w2 split rows over fsdp and columns over tp; norms split over fsdp."""
    M, F, V = args.dim, args.ffn_dim, args.vocab_size
    q, kv = args.n_heads * args.dim // args.n_heads, args.n_kv_heads * args.dim // args.n_heads
    full, local = {}, {}
    for name, (rows, cols, row_split, col_split) in {
        "tok_embeddings.weight": (V, M, 1, fsdp),
        "output.weight": (V, M, 1, fsdp),
        "norm.weight": (M, 1, fsdp, 1),
    }.items():
        full[name], local[name] = rows * cols, (rows // row_split) * (cols // col_split)
    for layer in range(args.n_layers):
        for name, (rows, cols, row_split, col_split) in {
            "attention_norm.weight": (M, 1, fsdp, 1),
            "ffn_norm.weight": (M, 1, fsdp, 1),
            "attention.wq.weight": (q, M, tp, fsdp),
            "attention.wk.weight": (kv, M, tp, fsdp),
            "attention.wv.weight": (kv, M, tp, fsdp),
            "attention.wo.weight": (M, q, fsdp, tp),
            "feed_forward.w1.weight": (F, M, tp, fsdp),
            "feed_forward.w3.weight": (F, M, tp, fsdp),
            "feed_forward.w2.weight": (M, F, fsdp, tp),
        }.items():
            key = f"layers.{layer}.{name}"
            full[key], local[key] = rows * cols, (rows // row_split) * (cols // col_split)
    return full, local


@pytest.mark.parametrize("lane", ["tpu", "xla"])
def test_host_memory_follows_from_the_parameter_shapes_and_the_mesh(lane):
    recipe = with_changes(
        get_recipe("llama3_debug"), parallel={"tp": 2}, checkpoint={"async_save": True}, device={"lane": lane}
    )
    plan = plan_run(recipe, chip_by_name("v5p"), 8, 0.4)  # 2 VMs of 4 chips; fsdp 4 x tp 2
    assert plan.mesh == {"pp": 1, "dp_replicate": 1, "fsdp": 4, "cp": 1, "ep": 1, "tp": 2}
    full, local = _debug_local_numels(recipe.model.args(), fsdp=4, tp=2)
    assert sum(full.values()) == plan.parameters  # the written-out shapes are the model's
    largest_local, largest_full, local_total = max(local.values()), max(full.values()), sum(local.values())
    host = plan.host
    if lane == "tpu":  # 4 processes per VM, parameters made on the devices
        resident, devices, send = 0, 1, 4 * largest_local
        assert host.processes_per_host == 4
    else:  # one process per VM holding its 4 devices' shards
        resident, devices, send = 4 * 4 * local_total, 4, 0
        assert host.processes_per_host == 1
    assert host.rank0.init == host.other.init == resident + 4 * largest_local
    assert host.rank0.load == resident + 2 * 4 * devices * largest_local
    assert host.rank0.train == resident  # no offload
    assert host.rank0.checkpoint == resident + devices * 3 * 4 * local_total
    assert host.rank0.save == resident + 2 * 4 * largest_full
    assert host.other.save == resident + send
    processes = host.processes_per_host
    assert host.per_host.checkpoint == processes * host.rank0.checkpoint
    assert host.per_host.save == host.rank0.save + (processes - 1) * host.other.save
    assert host.host_bytes == 448 * GB
    assert host.fits


def test_a_slice_smaller_than_a_vm_gets_its_share_of_the_vm():
    recipe = with_changes(get_recipe("llama3_debug"), device={"lane": "tpu"})
    host = plan_run(recipe, chip_by_name("v5p"), 2, 0.4).host
    assert host.processes_per_host == 2 and host.host_bytes == 224 * GB


def test_flux_plan_counts_the_frozen_encoders_each_process_loads_on_its_host():
    from titanpod.recipes.diffusion.registry import get_diffusion_recipe
    from titanpod.recipes.planner.flux import plan_flux

    plan = plan_flux(get_diffusion_recipe("flux1_12b"), chip_by_name("v5p"), 8, 0.4)  # 2 VMs of 4 chips
    assert plan.frozen_encoders > 0 and plan.host.processes_per_host == 4
    assert plan.host.rank0.load == plan.frozen_encoders  # T5, CLIP and the autoencoder whole, in bf16
    assert plan.host.per_host.peak == ("load", 4 * plan.frozen_encoders)
    assert plan.fits


def test_flux_plan_keeps_block_inputs_alone_when_the_memory_policy_recomputes_blocks():
    from titanpod.recipes.diffusion.registry import get_diffusion_recipe
    from titanpod.recipes.planner.flux import plan_flux
    from titanpod.recipes.planner.plan import with_changes

    recipe = get_diffusion_recipe("flux1_12b")

    def activations(**changes):
        return plan_flux(with_changes(recipe, **changes), chip_by_name("v5p"), 8, 0.4).memory.activations

    eager = {"step_mode": "eager", "memory_policy": "save"}
    saved = activations(train=eager)
    flag = activations(model={"recompute_blocks": True}, train=eager)
    policy = activations()  # the recipe's own: the whole step, blocks recomputed
    assert recipe.train.memory_policy == "recompute"
    assert flag < saved / 4  # a block's inputs are a small part of what it saves
    assert policy == flag
    assert activations(train={"step_mode": "whole_step", "memory_policy": "save"}) == saved


def test_flux_plan_counts_the_reference_attention_scores_on_the_xla_lane():
    """On the xla lane the reference attention builds [B, H, S, S] scores: one block's backward holds four such
    arrays in bf16 on top of the flash-attention plan (the fit to libtpu's flux1_12b compile, docs/recipes.md)."""
    from titanpod.recipes.diffusion.registry import get_diffusion_recipe
    from titanpod.recipes.planner.flux import REFERENCE_SCORE_ARRAYS, plan_flux
    from titanpod.recipes.planner.plan import with_changes

    splash = get_diffusion_recipe("flux1_12b")
    recipe = with_changes(splash, kernels={"attention": "sdpa"})
    tpu = plan_flux(recipe, chip_by_name("v5p"), 8, 0.4).memory
    xla = plan_flux(with_changes(recipe, device={"lane": "xla"}), chip_by_name("v5p"), 8, 0.4).memory
    assert xla.transient - tpu.transient == REFERENCE_SCORE_ARRAYS * 24 * (4096 + 512) ** 2 * 2
    assert xla.total / GIB == pytest.approx(29.52, abs=0.01)  # libtpu: 29.27 GiB a chip
    on_xla = plan_flux(with_changes(splash, device={"lane": "xla"}), chip_by_name("v5p"), 8, 0.4).memory
    assert on_xla.transient == tpu.transient  # Splash keeps no score matrix


def test_flux_plan_under_tensor_parallelism_counts_data_ranks_for_the_batch_and_splits_the_blocks():
    from titanpod.recipes.diffusion.registry import get_diffusion_recipe
    from titanpod.recipes.planner.flux import flux_plan_table, plan_flux
    from titanpod.recipes.planner.plan import with_changes

    recipe = get_diffusion_recipe("flux1_12b")
    fsdp = plan_flux(recipe, chip_by_name("v5p"), 8, 0.4)
    tp = plan_flux(with_changes(recipe, parallel={"tp": 2}), chip_by_name("v5p"), 8, 0.4)
    assert (fsdp.data_ranks, tp.data_ranks) == (8, 4)  # the two tp ranks of a data rank share its image
    assert tp.step_seconds == pytest.approx(fsdp.step_seconds / 2)  # half the images on the same chips
    assert tp.memory.parameters < 1.5 * fsdp.memory.parameters  # the blocks split over tp as over fsdp
    table = Console(width=200, record=True)
    table.print(flux_plan_table(tp))
    out = table.export_text()
    assert "fsdp 4 x tp 2" in out and "1 per data rank; 4 per step" in out


def test_the_plan_counts_the_logits_a_pallas_loss_keeps():
    """With ``kernels.pallas_loss.keep_logits`` the xla step keeps a chip's [tokens, vocab] logits (bf16 here: the
    hidden states are gathered in bf16) to the head's backward; the torch lanes' gradient op reruns the forward and
    holds them there too. No gradient as large comes with them, and they are gone before the blocks' backward."""
    import dataclasses as dc

    base = with_changes(get_recipe("llama3_8b"), data={"batch_size": 1, "seq_len": 8192})
    kernels = dc.replace(base.kernels, pallas_loss=dc.replace(base.kernels.pallas_loss, keep_logits=True))
    kept = dc.replace(base, kernels=kernels)
    chip = chip_by_name("v5p")
    for lane, extra in (("xla", 8192 * 128256 * 2), ("tpu", 8192 * 128256 * 2)):
        on = with_changes(kept, device={"lane": lane})
        off = with_changes(base, device={"lane": lane})
        logits, plain = plan_run(on, chip, 4, 0.4).memory, plan_run(off, chip, 4, 0.4).memory
        assert logits.activations == plain.activations
        assert logits.transient >= extra  # the head's backward holds them; the blocks' recompute comes after
        assert extra - plain.transient <= logits.total - plain.total <= extra


QWEN3_06B_ON_ONE_V5E = ["--recipe", "qwen3_8b", "--model.flavor", "0.6B", "--parallel.fsdp", "1"]
QWEN3_06B_ON_ONE_V5E += ["--data.seq-len", "4096", "--dry-run", "--target.chip", "v5e", "--target.chips", "1"]


@pytest.mark.parametrize(
    ("flags", "fix"),
    [
        (["--data.batch-size", "8"], "--data.batch-size 4"),
        (["--data.batch-size", "4", "--kernels.pallas-loss.keep-logits"], "--kernels.pallas-loss.no-keep-logits"),
        (["--data.batch-size", "4", "--train.memory-policy", "selective"], "--train.memory-policy recompute"),
        (["--data.batch-size", "2", "--train.memory-policy", "save"], "--train.memory-policy recompute"),
    ],
)
def test_one_v5e_refuses_what_libtpu_could_not_place_and_names_a_change_that_fits(flags, fix, capsys):
    """Each of these needed more HBM than a v5e chip's 15.75 GiB when libtpu compiled it for v5litepod-1
    (docs/recipes.md, planner against compiler); the dry run refuses it and lists ``fix`` among the changes that fit."""
    assert main([*QWEN3_06B_ON_ONE_V5E, *flags]) == 1
    out = capsys.readouterr().out
    assert "does not fit" in out
    row = next(line for line in out.splitlines() if fix in line)
    assert "yes" in row


def test_one_v5e_refuses_llama_1b_whose_optimizer_state_alone_is_too_large(capsys):
    flags = ["--recipe", "llama3_8b", "--model.flavor", "1B", "--parallel.fsdp", "1", "--data.seq-len", "4096",
             "--data.batch-size", "2", "--dry-run", "--target.chip", "v5e", "--target.chips", "1"]  # fmt: skip
    assert main(flags) == 1
    out = capsys.readouterr().out
    assert "does not fit" in out and "yes" in next(
        line for line in out.splitlines() if "--chips 2 --parallel.fsdp 2" in line
    )


def test_a_sequence_too_long_for_one_v5e_names_the_longest_that_fits(capsys):
    recipe = get_recipe("qwen3_06b")
    v5e = chip_by_name("v5e")
    assert not plan_run(with_changes(recipe, data={"seq_len": 32768, "batch_size": 1}), v5e, 1, 0.4).fits
    assert main(["--recipe", "qwen3_06b", "--data.seq-len", "32768", "--data.batch-size", "1", "--dry-run"]) == 1
    row = next(line for line in capsys.readouterr().out.splitlines() if "--data.seq-len" in line)
    longest = int(row.split("--data.seq-len")[1].split()[0])
    assert "yes" in row and longest % 1024 == 0 and longest < 32768

    def fits(seq_len: int) -> bool:
        return plan_run(with_changes(recipe, data={"seq_len": seq_len, "batch_size": 1}), v5e, 1, 0.4).fits

    assert fits(longest) and not fits(longest + 1024)


def test_one_v5e_accepts_qwen3_06b_at_4_by_4096_recomputed(capsys):
    """libtpu placed this step in 12.9 GiB of a v5e chip's 15.75."""
    assert main([*QWEN3_06B_ON_ONE_V5E, "--data.batch-size", "4"]) == 0
    assert "fits" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "compiler_gib"),
    [
        (["--data.batch-size", "4"], 12.89),
        (["--data.batch-size", "8"], 16.07),
        (["--data.batch-size", "4", "--kernels.pallas-loss.keep-logits"], 19.28),
        (["--data.batch-size", "4", "--train.memory-policy", "selective"], 31.77),
    ],
)
def test_the_xla_plan_of_qwen3_06b_on_one_v5e_is_within_10_percent_of_libtpu(flags, compiler_gib):
    """libtpu's figures for these steps compiled for v5litepod-1 (arguments + temporaries + outputs - aliased), from
    docs/recipes.md's table: fp32 block inputs and bf16 weight copies (no FSDP gather), fp32 matmul outputs kept by
    ``selective``, and fp32 logits kept by the Pallas loss are each counted."""
    from titanpod.pretrain.command import parse_command

    command = parse_command([*QWEN3_06B_ON_ONE_V5E, *flags, "--device.lane", "xla"])
    plan = plan_run(command.recipe, chip_by_name("v5e"), 1, 0.4)
    assert plan.memory.total / GIB == pytest.approx(compiler_gib, rel=0.10)


def test_an_unsharded_bf16_step_keeps_fp32_block_inputs_and_bf16_weight_copies():
    """Under bf16 autocast with nothing gathered, the hidden states stay in the embedding's fp32; the xla step also
    keeps a bf16 copy of every block weight (2 bytes a parameter) for the backward."""
    base = with_changes(get_recipe("qwen3_debug"), train={"precision": "bf16", "memory_policy": "recompute",
                        "step_mode": "whole_step"}, parallel={"fsdp": 1}, device={"lane": "xla"})  # fmt: skip
    plan = plan_run(base, chip_by_name("v5e"), 1, 0.4)
    args = get_recipe("qwen3_debug").model.args()
    inputs = args.n_layers * base.data.batch_size * base.data.seq_len * args.dim * 4
    model = build_model("qwen3", args, model_ops(base.kernels))
    head = head_saved_bytes(args, base.data.batch_size, base.data.seq_len, torch.bfloat16, model.ops.head_loss)
    assert plan.memory.activations == inputs + head.all_saved  # the blocks' fp32 inputs and the head's
    torch_lane = plan_run(with_changes(base, device={"lane": "tpu"}), chip_by_name("v5e"), 1, 0.4)
    assert torch_lane.memory.activations == plan.memory.activations  # fp32 inputs on every lane
    block_params = sum(p.numel() for p in build_debug_block(args).parameters())
    assert plan.memory.transient - torch_lane.memory.transient == 2 * block_params * args.n_layers


def build_debug_block(args):
    from titanpod.models import ModelOps
    from titanpod.models.common.transformer import TransformerBlock

    with torch.device("meta"):
        return TransformerBlock(args, ModelOps())


def test_the_xla_plan_of_llama32_1b_with_its_moments_on_the_host_is_within_10_percent_of_libtpu():
    """libtpu 0.0.52 compiling the ``llama32_1b`` recipe for a v5litepod-1 (``--compile-for v5e-1`` in envs/tpu,
    2026-12-06), its moments brought in 256 MiB pieces: 4.60 GiB of arguments and 9.21 of temporaries, 13.84 in all
    (with each tensor's moments brought in whole, 14.83, and the chip's own peak was then 14.88)."""
    from titanpod.pretrain.command import parse_command

    command = parse_command(["--recipe", "llama32_1b", "--device.lane", "xla", "--dry-run"])
    plan = plan_run(command.recipe, chip_by_name("v5e"), 1, 0.4)
    assert plan.memory.total / GIB == pytest.approx(13.84, rel=0.10)
    assert plan.memory.optimizer == 0 and plan.memory.host_offload > 0
