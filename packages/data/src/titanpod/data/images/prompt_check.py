"""Does an image show what its shapes-style prompt asks for? Measured from its pixels alone.

For a prompt of the built-in set's vocabulary ("a large red circle on the left on a white background") and an
image, ``check_prompt`` measures four things and says which match the prompt:

- background: the median colour of the image's border pixels, named by the nearest background colour;
- colour: the shape colour that covers most of the prompt's region of the image (for a two-shape prompt, the
  half nearest the shape's named position; otherwise the whole image);
- position: the named position nearest to the centre of that colour's pixels;
- shape: which ideal square, circle or triangle (apex up, as wide as tall) of the same area and centre those
  pixels differ from least.

Each pixel is read as a mix of the measured background and one shape colour (smoothed edges are such mixes):
the colour whose mix line passes nearest the pixel names it, and the mixing weight is how much of the pixel the
shape covers. Legend: C channels, H height, W width.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from titanpod.data.images.shapes import BACKGROUNDS, COLOURS, KINDS, PLACES, POSITIONS, SIZES, Scene, Shape

FILLS = {"square": 1.0, "circle": math.pi / 4, "triangle": 0.5}
"""The share of its bounding box each drawn shape covers (the triangle is as wide as it is tall)."""
SUBPIXELS = 8
"""Ideal shapes are rasterised at this many points per pixel side."""
BACKGROUND_TOLERANCE = 64.0
"""Largest distance (RGB, 0-255) of the measured border colour from the named background for a match."""
MIX_TOLERANCE = 80.0
"""Largest distance (RGB, 0-255) of a pixel from a background-to-colour mix line for it to count as that colour."""
MIN_COVER = 0.25
"""A pixel counts as shape when the shape covers at least this much of it (its mixing weight)."""
MAX_MISFIT = 0.5
"""A shape matches only when its pixels differ from the ideal shape by at most this (shapes the renderer draws at
16 pixels differ by at most 0.16; a blob that is no shape in particular differs from all three by more)."""
MIN_AREA = 0.3
"""The colour covering most of a shape's region counts as found only when it covers at least this share of the
area the named shape would cover (less is stray pixels, and colour, position and shape all fail)."""

_PLACE_NAMES = {words: name for name, words in PLACES.items()} | {"in the centre": "centre"}
_SHAPE = (
    rf"a ({'|'.join(SIZES)}) ({'|'.join(COLOURS)}) ({'|'.join(KINDS)}) "
    rf"({'|'.join(re.escape(words) for words in _PLACE_NAMES)})"
)
_BACKGROUND = rf"on a (?P<background>{'|'.join(BACKGROUNDS)}) background"
_CAPTION = re.compile(rf"^(?P<shapes>{_SHAPE}(?: and {_SHAPE})*) {_BACKGROUND}$")


@dataclass(frozen=True)
class ShapeCheck:
    """What was measured for one shape a prompt names, and whether each attribute matches."""

    shape: Shape
    """The shape the prompt asks for."""
    colour: str | None
    """The shape colour covering most of the shape's region (None: no shape colour covers enough of it)."""
    position: str | None
    """The named position nearest the centre of the measured colour's pixels (None: no colour found)."""
    kind: str | None
    """The shape whose bounding-box fill is nearest the measured one (None: no colour found)."""
    misfit: float
    """How far the measured colour's pixels are from the ideal ``kind`` of the same area and centre: the summed
    absolute difference of covered shares over the area (0: exactly that shape; inf when no colour was found)."""
    area: float
    """Pixels the measured colour covers (partly covered pixels count in part)."""

    @property
    def colour_ok(self) -> bool:
        """The named colour covers most of the region."""
        return self.colour == self.shape.colour

    @property
    def position_ok(self) -> bool:
        """The colour sits at the named position."""
        return self.position == self.shape.position

    @property
    def kind_ok(self) -> bool:
        """Its pixels look like the named shape, and like it closely (``MAX_MISFIT``)."""
        return self.kind == self.shape.kind and self.misfit <= MAX_MISFIT


