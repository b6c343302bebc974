"""Finding a model's transformer blocks: the units the memory policies recompute, offload or save.

A module names the ``nn.ModuleList`` attributes that hold its blocks in a ``block_lists`` attribute
(FLUX's transformer: ``("double_blocks", "single_blocks")``); a module that names none has its
blocks in ``layers`` when it has that list (the decoder LLMs). Blocks are found at any depth, so a
model wrapped by its objective (``FlowMatchingModel.transformer``) is found too; nothing inside a
block is searched for further blocks.
"""

from __future__ import annotations

from torch import nn

BLOCK_LISTS_ATTRIBUTE = "block_lists"
"""The attribute in which a module names the ``nn.ModuleList`` attributes that hold its blocks."""

DEFAULT_BLOCK_LISTS = ("layers",)
"""Where a module that names no ``block_lists`` keeps its blocks (when it has that list)."""

BLOCK_PATHS = "block_paths"
"""The key of a captured step graph's ``meta`` holding its model's block paths (``transformer_blocks`` order)."""


def block_lists(module: nn.Module) -> tuple[str, ...]:
    """The names of ``module``'s attributes that hold blocks: its ``block_lists``, else ``("layers",)``."""
    return tuple(getattr(module, BLOCK_LISTS_ATTRIBUTE, DEFAULT_BLOCK_LISTS))


def transformer_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every transformer block of ``model`` with its path from ``model`` (``layers.3``,
    ``transformer.single_blocks.0``), lists in the order their owner names them, blocks in list order."""
    found: list[tuple[str, nn.Module]] = []
    inside: list[str] = []  # paths of blocks found: their submodules are not searched
    for path, module in model.named_modules():
        if any(path == block or path.startswith(block + ".") for block in inside):
            continue
        for name in block_lists(module):
            blocks = getattr(module, name, None)
            if not isinstance(blocks, nn.ModuleList):
                continue
            prefix = f"{path}.{name}" if path else name
            for index, block in enumerate(blocks):
                found.append((f"{prefix}.{index}", block))
                inside.append(f"{prefix}.{index}")
    return found
