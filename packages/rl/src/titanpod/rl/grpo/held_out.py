"""Held-out accuracy of a GRPO run, before and after: greedy, and sampled by the rollout engine."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from titanpod.data.sft.records import prompt_text
from titanpod.data.sft.tokenizer import SFTTokenizer
from titanpod.data.tasks import Example, Task
from titanpod.models import Transformer
from titanpod.recipes.posttrain.grpo_recipe import GRPORecipe
from titanpod.rl.grpo.result import GRPOResult
from titanpod.rl.grpo.setup import GRPOSetup
from titanpod.rl.rollout import RolloutEngine, SamplingParams
from titanpod.runs.evaluation import Evaluation, evaluate
from titanpod.runs.sft import EVAL_FILE, earlier_evaluation, score_of, write_eval_file


def sampled_accuracy(
    engine: RolloutEngine, tokenizer: SFTTokenizer, task: Task, examples: list[Example], recipe: GRPORecipe
) -> float:
    """The share of ``grpo.eval_samples`` completions per example, sampled by ``engine`` at the rollout
    temperature and top-p with seeds from ``eval.seed`` (the same draws before and after), that ``task``
    scores 1.0."""
    config = recipe.grpo
    prompts = tokenizer.encode_batch([prompt_text(tokenizer, e.prompt, config.format) for e in examples])
    params = SamplingParams(
        max_new_tokens=recipe.eval.max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        stop_token_ids=tokenizer.stop_ids,
        seed=recipe.eval.seed,
        n=config.eval_samples,
    )
    completions = engine.generate(prompts, params)
    right = 0
    for completion in completions:
        example = examples[completion.prompt_index]
        right += task.reward(example.prompt, tokenizer.decode(completion.token_ids), example.answer) == 1.0
    return right / len(completions)


class HeldOut:
    """Held-out accuracy at the points a run asks for: greedy with a whole model, and sampled by the engine.

    Only the process that writes (rank 0) scores; the model it is given must hold the weights the
    engine was last synced with.
    """

    def __init__(
        self,
        setup: GRPOSetup,
        engine: RolloutEngine,
        write_scalars: Callable[[int, dict[str, float]], None],
        say: Callable[[str], None],
    ) -> None:
        """Score ``setup``'s test prompts; print with ``say``, log with ``write_scalars(step, figures)``."""
        self.setup, self.engine, self.write_scalars, self.say = setup, engine, write_scalars, say
        self.evaluations: dict[str, tuple[int, Evaluation]] = {}
        """Greedy evaluations by label (``before``, ``after``) with their step."""
        self.sampled: dict[str, dict[str, float]] = {}
        """Sampled accuracy (and samples per prompt) by label."""

    def keep_earlier(self, run_dir: Path, label: str) -> bool:
        """Take ``label``'s scores from the eval.json an earlier process of this run wrote (a resumed run keeps the
        accuracy its start had); whether there were any."""
        kept = earlier_evaluation(run_dir / EVAL_FILE, label)
        if kept is None:
            return False
        self.evaluations[label] = kept
        self.say(kept[1].accuracy_line(kept[0], f"{label} GRPO", self.setup.eval_task.name) + ", as measured then")
        record = json.loads((run_dir / EVAL_FILE).read_text(encoding="utf-8"))[label]
        if "sampled_accuracy" in record:
            self.sampled[label] = {key: record[key] for key in ("sampled_accuracy", "samples_per_prompt")}
        return True

    def score(self, label: str, step_number: int, model: Transformer) -> None:
        """Measure held-out accuracy of ``model`` (greedy) and of the engine (sampled) now, as ``label``."""
        setup, recipe = self.setup, self.setup.recipe
        if not setup.test_examples:
            return
        evaluation = evaluate(
            model,
            setup.tokenizer,
            setup.eval_task,
            setup.test_examples,
            recipe.eval.max_new_tokens,
            format=recipe.grpo.format,
            batch_size=recipe.eval.batch_size,
            progress=self.say,
        )
        self.evaluations[label] = (step_number, evaluation)
        self.say(evaluation.accuracy_line(step_number, f"{label} GRPO", setup.eval_task.name))
        self.write_scalars(step_number, {"eval_accuracy": evaluation.accuracy})
        samples = recipe.grpo.eval_samples
        if samples:
            self.say(f"sampling {samples} completion(s) of each of the {len(setup.test_examples)} held-out prompts")
            accuracy = sampled_accuracy(self.engine, setup.tokenizer, setup.eval_task, setup.test_examples, recipe)
            self.sampled[label] = {"sampled_accuracy": accuracy, "samples_per_prompt": samples}
            self.say(
                f"step {step_number}: held-out accuracy {label} GRPO {accuracy:.1%} sampled "
                f"({samples} completions per test prompt at temperature {recipe.grpo.temperature})"
            )
            self.write_scalars(step_number, {"eval_sampled_accuracy": accuracy})

    def fill(self, result: GRPOResult, run_dir: Path) -> None:
        """Put the scores into ``result``, show the first examples and write ``eval.json``."""
        result.before, result.after = score_of(self.evaluations, "before"), score_of(self.evaluations, "after")
        result.sampled_before = self.sampled.get("before", {}).get("sampled_accuracy")
        result.sampled_after = self.sampled.get("after", {}).get("sampled_accuracy")
        if "after" in self.evaluations:
            for line in self.evaluations["after"][1].shown(self.setup.eval_task, self.setup.recipe.eval.show):
                self.say(line)
        if self.evaluations:
            write_eval_file(run_dir / EVAL_FILE, self.setup.eval_task.name, self.evaluations, self.sampled)
