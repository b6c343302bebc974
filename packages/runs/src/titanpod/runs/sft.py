"""A supervised fine-tuning run from an ``SFTRecipe``: the pretraining pieces with SFT data and held-out accuracy.

The run directory holds recipe.json, tokenizer.json (+ tokenizer_config.json), metrics.jsonl,
tensorboard/, checkpoints/ (trainer state, to resume), eval.json (accuracy before and after),
model/ (titanpod weights with the tokenizer) and, with ``checkpoint.export_hf``, hf/ (a Hugging Face
checkpoint with the tokenizer, loadable by transformers).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.markup import escape

from titanpod.checkpoint.pretrained import PretrainedFolder, open_pretrained
from titanpod.data.sft.batches import encode_sft_records, pack_sft_data
from titanpod.data.sft.records import check_covers
from titanpod.data.sft.tokenizer import CHARS, SFTTokenizer, load_sft_tokenizer
from titanpod.data.tasks import Example, Task, get_task
from titanpod.device import Backend, get_backend
from titanpod.graph import TrainSummary, build_step
from titanpod.kernels import model_ops
from titanpod.kernels.lane_check import check_kernels_on_lane
from titanpod.models import RegionValues, Transformer, parameter_count
from titanpod.recipes.families import build_model, decoder_adapters
from titanpod.recipes.posttrain.sft_recipe import SFTRecipe
from titanpod.runs.checkpoint_tokenizer import check_run_tokenizer
from titanpod.runs.device_fit import check_sft_fits_device
from titanpod.runs.evaluation import Evaluation, evaluate
from titanpod.runs.final_weights import check_export, write_trained_weights
from titanpod.runs.hf_export import HFExtras, post_training_tokenizer, training_extras
from titanpod.runs.init_from import following, opened_init_from, place_from_folder
from titanpod.runs.placement import start_placement
from titanpod.runs.pretrain import build_seeded_model, describe_step
from titanpod.runs.process_exit import run_exit_code
from titanpod.runs.session import RunSession
from titanpod.runs.summary_rows import loss_rows, mfu_text

EVAL_FILE = "eval.json"
"""Held-out accuracy before and after training, with the completions."""


@dataclass
class Score:
    """Held-out accuracy at one step."""

    step: int
    """Optimizer steps done when it was measured."""
    accuracy: float
    """Share of test prompts answered exactly right."""

    def summary_row(self, label: str, examples: int, task: str | None) -> tuple[str, str]:
        """``held-out accuracy <label> (step N)``, ``X% (right/examples <task> test prompts)``."""
        right = round(self.accuracy * examples)
        return (
            f"held-out accuracy {label} (step {self.step})",
            f"{self.accuracy:.1%} ({right}/{examples} {task} test prompts)",
        )


@dataclass
class SFTResult:
    """What a finished SFT run leaves behind."""

    run_dir: Path
    """The run directory (see the module docstring)."""
    summary: TrainSummary
    """The training loop's summary."""
    lane: str
    """The lane the run used."""
    parameters: int
    """Parameter count of the model."""
    step_description: str
    """How steps ran."""
    started_from: str
    """Where the weights came from: the seed, or the ``model.init_from`` folder."""
    weights_path: Path | None = None
    """``<run>/model/model.safetensors``, if saved."""
    hf_path: Path | None = None
    """``<run>/hf``, if exported."""
    eval_task: str | None = None
    """The task scored, if any."""
    eval_examples: int = 0
    """Test prompts scored."""
    before: Score | None = None
    """Accuracy before training (at the step the run started from)."""
    after: Score | None = None
    """Accuracy after training."""
    samples: list[tuple[str, str, str]] = field(default_factory=list)
    """A few (prompt, completion, answer) triples of the final evaluation."""
    skipped_examples: int = 0
    """Bad records skipped (``data.bad_examples skip``)."""
    run_seconds: float | None = None
    """Wall time of the whole run: loading, held-out scoring, training and the saves."""

    @property
    def exit_code(self) -> int:
        """0 when the run finished, 1 when it stopped on its own, 128 + the signal number when a signal stopped it."""
        return run_exit_code(self.summary)

    def summary_rows(self) -> list[tuple[str, str]]:
        """The run's summary as (label, value) rows."""
        summary = self.summary
        rows = [
            ("lane", self.lane),
            ("parameters", f"{self.parameters:,}"),
            ("started from", self.started_from),
            ("steps", f"{summary.steps_done}" + (" (interrupted)" if summary.interrupted else "")),
            ("step mode", self.step_description),
        ]
        rows += loss_rows(summary.losses)
        if self.skipped_examples:
            rows.append(("bad records skipped", str(self.skipped_examples)))
        for label, score in (("before", self.before), ("after", self.after)):
            if score is not None:
                rows.append(score.summary_row(label, self.eval_examples, self.eval_task))
        rows.append(("tokens/s (after step 1)", f"{summary.tokens_per_second:,.0f}"))
        rows.append(("MFU", mfu_text(summary)))
        if self.run_seconds is not None:
            rows.append(("wall time", f"{self.run_seconds:.1f} s (training {summary.wall_seconds:.1f} s)"))
        else:
            rows.append(("wall time", f"{summary.wall_seconds:.1f} s"))
        rows.append(("run directory", str(self.run_dir)))
        rows.append(("weights", str(self.weights_path or "not saved")))
        if self.hf_path is not None:
            rows.append(("Hugging Face export", str(self.hf_path)))
        if summary.stopped_because:
            rows.append(("stopped", summary.stopped_because))
        return rows


