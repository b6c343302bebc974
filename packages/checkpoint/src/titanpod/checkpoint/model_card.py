"""The README.md model card of an exported Hugging Face folder: what the model is and how it was made, as far
as the export knows (a run's steps, tokens, data and final loss; where an imported model came from)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

CARD_FILE = "README.md"
"""The model card's file name: what the Hub shows as the repository's page."""


@dataclass(frozen=True)
class ModelCard:
    """What an export knows about its model; ``None`` fields are left out of the card."""

    family: str
    """titanpod model family (``llama3``, ``qwen3``, ``qwen3_moe``)."""
    parameters: int
    """Parameter count."""
    flavor: str | None = None
    """The named size it was built as (``debug``, ``8B``), when known."""
    source: str | None = None
    """Where an imported model came from (a folder or Hub id, with its revision)."""
    steps: int | None = None
    """Optimizer steps trained."""
    tokens: int | None = None
    """Tokens trained on."""
    data: str | None = None
    """The training data in words."""
    final_loss: float | None = None
    """The training loss last logged (metrics.jsonl's mean over its last window of steps)."""
    recipe: dict[str, Any] | None = None
    """The recipe it was trained with."""
    notes: list[str] = field(default_factory=list)
    """Further lines, e.g. which checkpoint was exported."""

    def facts(self) -> list[tuple[str, str]]:
        """The card's table: (label, value) for every known fact."""
        rows = [("family", self.family), ("flavor", self.flavor), ("parameters", f"{self.parameters:,}")]
        rows += [("imported from", self.source), ("data", self.data)]
        rows += [("training steps", None if self.steps is None else f"{self.steps:,}")]
        rows += [("training tokens", None if self.tokens is None else f"{self.tokens:,}")]
        rows += [("final training loss (last logged)", None if self.final_loss is None else f"{self.final_loss:.4f}")]
        return [(label, value) for label, value in rows if value is not None]

    def render(self) -> str:
        """The card as Markdown, with the front matter the Hub reads (library, tags)."""
        title = f"{self.family} {self.flavor}" if self.flavor else self.family
        lines = ["---", "library_name: transformers", "pipeline_tag: text-generation", "tags:", "- titanpod"]
        lines += [f"- {self.family}", "---", "", f"# {title}", ""]
        lines += ["A Hugging Face `transformers` checkpoint written by titanpod.", ""]
        lines += ["| | |", "| --- | --- |", *(f"| {label} | {value} |" for label, value in self.facts()), ""]
        lines += [*(f"{note}" for note in self.notes), ""] if self.notes else []
        lines += ["```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", ""]
        lines += ['tokenizer = AutoTokenizer.from_pretrained("PATH_OR_REPO")']
        lines += ['model = AutoModelForCausalLM.from_pretrained("PATH_OR_REPO")', "```", ""]
        if self.recipe is not None:
            lines += ["## Recipe", "", "```json", json.dumps(self.recipe, indent=2), "```", ""]
        return "\n".join(lines)
