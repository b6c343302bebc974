"""Named recipes: one function each, listed by ``titanpod-pretrain --list-recipes``."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping

from titanpod.device import DeviceConfig
from titanpod.graph import TrainConfig
from titanpod.recipes.data.config import DataConfig
from titanpod.recipes.recipe import ModelConfig, OutputConfig, Recipe


def llama3_debug() -> Recipe:
    """Llama 3 debug model (6 layers, dim 256) on the built-in corpus: 100 steps, minutes on a CPU."""
    return Recipe(
        name="llama3_debug",
        model=ModelConfig(family="llama3", flavor="debug"),
        device=DeviceConfig(lane="auto"),
        data=DataConfig(source="builtin", tokenizer="builtin", seq_len=256, batch_size=8),
        train=TrainConfig(steps=100, lr=3e-3, warmup_steps=10, decay="cosine", min_lr_ratio=0.1, log_every=10),
        output=OutputConfig(),
    )


RECIPES: Mapping[str, Callable[[], Recipe]] = {"llama3_debug": llama3_debug}
"""Every named recipe."""

DEFAULT_RECIPE = "llama3_debug"


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``; ``KeyError`` names the closest one."""
    if name in RECIPES:
        return RECIPES[name]()
    close = difflib.get_close_matches(name, list(RECIPES), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise KeyError(f"Unknown recipe {name!r}; known recipes: {', '.join(RECIPES)}.{hint}")
