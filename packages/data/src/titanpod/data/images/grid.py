"""Sample images as one PNG: a grid of images, each optionally with its caption written below it.

Legend: B batch, C channels, H height, W width. PIL is imported only when a grid is written.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from titanpod.data.images.transforms import to_pil

if TYPE_CHECKING:
    from PIL import ImageDraw, ImageFont

MAX_COLUMNS = 8
"""Images per row unless ``columns`` is given."""
CAPTION_MARGIN = 2
"""Pixels between a caption and the edges of its cell."""


def _wrap(
    text: str, draw: ImageDraw.ImageDraw, font: ImageFont.FreeTypeFont | ImageFont.ImageFont, width: int
) -> list[str]:
    """``text`` in lines no wider than ``width`` pixels, broken between words (a longer word gets its own line)."""
    lines: list[str] = []
    for word in text.split():
        if lines and draw.textlength(f"{lines[-1]} {word}", font=font) <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return lines or [""]


def save_image_grid(
    images_BCHW: torch.Tensor,
    path: str | Path,
    captions: list[str] | None = None,
    columns: int | None = None,
) -> Path:
    """Write ``images_BCHW`` (RGB, values in [-1, 1], clipped) as one PNG grid at ``path``; return the path.

    Without captions the PNG is exactly ``columns * W`` by ``rows * H`` pixels (``columns``: at most 8, and no more
    than the images). With ``captions`` (one per image) each row of images gets a white band below it holding each
    caption, wrapped to its image's width.
    """
    from PIL import Image, ImageDraw, ImageFont

    if images_BCHW.ndim != 4 or images_BCHW.shape[1] != 3 or images_BCHW.shape[0] == 0:
        raise ValueError(
            "save_image_grid takes a batch of RGB images [B, 3, H, W] with B >= 1, got shape "
            f"{tuple(images_BCHW.shape)}."
        )
    count, _, height, width = images_BCHW.shape
    if isinstance(captions, str):
        raise ValueError("save_image_grid takes captions as a list of strings, one per image, not one string.")
    if captions is not None and len(captions) != count:
        raise ValueError(f"save_image_grid got {len(captions)} captions for {count} images; give one per image.")
    columns = columns or min(count, MAX_COLUMNS)
    if columns < 1:
        raise ValueError(f"save_image_grid needs at least 1 column, got {columns}.")
    rows = math.ceil(count / columns)
    font = ImageFont.load_default(size=max(8, min(14, width // 8)))
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    wrapped = [_wrap(text, measure, font, width - 2 * CAPTION_MARGIN) for text in captions or []]
    _, top, _, bottom = measure.textbbox((0, 0), "Ag", font=font)
    line_height = bottom - min(top, 0) + 2
    bands = [
        max((len(lines) for lines in wrapped[row * columns : (row + 1) * columns]), default=0) * line_height
        + (2 * CAPTION_MARGIN if captions is not None else 0)
        for row in range(rows)
    ]
    grid = Image.new("RGB", (columns * width, rows * height + sum(bands)), (255, 255, 255))
    draw = ImageDraw.Draw(grid)
    for index in range(count):
        row, column = divmod(index, columns)
        x, y = column * width, row * height + sum(bands[:row])
        grid.paste(to_pil(images_BCHW[index]), (x, y))
        if captions is not None:
            for number, line in enumerate(wrapped[index]):
                position = (x + CAPTION_MARGIN, y + height + CAPTION_MARGIN + number * line_height)
                draw.text(position, line, fill=(0, 0, 0), font=font)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    grid.save(target, format="PNG")
    return target