@dataclass(frozen=True)
class PromptCheck:
    """The measurements of one image against its prompt."""

    prompt: str
    """The prompt."""
    background: str
    """The background colour nearest the border's median colour."""
    background_distance: float
    """Distance (RGB, 0-255) from the border's median colour to the named background."""
    expected_background: str
    """The background the prompt names."""
    shapes: tuple[ShapeCheck, ...]
    """One check per shape the prompt names, in its order."""

    @property
    def background_ok(self) -> bool:
        """The border shows the named background."""
        return self.background == self.expected_background and self.background_distance <= BACKGROUND_TOLERANCE

    @property
    def matches(self) -> dict[str, bool]:
        """Each attribute (background, colour, position, shape) and whether it matches for every shape."""
        return {
            "background": self.background_ok,
            "colour": all(shape.colour_ok for shape in self.shapes),
            "position": all(shape.position_ok for shape in self.shapes),
            "shape": all(shape.kind_ok for shape in self.shapes),
        }

    @property
    def passed(self) -> bool:
        """Every attribute matches."""
        return all(self.matches.values())

    def describe(self) -> str:
        """One line: pass or fail, then each attribute as measured, marked where it does not match."""
        parts = [f"background {self.background}{'' if self.background_ok else ' (x)'}"]
        for shape in self.shapes:
            parts.append(
                f"colour {shape.colour}{'' if shape.colour_ok else ' (x)'}, "
                f"position {shape.position}{'' if shape.position_ok else ' (x)'}, "
                f"shape {shape.kind} (misfit {shape.misfit:.2f}){'' if shape.kind_ok else ' (x)'}"
            )
        return f"{'pass' if self.passed else 'FAIL'}: {self.prompt!r}: {'; '.join(parts)}"

    def to_json(self) -> dict[str, object]:
        """The check as JSON-able data."""
        return {
            "prompt": self.prompt,
            "passed": self.passed,
            "matches": self.matches,
            "background": self.background,
            "shapes": [
                {"colour": s.colour, "position": s.position, "shape": s.kind, "misfit": round(s.misfit, 3),
                 "area": round(s.area, 2)}
                for s in self.shapes
            ],
        }  # fmt: skip


def parse_prompt(prompt: str) -> Scene:
    """The scene a caption of the built-in set's vocabulary describes (the inverse of ``Scene.caption``);
    ``ValueError`` for any other text."""
    found = _CAPTION.match(prompt.strip())
    if found is None:
        raise ValueError(
            f"{prompt!r} is not a prompt of the shapes vocabulary, e.g. 'a large red circle on the left on a "
            "white background' (sizes, colours, shapes, places and backgrounds of titanpod.data.images.shapes)."
        )
    shapes = []
    for part in found.group("shapes").split(" and "):
        size, colour, kind, *place = part.split(" ")[1:]
        shapes.append(Shape(kind=kind, colour=colour, size=size, position=_PLACE_NAMES[" ".join(place)]))
    return Scene(found.group("background"), tuple(shapes))


def _nearest(value: torch.Tensor, palette: dict[str, tuple[int, int, int]]) -> tuple[str, float]:
    distances = {name: float(torch.dist(value, torch.tensor(rgb).float())) for name, rgb in palette.items()}
    name = min(distances, key=distances.__getitem__)
    return name, distances[name]


