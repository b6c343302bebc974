"""The built-in image set: simple shapes in named colours at named places, each with a caption that says exactly
what is drawn ("a large red circle on the left on a white background").

Image ``i`` depends only on ``(seed, i)``: nothing is stored, and any image can be drawn again from its index.
A small model trained on it shows quickly whether it has learned colour, shape, size and position from the text.
PIL is imported only when an image is drawn.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL import Image

COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 160, 60),
    "blue": (30, 70, 220),
    "yellow": (240, 200, 20),
    "orange": (245, 130, 20),
    "purple": (140, 50, 190),
}
"""Shape colours by name (RGB); none is close to a background."""
BACKGROUNDS = {"white": (255, 255, 255), "black": (0, 0, 0), "grey": (128, 128, 128)}
"""Background colours by name (RGB)."""
KINDS = ("circle", "square", "triangle")
"""The shapes drawn."""
POSITIONS = {"left": (0.25, 0.5), "right": (0.75, 0.5), "top": (0.5, 0.25), "bottom": (0.5, 0.75), "centre": (0.5, 0.5)}
"""Where a shape's centre is, as fractions of the image side (x from the left, y from the top)."""
PLACES = {"left": "on the left", "right": "on the right", "top": "at the top", "bottom": "at the bottom"}
"""How a caption says a position (``centre``: in the centre)."""
SIZES = {"small": 0.11, "large": 0.2}
"""Half the width of a shape, as a fraction of the image side."""
PAIRS = (("left", "right"), ("top", "bottom"))
"""Positions of the two shapes of a two-shape image (shapes at these never overlap)."""
JITTER = 0.03
"""Largest shift of a shape from its named position, as a fraction of the side (its named point stays inside it)."""
TWO_SHAPES = 0.4
"""The share of images with two shapes."""
SUPERSAMPLE = 4
"""Shapes are drawn this many times larger and averaged down, for smooth edges and solid insides."""


def caption_words() -> tuple[str, ...]:
    """Every word a caption of the set can use, each once: the vocabulary of a word-level text encoder for it."""
    phrases = ["a and on background in the centre", *SIZES, *COLOURS, *KINDS, *PLACES.values(), *BACKGROUNDS]
    return tuple(dict.fromkeys(word for phrase in phrases for word in phrase.split()))


CAPTION_WORDS_MAX = 19
"""The most words a caption of the set has (two shapes: 7 words each, "and", and the 4 of the background)."""


@dataclass(frozen=True)
class Shape:
    """One drawn shape."""

    kind: str
    """circle, square or triangle."""
    colour: str
    """A key of ``COLOURS``."""
    size: str
    """small or large."""
    position: str
    """A key of ``POSITIONS``."""
    shift: tuple[float, float] = (0.0, 0.0)
    """Its offset from the named position, as fractions of the side (at most ``JITTER`` each way)."""

    def describe(self) -> str:
        """``a large red circle on the left``."""
        return f"a {self.size} {self.colour} {self.kind} {PLACES.get(self.position, 'in the centre')}"


@dataclass(frozen=True)
class Scene:
    """One image of the built-in set: a background and one or two shapes."""

    background: str
    """A key of ``BACKGROUNDS``."""
    shapes: tuple[Shape, ...]
    """The shapes, in the order the caption names them."""

    @property
    def caption(self) -> str:
        """What is drawn, in words: ``a large red circle on the left on a white background``."""
        return f"{' and '.join(shape.describe() for shape in self.shapes)} on a {self.background} background"

    def draw(self, resolution: int) -> Image.Image:
        """The scene as an RGB image of ``resolution`` x ``resolution`` pixels."""
        from PIL import Image, ImageDraw

        side = resolution * SUPERSAMPLE
        image = Image.new("RGB", (side, side), BACKGROUNDS[self.background])
        draw = ImageDraw.Draw(image)
        for shape in self.shapes:
            x, y = POSITIONS[shape.position]
            cx, cy = (x + shape.shift[0]) * side, (y + shape.shift[1]) * side
            r = SIZES[shape.size] * side
            fill = COLOURS[shape.colour]
            if shape.kind == "circle":
                draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
            elif shape.kind == "square":
                draw.rectangle((cx - r, cy - r, cx + r, cy + r), fill=fill)
            else:
                draw.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=fill)
        return image.reduce(SUPERSAMPLE)


def _rng(key: str) -> random.Random:
    return random.Random(int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little"))


def shapes_scene(seed: int, index: int) -> Scene:
    """Image ``index`` of the built-in set drawn with ``seed``: the same on every machine and every call."""
    rng = _rng(f"shapes/{seed}/{index}")
    background = rng.choice(list(BACKGROUNDS))
    positions = rng.choice(PAIRS) if rng.random() < TWO_SHAPES else (rng.choice(list(POSITIONS)),)
    shapes = tuple(
        Shape(
            kind=rng.choice(KINDS),
            colour=rng.choice(list(COLOURS)),
            size=rng.choice(list(SIZES)),
            position=position,
            shift=(rng.uniform(-JITTER, JITTER), rng.uniform(-JITTER, JITTER)),
        )
        for position in positions
    )
    return Scene(background, shapes)


def draw_shapes(seed: int, index: int, resolution: int) -> tuple[Image.Image, str]:
    """Image ``index`` of the built-in set and its caption."""
    scene = shapes_scene(seed, index)
    return scene.draw(resolution), scene.caption


PROMPT_STYLES = (
    ("large", "white"),
    ("large", "black"),
    ("small", "white"),
    ("large", "grey"),
    ("small", "black"),
    ("small", "grey"),
)
"""Size and background of each successive block of ``fixed_prompts``."""


def fixed_prompts(count: int) -> list[str]:
    """``count`` captions in the style of the built-in set, for sample images: the same list on every call.

    Each is one shape. The prompts cycle through colours, positions and shapes together (the first 6 name every
    colour, the first 5 every position, the first 3 every shape); the first 90 are the 90 (shape, colour, position)
    choices of a large shape on white, and each next block of 90 changes the size or the background.
    """
    if count < 0:
        raise ValueError(f"fixed_prompts needs a count of 0 or more, got {count}.")
    colours, positions = list(COLOURS), list(POSITIONS)
    block = len(KINDS) * len(colours) * len(positions)
    prompts = []
    for k in range(count):
        size, background = PROMPT_STYLES[(k // block) % len(PROMPT_STYLES)]
        cycle = len(colours) * len(positions)
        shape = Shape(
            KINDS[(k + k // cycle) % len(KINDS)], colours[k % len(colours)], size, positions[k % len(positions)]
        )
        prompts.append(Scene(background, (shape,)).caption)
    return prompts
