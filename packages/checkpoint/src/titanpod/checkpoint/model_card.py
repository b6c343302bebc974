"""The README.md model card of an exported Hugging Face folder: what the model is and how it was made, as far
as the export knows (a run's steps, tokens, data, final loss and accuracy; the model it was fine-tuned from).

The card is written with ``huggingface_hub.ModelCard``, so its front matter is the Hub's: ``license``,
``base_model`` (a Hub id only), ``datasets``, ``tags``, and the run's figures as ``model-index`` results. Nothing
in it names a local folder: a path-like source, data path or recipe field is left out or shown by its last part.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

CARD_FILE = "README.md"
"""The model card's file name: what the Hub shows as the repository's page."""

DEFAULT_LICENSE = "apache-2.0"
"""The license a card declares unless told otherwise (a Hub license id); titanpod's own."""

REPO_PLACEHOLDER = "<your-repo-id>"
"""What the card's usage snippet loads from: the Hub repository the folder is pushed to."""


@dataclass(frozen=True)
class ModelCard:
    """What an export knows about its model; ``None`` fields (and empty lists) are left out of the card."""

    family: str
    """titanpod model family (``llama3``, ``qwen3``, ``qwen3_moe``)."""
    parameters: int
    """Parameter count."""
    flavor: str | None = None
    """The named size it was built as (``debug``, ``8B``), when known."""
    source: str | None = None
    """Where an imported model came from (a Hub id with its revision; a local folder is shown by its name)."""
    steps: int | None = None
    """Optimizer steps trained."""
    tokens: int | None = None
    """Tokens trained on."""
    data: str | None = None
    """The training data in words."""
    final_loss: float | None = None
    """The training loss last logged (metrics.jsonl's mean over its last window of steps)."""
    recipe: dict[str, Any] | None = None
    """The recipe it was trained with (its local paths are shown by their last part only)."""
    notes: list[str] = field(default_factory=list)
    """Further lines, e.g. which checkpoint was exported."""
    license: str = DEFAULT_LICENSE
    """The Hub license id the card declares (``output.license`` of the run's recipe)."""
    base_model: str | None = None
    """The Hub model id this model was fine-tuned from; ``None`` for a model trained from scratch, or from a
    local folder (which the card never names)."""
    datasets: list[str] = field(default_factory=list)
    """The training data as the Hub names datasets: a Hub dataset id, or a titanpod built-in's name."""
    task: str | None = None
    """How it was trained: ``pretraining``, ``sft`` or ``grpo`` (a tag)."""
    accuracy: float | None = None
    """Held-out accuracy after training (0..1), where the run scored one."""
    accuracy_task: str | None = None
    """The task ``accuracy`` was scored on."""

    def facts(self) -> list[tuple[str, str]]:
        """The card's table: (label, value) for every known fact."""
        rows = [("family", self.family), ("flavor", self.flavor), ("parameters", f"{self.parameters:,}")]
        rows += [("fine-tuned from", self.base_model), ("imported from", public_name(self.source))]
        rows += [("data", self.data), ("training", self.task)]
        rows += [("training steps", None if self.steps is None else f"{self.steps:,}")]
        rows += [("training tokens", None if self.tokens is None else f"{self.tokens:,}")]
        rows += [("final training loss (last logged)", None if self.final_loss is None else f"{self.final_loss:.4f}")]
        if self.accuracy is not None:
            rows += [(f"held-out accuracy ({self.accuracy_task or 'task'})", f"{self.accuracy:.1%}")]
        return [(label, value) for label, value in rows if value is not None]

    def metadata(self) -> Any:
        """The front matter as ``huggingface_hub.ModelCardData``."""
        from huggingface_hub import EvalResult, ModelCardData

        tags = list(dict.fromkeys(tag for tag in ("titanpod", self.family, self.task) if tag))
        dataset = self.datasets[0] if self.datasets else "unknown"
        results = []
        if self.final_loss is not None:
            results.append(_result(EvalResult, dataset, "loss", "final training loss", self.final_loss, "train"))
        if self.accuracy is not None:
            name = f"held-out accuracy ({self.accuracy_task})" if self.accuracy_task else "held-out accuracy"
            results.append(_result(EvalResult, dataset, "accuracy", name, self.accuracy, "test"))
        return ModelCardData(
            license=self.license,
            library_name="transformers",
            pipeline_tag="text-generation",
            tags=tags,
            base_model=self.base_model,
            datasets=list(self.datasets) or None,
            model_name=self.title() if results else None,
            eval_results=results or None,
        )

    def title(self) -> str:
        """``llama3 debug``: the family and flavor."""
        return f"{self.family} {self.flavor}" if self.flavor else self.family

    def render(self) -> str:
        """The card as Markdown with the Hub's front matter (``huggingface_hub.ModelCard``)."""
        from huggingface_hub import ModelCard as HubCard

        lines = [f"# {self.title()}", "", "A Hugging Face `transformers` checkpoint written by titanpod.", ""]
        lines += ["| | |", "| --- | --- |", *(f"| {label} | {value} |" for label, value in self.facts()), ""]
        lines += [*self.notes, ""] if self.notes else []
        lines += ["## Use", "", f"From the Hub, once this folder is pushed (replace `{REPO_PLACEHOLDER}`), or from"]
        lines += ["this folder itself (`.` when run inside it):", ""]
        lines += ["```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", ""]
        lines += [f'tokenizer = AutoTokenizer.from_pretrained("{REPO_PLACEHOLDER}")']
        lines += [f'model = AutoModelForCausalLM.from_pretrained("{REPO_PLACEHOLDER}")', "```", ""]
        if self.recipe is not None:
            recipe = json.dumps(without_local_paths(self.recipe), indent=2)
            lines += ["## Recipe", "", "```json", recipe, "```", ""]
        content = f"---\n{self.metadata().to_yaml()}\n---\n\n" + "\n".join(lines)
        return str(HubCard(content))


def _result(kind: Any, dataset: str, metric: str, name: str, value: float, split: str) -> Any:
    return kind(
        task_type="text-generation",
        dataset_type=dataset,
        dataset_name=dataset,
        dataset_split=split,
        metric_type=metric,
        metric_name=name,
        metric_value=round(float(value), 6),
    )


def is_local_path(value: str) -> bool:
    """True for what names a place on this machine: an absolute path, ``~``, ``.`` or ``..``, a Windows drive."""
    return value.startswith(("/", "~", "./", "../", "\\")) or value in (".", "..") or value[1:3] in (":\\", ":/")


def local_name(value: str) -> str:
    """``value`` by its last part when it names a local path (``/data/train.jsonl`` -> ``train.jsonl``), else as
    it is."""
    return (PurePath(value).name or value) if is_local_path(value) else value


def public_name(source: str | None) -> str | None:
    """``source`` as a card may show it: a local folder by its last part, anything else as it is."""
    if source is None or not is_local_path(source):
        return source
    return f"a local folder ({PurePath(source.split(' (revision')[0]).name or source})"


def without_local_paths(value: Any) -> Any:
    """``value`` (a recipe's plain data) with every string that names a local path shown by its last part."""
    if isinstance(value, dict):
        return {key: without_local_paths(item) for key, item in value.items()}
    if isinstance(value, list):
        return [without_local_paths(item) for item in value]
    if isinstance(value, str) and is_local_path(value):
        return f"<local>/{PurePath(value).name}" if PurePath(value).name else "<local>"
    return value