def build_sft_model(
    recipe: SFTRecipe, backend: Backend, folder: PretrainedFolder | None = None
) -> tuple[Transformer, str, PretrainedFolder | None, RegionValues | None]:
    """The model to fine-tune, where its weights come from, the folder to fill it from, and the seed's region
    init when the model is still to be created shard by shard.

    Without ``model.init_from`` it is the recipe's family and flavor from ``train.seed`` (``build_seeded_model``):
    in one process initialised whole on the backend's device; under torchrun on the meta device with the
    region init of the seed, from which ``place_from_folder`` creates each rank's shards. With it, the folder's
    model (titanpod model.json, or Hugging Face config.json: its family and shape) with the recipe's kernels in
    its slots, on the meta device: ``place_from_folder`` creates it from the folder, sharded or whole. ``folder`` is
    that folder when the caller has opened it already.
    """
    if recipe.model.init_from is None:
        seeded, initial_values = build_seeded_model(recipe, backend)  # type: ignore[arg-type]
        return seeded, f"seed {recipe.train.seed} ({recipe.model.flavor})", None, initial_values
    if folder is None:
        folder = open_pretrained(recipe.model.init_from, decoder_adapters())
    return (
        build_model(folder.family, folder.args, model_ops(recipe.kernels)),
        f"{recipe.model.init_from} ({folder.family})",
        folder,
        None,
    )


def eval_task_and_examples(recipe: SFTRecipe, tokenizer: SFTTokenizer) -> tuple[Task | None, list]:
    """The task scored for held-out accuracy and its test examples (``None`` and ``[]`` when none)."""
    name = recipe.eval_task
    if name is None or not recipe.eval.enabled:
        return None, []
    task = get_task(name)
    check_covers(tokenizer, task)
    return task, task.examples("test", recipe.eval.examples, recipe.eval.seed)


