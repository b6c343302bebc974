"""Sample images as one picture: a grid of cells, each an image enlarged to a readable size with its caption
wrapped below it.

Legend: B batch, C channels, H height, W width. PIL is imported only when a grid is drawn.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from titanpod.data.images.transforms import to_pil

if TYPE_CHECKING:
    from PIL import Image, ImageDraw, ImageFont

MAX_COLUMNS = 8
"""Images per row unless ``columns`` is given."""
MIN_SIZE = 128
"""Pixels an image's shorter side is enlarged to at least (unless ``min_size`` is given)."""
GUTTER = 4
"""White pixels around every cell (between neighbours and at the grid's edges)."""
FRAME = (200, 200, 200)
"""The colour of the one-pixel line around each image, in the gutter (white images stay apart)."""
CAPTION_MARGIN = 4
"""Pixels between a caption and the edges of its cell."""


def enlargement(height: int, width: int, min_size: int = MIN_SIZE) -> int:
    """The whole factor an image of ``height`` x ``width`` is enlarged by so its shorter side is at least
    ``min_size`` pixels (1 when it already is): whole factors keep nearest-neighbour pixels square."""
    return max(1, math.ceil(min_size / min(height, width)))


def wrap_caption(
    text: str, draw: ImageDraw.ImageDraw, font: ImageFont.FreeTypeFont | ImageFont.ImageFont, width: int
) -> list[str]:
    """``text`` in lines no wider than ``width`` pixels as ``font`` draws them, broken between words; a word
    wider than a line is broken between its letters."""
    lines: list[str] = []
    for word in text.split():
        if lines and draw.textlength(f"{lines[-1]} {word}", font=font) <= width:
            lines[-1] = f"{lines[-1]} {word}"
            continue
        while draw.textlength(word, font=font) > width and len(word) > 1:
            cut = max(
                (end for end in range(1, len(word)) if draw.textlength(word[:end], font=font) <= width), default=1
            )
            lines.append(word[:cut])
            word = word[cut:]
        lines.append(word)
    return lines or [""]


def image_grid(
    images_BCHW: torch.Tensor,
    captions: list[str] | None = None,
    columns: int | None = None,
    min_size: int = MIN_SIZE,
) -> Image.Image:
    """``images_BCHW`` (RGB, values in [-1, 1], clipped) as one RGB PIL image: a grid of ``columns`` cells a row
    (default: as many as images, at most 8), ``GUTTER`` white pixels apart and from the edges, each image framed by
    a thin grey line.

    Each image is enlarged by nearest neighbour by a whole factor until its shorter side is at least ``min_size``
    pixels (``enlargement``), so a 16 x 16 sample fills a 128 x 128 cell. Without captions the grid is exactly its
    cells and gutters: ``columns * W' + (columns + 1) * GUTTER`` wide, W' the enlarged width. With ``captions``
    (one per image) each row of cells gets a white band below it holding each image's caption, wrapped to stay
    inside its cell's width (a word wider than the cell is broken).
    """
    from PIL import Image, ImageDraw, ImageFont

    if images_BCHW.ndim != 4 or images_BCHW.shape[1] != 3 or images_BCHW.shape[0] == 0:
        raise ValueError(
            f"An image grid takes a batch of RGB images [B, 3, H, W] with B >= 1, got shape {tuple(images_BCHW.shape)}."
        )
    count, _, height, width = images_BCHW.shape
    if isinstance(captions, str):
        raise ValueError("An image grid takes captions as a list of strings, one per image, not one string.")
    if captions is not None and len(captions) != count:
        raise ValueError(f"An image grid got {len(captions)} captions for {count} images; give one per image.")
    columns = columns or min(count, MAX_COLUMNS)
    if columns < 1:
        raise ValueError(f"An image grid needs at least 1 column, got {columns}.")
    if min_size < 1:
        raise ValueError(f"An image grid's min_size is in pixels and at least 1, got {min_size}.")
    rows = math.ceil(count / columns)
    factor = enlargement(height, width, min_size)
    cell_height, cell_width = height * factor, width * factor
    font = ImageFont.load_default(size=max(10, min(16, cell_width // 10)))
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    wrapped = [wrap_caption(text, measure, font, cell_width - 2 * CAPTION_MARGIN) for text in captions or []]
    _, top, _, bottom = measure.textbbox((0, 0), "Ag", font=font)
    line_height = bottom - min(top, 0) + 2
    bands = [
        max((len(lines) for lines in wrapped[row * columns : (row + 1) * columns]), default=0) * line_height
        + (2 * CAPTION_MARGIN if captions is not None else 0)
        for row in range(rows)
    ]
    grid_width = columns * cell_width + (columns + 1) * GUTTER
    grid_height = rows * cell_height + sum(bands) + (rows + 1) * GUTTER
    grid = Image.new("RGB", (grid_width, grid_height), (255, 255, 255))
    draw = ImageDraw.Draw(grid)
    for index in range(count):
        row, column = divmod(index, columns)
        x = GUTTER + column * (cell_width + GUTTER)
        y = GUTTER + row * (cell_height + GUTTER) + sum(bands[:row])
        draw.rectangle((x - 1, y - 1, x + cell_width, y + cell_height), outline=FRAME)
        image = to_pil(images_BCHW[index])
        grid.paste(image.resize((cell_width, cell_height), Image.Resampling.NEAREST), (x, y))
        for number, line in enumerate(wrapped[index] if captions is not None else []):
            position = (x + CAPTION_MARGIN, y + cell_height + CAPTION_MARGIN + number * line_height)
            draw.text(position, line, fill=(0, 0, 0), font=font)
    return grid


def save_image_grid(
    images_BCHW: torch.Tensor,
    path: str | Path,
    captions: list[str] | None = None,
    columns: int | None = None,
    min_size: int = MIN_SIZE,
) -> Path:
    """Write ``image_grid(images_BCHW, captions, columns, min_size)`` as one PNG at ``path``; return the path."""
    grid = image_grid(images_BCHW, captions, columns, min_size)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    grid.save(target, format="PNG")
    return target