def colour_cover(pixels_HWC: torch.Tensor, background: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Which shape colour each pixel is a mix of, and how much of it: (index into ``COLOURS`` [H, W], -1 for
    none; covered share [H, W] in [0, 1]), reading each pixel as ``background + cover x (colour - background)``."""
    palette = torch.tensor(list(COLOURS.values()), dtype=torch.float32)  # [K, 3]
    direction_KC = palette - background
    offset_HWC = pixels_HWC - background
    cover_HWK = (offset_HWC @ direction_KC.T / (direction_KC * direction_KC).sum(-1)).clamp(0.0, 1.0)
    mixed_HWKC = cover_HWK[..., None] * direction_KC
    miss_HWK = (offset_HWC[..., None, :] - mixed_HWKC).norm(dim=-1)
    miss_HWK = torch.where(cover_HWK >= MIN_COVER, miss_HWK, torch.full_like(miss_HWK, math.inf))
    miss_HW, index_HW = miss_HWK.min(dim=-1)
    cover_HW = cover_HWK.gather(-1, index_HW[..., None])[..., 0]
    found = miss_HW <= MIX_TOLERANCE
    return torch.where(found, index_HW, -1), torch.where(found, cover_HW, 0.0)


def ideal_cover(kind: str, area: float, centre: tuple[float, float], height: int, width: int) -> torch.Tensor:
    """How much of each pixel [H, W] an ideal ``kind`` of ``area`` pixels covers, placed so its area's centre is
    ``centre`` (pixels, x then y): the reference a measured shape is compared with. Squares and circles are centred
    there; the triangle (apex up, as wide as it is tall) has its centre a third of its half-height lower."""
    step = 1.0 / SUBPIXELS
    offsets = (torch.arange(SUBPIXELS, dtype=torch.float32) + 0.5) * step
    ys = (torch.arange(height, dtype=torch.float32)[:, None] + offsets).reshape(-1)
    xs = (torch.arange(width, dtype=torch.float32)[:, None] + offsets).reshape(-1)
    y, x = ys[:, None], xs[None, :]
    cx, cy = centre
    if kind == "square":
        r = math.sqrt(area) / 2
        inside = ((x - cx).abs() <= r) & ((y - cy).abs() <= r)
    elif kind == "circle":
        r = math.sqrt(area / math.pi)
        inside = (x - cx) ** 2 + (y - cy) ** 2 <= r * r
    else:
        r = math.sqrt(area / 2)
        top = cy - r / 3 - r  # the drawn centre is a third of r above the area's centre; the apex r above that
        inside = (y >= top) & (y <= top + 2 * r) & ((x - cx).abs() <= (y - top) / 2)
    return inside.float().view(height, SUBPIXELS, width, SUBPIXELS).mean(dim=(1, 3))


def _measure_shape(shape: Shape, cover_KHW: torch.Tensor, side: int) -> ShapeCheck:
    names = list(COLOURS)
    expected_area = FILLS[shape.kind] * (2 * SIZES[shape.size] * side) ** 2
    areas = [float(cover_KHW[i].sum()) for i in range(len(names))]
    best = max(range(len(names)), key=areas.__getitem__)
    if areas[best] < MIN_AREA * expected_area:
        return ShapeCheck(shape, None, None, None, math.inf, areas[best])
    weights_HW = cover_KHW[best]
    H, W = weights_HW.shape
    x = float((weights_HW.sum(0) * (torch.arange(W) + 0.5)).sum() / areas[best])
    y = float((weights_HW.sum(1) * (torch.arange(H) + 0.5)).sum() / areas[best])
    position = min(POSITIONS, key=lambda name: math.dist((x / W, y / H), POSITIONS[name]))
    misfits = {
        kind: float((weights_HW - ideal_cover(kind, areas[best], (x, y), H, W)).abs().sum()) / areas[best]
        for kind in KINDS
    }
    kind = min(misfits, key=misfits.__getitem__)
    return ShapeCheck(shape, names[best], position, kind, misfits[kind], areas[best])


def check_prompt(prompt: str, image_CHW: torch.Tensor) -> PromptCheck:
    """Measure ``image_CHW`` (RGB, values in [-1, 1] as the samples are) against ``prompt`` (the built-in set's
    vocabulary, one shape or more): its background, and each named shape's colour, position and kind."""
    scene = parse_prompt(prompt)
    if image_CHW.ndim != 3 or image_CHW.shape[0] != 3 or image_CHW.shape[1] != image_CHW.shape[2]:
        raise ValueError(f"check_prompt takes one square RGB image [3, H, W], got shape {tuple(image_CHW.shape)}.")
    pixels_HWC = ((image_CHW.detach().float().cpu().clamp(-1, 1) + 1) * 127.5).permute(1, 2, 0)
    H, W, _ = pixels_HWC.shape
    border = torch.cat([pixels_HWC[0], pixels_HWC[-1], pixels_HWC[1:-1, 0], pixels_HWC[1:-1, -1]])
    measured = border.median(dim=0).values
    background, _ = _nearest(measured, BACKGROUNDS)
    distance = float(torch.dist(measured, torch.tensor(BACKGROUNDS[scene.background], dtype=torch.float32)))
    index_HW, cover_HW = colour_cover(pixels_HWC, measured)
    ys = (torch.arange(H, dtype=torch.float32)[:, None].expand(H, W) + 0.5) / H
    xs = (torch.arange(W, dtype=torch.float32)[None, :].expand(H, W) + 0.5) / W
    named = torch.tensor([POSITIONS[shape.position] for shape in scene.shapes])  # [S, 2]
    region_HW = ((xs[..., None] - named[:, 0]) ** 2 + (ys[..., None] - named[:, 1]) ** 2).argmin(-1)
    checks = []
    for s, shape in enumerate(scene.shapes):
        in_region = region_HW == s
        cover_KHW = torch.stack([torch.where((index_HW == k) & in_region, cover_HW, 0.0) for k in range(len(COLOURS))])
        checks.append(_measure_shape(shape, cover_KHW, H))
    return PromptCheck(prompt, background, distance, scene.background, tuple(checks))