def run_sft(recipe: SFTRecipe, console: Console | None = None) -> SFTResult:
    """Fine-tune the recipe's model on its data; score held-out accuracy before and after; write the run.

    Under torchrun the model is sharded by its family's plan and ``recipe.parallel``, each data rank
    reads its own share of every global batch, and the reported loss is the mean over data ranks.
    Held-out accuracy runs on every rank (the sharded forward is a collective); rank 0 alone prints
    and writes, and the final model is gathered one tensor at a time and streamed into its files by rank 0.
    """
    started = time.perf_counter()
    backend = get_backend(recipe.device.lane)
    check_kernels_on_lane(recipe.kernels, backend)
    layout = start_placement("sft", recipe.parallel, recipe.train, backend, recipe.data.seq_len)
    torch.manual_seed(recipe.train.seed)
    folder = None if recipe.model.init_from is None else opened_init_from(recipe.model.init_from, console)
    recipe = following(recipe, folder, CHARS)  # its family and tokenizer (chat template too), as recipe.json records
    check_export(recipe.model.family, recipe.kernels, recipe.checkpoint.export_hf)
    tokenizer = load_sft_tokenizer(recipe.data.tokenizer)
    check_sft_fits_device(recipe, backend, recipe.model.args() if folder is None else folder.args)  # before building
    model, started_from, pretrained, seeded = build_sft_model(recipe, backend, folder)
    tokenizer_note = check_run_tokenizer(tokenizer.tokenizer, tokenizer.spec, model.args.vocab_size, pretrained)
    if recipe.data.seq_len > model.args.max_seq_len:
        raise ValueError(
            f"data.seq_len {recipe.data.seq_len} is longer than the model's max_seq_len {model.args.max_seq_len}."
        )
    records = encode_sft_records(recipe.data, tokenizer, recipe.train.seed)  # bad data fails before the weights load
    parameters = parameter_count(model)
    placement = place_from_folder(model, recipe.model.family, layout, pretrained, console, seeded)
    data = pack_sft_data(records, recipe.data, tokenizer, recipe.train.seed, placement.data_rank, placement.data_world)
    task, test_examples = eval_task_and_examples(recipe, tokenizer)
    with RunSession(recipe, backend, console) as session:
        if session.is_main:
            tokenizer.save(session.run_dir)
        step = build_step(model, recipe.train, backend)
        start_step = session.resume(model, step, data.train)
        session.say(
            f"lane [bold]{backend.lane}[/] on {backend.device(session.info.local_rank)}, {recipe.model.family}: "
            f"{parameters:,} parameters from {escape(started_from)}; "
            f"layout {placement.describe(recipe.parallel, session.info.world_size)}; "
            f"step {describe_step(recipe.train, backend)}; "
            f"run directory {session.run_dir}"
        )
        session.say(data.describe())
        if tokenizer_note is not None:
            session.say(f"[bold yellow]note[/]: {escape(tokenizer_note)}")
        evaluations: dict[str, tuple[int, Evaluation]] = {}

        def score(label: str, step_number: int) -> None:
            if task is None:
                return
            step.finish()
            evaluation = evaluate(
                model,
                tokenizer,
                task,
                test_examples,
                recipe.eval.max_new_tokens,
                format=recipe.data.format,
                batch_size=recipe.eval.batch_size,
                progress=session.say,
            )
            evaluations[label] = (step_number, evaluation)
            session.say(evaluation.accuracy_line(step_number, f"{label} training", task.name))
            session.write_scalars(step_number, {"eval_accuracy": evaluation.accuracy})

        kept = earlier_evaluation(session.run_dir / EVAL_FILE, "before") if start_step else None
        if kept is not None:  # a resumed run: its start was scored before it stopped
            evaluations["before"] = kept
            said = kept[1].accuracy_line(kept[0], "before training", task.name if task is not None else "the")
            session.say(f"{said}, as measured when the run started")
        elif recipe.eval.before:
            score("before", start_step)
        summary = session.train(
            data.train,
            flops_per_token=model.flops_per_token(recipe.data.seq_len),
            data_parallel=placement.data_world,
            reduce_loss=placement.reduce_loss,
            at_end=lambda summary: score("after", summary.steps_done),
        )
        result = SFTResult(
            session.run_dir,
            summary,
            backend.lane,
            parameters,
            describe_step(recipe.train, backend),
            started_from,
            eval_task=task.name if task is not None else None,
            eval_examples=len(test_examples),
            before=score_of(evaluations, "before"),
            after=score_of(evaluations, "after"),
            skipped_examples=len(data.skipped),
        )
        if "after" in evaluations:
            final = evaluations["after"][1]
            shown = range(min(recipe.eval.show, len(final.examples)))
            result.samples = [(final.examples[i].prompt, final.completions[i], final.examples[i].answer) for i in shown]
            if task is not None:
                for line in final.shown(task, recipe.eval.show):
                    session.say(line)
        if evaluations and session.is_main:
            write_eval_file(session.run_dir / EVAL_FILE, result.eval_task, evaluations)

        def extras_at(loss: float | None) -> HFExtras:
            return training_extras(
                recipe.to_dict(),
                recipe.model.family,
                parameters,
                summary.steps_done,
                final_loss=loss,
                tokenizer=post_training_tokenizer(tokenizer),
                accuracy=result.after.accuracy if result.after is not None else None,
                accuracy_task=result.eval_task,
            )

        def write_weights() -> Path:
            written = write_trained_weights(session, placement, recipe, summary, extras_at)
            result.hf_path = written.hf
            return written.weights

        result.weights_path = session.save_final_weights(summary, write_weights)
    result.run_seconds = time.perf_counter() - started
    return result


def earlier_evaluation(path: Path, label: str) -> tuple[int, Evaluation] | None:
    """The evaluation ``label`` an earlier process of this run wrote into ``path`` (its eval.json), with its step:
    a resumed run keeps the accuracy its start had rather than scoring the resumed weights as its start. ``None``
    when there is none (or the file cannot be read)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))[label]
        rows = record["completions"]
        examples = [Example(row["prompt"], row["answer"]) for row in rows]
        return int(record["step"]), Evaluation(float(record["accuracy"]), examples, [row["completion"] for row in rows])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def score_of(evaluations: dict[str, tuple[int, Evaluation]], label: str) -> Score | None:
    """The ``Score`` of the evaluation called ``label`` (``before`` / ``after``), if it ran."""
    if label not in evaluations:
        return None
    step_number, evaluation = evaluations[label]
    return Score(step_number, evaluation.accuracy)


def write_eval_file(
    path: Path,
    task: str | None,
    evaluations: dict[str, tuple[int, Evaluation]],
    extra: Mapping[str, Mapping[str, object]] | None = None,
) -> None:
    """``eval.json``: the task, and for each evaluation (``before``, ``after``) its step, accuracy, the fields
    ``extra[label]`` adds (e.g. a sampled accuracy) and the completions."""
    record: dict[str, object] = {"task": task}
    for label, (step_number, evaluation) in evaluations.items():
        record[label] = {
            "step": step_number,
            "accuracy": evaluation.accuracy,
            **(extra or {}).get(label, {}),
            "completions": [
                {"prompt": example.prompt, "completion": completion, "answer": example.answer}
                for example, completion in zip(evaluation.examples, evaluation.completions, strict=True)
            ],
        }
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
