"""What a finished GRPO run leaves behind, and its summary rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from titanpod.graph import TrainSummary, first_last_means
from titanpod.rl.grpo.metrics import GRPOStepMetrics
from titanpod.runs.process_exit import run_exit_code
from titanpod.runs.sft import Score


@dataclass
class GRPOResult:
    """What a finished GRPO run leaves behind."""

    run_dir: Path
    """The run directory: recipe.json, tokenizer files, metrics.jsonl, checkpoints/, eval.json, model/, hf/."""
    lane: str
    """The lane the run used."""
    parameters: int
    """Parameter count of the model."""
    started_from: str
    """The SFT model folder it started from."""
    step_description: str = "eager"
    """How the updates ran: the step mode, with the memory policy and compiler where they apply."""
    rollout: str = "local"
    """Where rollouts were sampled: in this process (each process under torchrun) or by Ray workers."""
    summary: TrainSummary | None = None
    """The GRPO steps as a training summary: ``losses`` holds each step's last-update loss (NaN for a step
    that trained nothing), throughput counts the tokens of every update."""
    history: list[GRPOStepMetrics] = field(default_factory=list)
    """Every step's metrics this run took (as written to metrics.jsonl), in order."""
    eval_task: str | None = None
    """The task scored."""
    eval_examples: int = 0
    """Test prompts scored."""
    before: Score | None = None
    """Held-out accuracy before GRPO."""
    after: Score | None = None
    """Held-out accuracy after GRPO."""
    sampled_before: float | None = None
    """Held-out accuracy of sampled completions (``grpo.eval_samples`` per prompt) before GRPO."""
    sampled_after: float | None = None
    """The same after GRPO (same prompts, same seeds)."""
    skipped_samples: int = 0
    """Completions whose reward function raised (left out of the update)."""
    weights_version: int = 0
    """The engine's weights version at the end (the last synced step)."""
    checksum: str = ""
    """The engine's weights checksum at the end (equal to the trainer's)."""
    stopped_because: str | None = None
    """Why the run stopped early on its own (a non-finite gradient with ``train.skip_nonfinite`` off)."""
    weights_path: Path | None = None
    """``<run>/model/model.safetensors``, if saved."""
    hf_path: Path | None = None
    """``<run>/hf``, if exported."""
    run_seconds: float | None = None
    """Wall time of the whole run: loading, held-out scoring, the steps and the saves."""

    @property
    def steps_done(self) -> int:
        """GRPO steps completed, counting those done before a resume."""
        return self.summary.steps_done if self.summary is not None else 0

    @property
    def interrupted(self) -> bool:
        """Stopped by a signal (SIGINT, Ctrl-C; or SIGTERM)."""
        return self.summary is not None and self.summary.interrupted

    @property
    def exit_code(self) -> int:
        """0 when the run finished, 1 when it stopped on its own, 128 + the signal number when a signal stopped it."""
        if self.summary is None:
            return 1 if self.stopped_because else 0
        return run_exit_code(self.summary)

    def summary_rows(self) -> list[tuple[str, str]]:
        """The run's summary as (label, value) rows."""
        start = self.summary.start_step if self.summary is not None else 0
        rows = [
            ("lane", self.lane),
            ("parameters", f"{self.parameters:,}"),
            ("started from", self.started_from),
            ("updates", self.step_description),
            ("rollouts", self.rollout),
            ("steps", f"{self.steps_done}" + (f" (resumed after {start})" if start else "")
             + (" (interrupted)" if self.interrupted else "")),
        ]  # fmt: skip
        if self.stopped_because:
            rows.append(("stopped", self.stopped_because))
        rewards = first_last_means([row.reward_mean for row in self.history], window=5)  # windows never overlap
        if rewards is not None and rewards.last is None:
            rows.append(("mean reward (only one step)", f"{rewards.first:.3f}"))
        elif rewards is not None:
            steps = "step" if rewards.size == 1 else f"{rewards.size} steps"
            rows.append((f"mean reward, first {steps}", f"{rewards.first:.3f}"))
            rows.append((f"mean reward, last {steps}", f"{rewards.last:.3f}"))
        rows.append(("samples skipped (reward raised)", str(self.skipped_samples)))
        for label, score in (("before", self.before), ("after", self.after)):
            if score is not None:
                rows.append(score.summary_row(label, self.eval_examples, self.eval_task))
        for label, sampled in (("before", self.sampled_before), ("after", self.sampled_after)):
            if sampled is not None:
                rows.append((f"held-out accuracy {label}, sampled", f"{sampled:.1%}"))
        rows.append(("engine weights", f"version {self.weights_version}, checksum {self.checksum[:16]}"))
        steps = f"{self.summary.wall_seconds:.1f} s" if self.summary is not None else None
        if self.run_seconds is not None:
            rows.append(("wall time", f"{self.run_seconds:.1f} s" + (f" (the steps {steps})" if steps else "")))
        elif steps is not None:
            rows.append(("wall time (steps)", steps))
        rows.append(("run directory", str(self.run_dir)))
        rows.append(("weights", str(self.weights_path or "not saved")))
        if self.hf_path is not None:
            rows.append(("Hugging Face export", str(self.hf_path)))
        return rows
