"""Images and captions for diffusion training (FLUX.1): a built-in set of drawn shapes, a local image folder or a
Hub dataset, as resumable per-rank batches of ``(images_BCHW in [-1, 1], captions)``; and sample grids.

``build_image_data`` is the entry point. Importing this package loads neither ``datasets`` nor PIL: ``datasets`` is
imported only when a folder or the Hub is read, PIL only when an image is drawn, decoded or written.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from titanpod.data.images.config import IMAGE_SOURCES, ImageDataConfig
    from titanpod.data.images.grid import image_grid, save_image_grid
    from titanpod.data.images.pipeline import (
        ImageBatch,
        ImageBatches,
        ImageData,
        StreamedImageBatches,
        build_image_data,
        drops_caption,
        gather_image_state,
    )
    from titanpod.data.images.shapes import Scene, Shape, draw_shapes, fixed_prompts, shapes_scene

_HOMES = {
    "IMAGE_SOURCES": "titanpod.data.images.config",
    "ImageDataConfig": "titanpod.data.images.config",
    "image_grid": "titanpod.data.images.grid",
    "save_image_grid": "titanpod.data.images.grid",
    "ImageBatch": "titanpod.data.images.pipeline",
    "ImageBatches": "titanpod.data.images.pipeline",
    "ImageData": "titanpod.data.images.pipeline",
    "StreamedImageBatches": "titanpod.data.images.pipeline",
    "build_image_data": "titanpod.data.images.pipeline",
    "drops_caption": "titanpod.data.images.pipeline",
    "gather_image_state": "titanpod.data.images.pipeline",
    "Scene": "titanpod.data.images.shapes",
    "Shape": "titanpod.data.images.shapes",
    "draw_shapes": "titanpod.data.images.shapes",
    "fixed_prompts": "titanpod.data.images.shapes",
    "shapes_scene": "titanpod.data.images.shapes",
}
"""Where each public name lives: imported on first use, so a module of this package that needs none of them
(a config dataclass the command line reads) is imported without the rest."""

__all__ = [
    "IMAGE_SOURCES",
    "ImageBatch",
    "ImageBatches",
    "ImageData",
    "ImageDataConfig",
    "Scene",
    "Shape",
    "StreamedImageBatches",
    "build_image_data",
    "draw_shapes",
    "drops_caption",
    "fixed_prompts",
    "gather_image_state",
    "image_grid",
    "save_image_grid",
    "shapes_scene",
]


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'titanpod.data.images' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
