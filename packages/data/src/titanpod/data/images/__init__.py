"""Images and captions for diffusion training (FLUX.1): a built-in set of drawn shapes, a local image folder or a
Hub dataset, as resumable per-rank batches of ``(images_BCHW in [-1, 1], captions)``; and sample grids.

``build_image_data`` is the entry point. Importing this package loads neither ``datasets`` nor PIL: ``datasets`` is
imported only when a folder or the Hub is read, PIL only when an image is drawn, decoded or written.
"""

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
