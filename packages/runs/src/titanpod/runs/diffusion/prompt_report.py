"""How well a diffusion run's last sample grid follows its prompts, measured from the pixels and reported: a line
per prompt for the console and the same as JSON in the run directory."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from titanpod.data.images.prompt_check import PromptCheck, check_prompt

PROMPT_CHECK_FILE = "prompt_check.json"
"""The file of the run directory holding the pixel check of the last sample grid."""


def check_prompts(prompts: list[str], images_BCHW: torch.Tensor) -> list[PromptCheck]:
    """The pixel check of each image against its prompt (``titanpod.data.images.prompt_check``)."""
    return [check_prompt(prompt, image) for prompt, image in zip(prompts, images_BCHW, strict=True)]


def report_prompt_checks(checks: list[PromptCheck], grid: Path, path: Path, write: bool = True) -> list[str]:
    """The console lines of ``checks`` (a total, then one per prompt); with ``write``, the checks as JSON at
    ``path`` (the grid they measured, how many passed, and each prompt's measurements)."""
    passed = sum(check.passed for check in checks)
    if write:
        record = {"grid": grid.name, "passed": passed, "prompts": len(checks), "checks": [c.to_json() for c in checks]}
        path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    total = f"pixel check of {grid.name}: {passed} of {len(checks)} prompts match"
    return [f"{total} (background, colour, position and shape)", *(f"  {check.describe()}" for check in checks)]
