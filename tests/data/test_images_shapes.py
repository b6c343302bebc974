"""The built-in shapes set (captions say exactly what is drawn), fixed sample prompts, and sample grids."""

import re

import pytest
import torch
from PIL import Image

from tests.conftest import run_python
from titanpod.data.images import draw_shapes, fixed_prompts, image_grid, save_image_grid, shapes_scene
from titanpod.data.images.grid import GUTTER
from titanpod.data.images.shapes import BACKGROUNDS, COLOURS, KINDS, PLACES, POSITIONS, SIZES

PLACE = {words: name for name, words in PLACES.items()} | {"in the centre": "centre"}
PART = re.compile(
    rf"a (small|large) ({'|'.join(COLOURS)}) ({'|'.join(KINDS)}) ({'|'.join(PLACE)})",
)
CAPTION = re.compile(rf"^({PART.pattern})( and {PART.pattern})? on a ({'|'.join(BACKGROUNDS)}) background$")


def pixel(image, x, y):
    return image.getpixel((min(int(x), image.size[0] - 1), min(int(y), image.size[1] - 1)))


def test_an_image_depends_only_on_the_seed_and_its_index():
    first = [draw_shapes(3, index, 32) for index in (0, 7, 7, 100)]
    assert first[1][0].tobytes() == first[2][0].tobytes() and first[1][1] == first[2][1]
    again = draw_shapes(3, 100, 32)
    assert again[0].tobytes() == first[3][0].tobytes() and again[1] == first[3][1]
    other_seed = [draw_shapes(4, index, 32)[1] for index in range(20)]
    assert other_seed != [draw_shapes(3, index, 32)[1] for index in range(20)]


def test_the_set_varies_in_every_respect_a_caption_names():
    scenes = [shapes_scene(0, index) for index in range(400)]
    shapes = [shape for scene in scenes for shape in scene.shapes]
    assert {scene.background for scene in scenes} == set(BACKGROUNDS)
    assert {shape.colour for shape in shapes} == set(COLOURS)
    assert {shape.kind for shape in shapes} == set(KINDS)
    assert {shape.size for shape in shapes} == set(SIZES)
    assert {shape.position for shape in shapes} == set(POSITIONS)
    assert 0.25 < sum(len(scene.shapes) == 2 for scene in scenes) / len(scenes) < 0.55
    assert len({scene.caption for scene in scenes}) > 250


def test_every_caption_says_what_is_drawn_where():
    resolution = 128
    checked = 0
    for index in range(150):
        scene = shapes_scene(1, index)
        image, caption = draw_shapes(1, index, resolution)
        match = CAPTION.match(caption)
        assert match, caption
        background = BACKGROUNDS[match.group(11)]
        assert pixel(image, 0, 0) == background and pixel(image, resolution - 1, resolution - 1) == background
        parts = [PART.match(part).groups() for part in re.findall(PART.pattern.replace("(", "(?:"), caption)]
        assert len(parts) == len(scene.shapes)
        for (size, colour, kind, place), shape in zip(parts, scene.shapes, strict=True):
            x, y = POSITIONS[PLACE[place]]
            # the named point (a shape's centre before its small shift) has the named colour
            assert pixel(image, x * resolution, y * resolution) == COLOURS[colour], caption
            if size != "large":
                continue
            # the shape is the named one: a square fills its upper corner, a circle and a square its right middle
            r = SIZES[size] * resolution
            cx, cy = (x + shape.shift[0]) * resolution, (y + shape.shift[1]) * resolution
            corner = pixel(image, cx + 0.8 * r, cy - 0.8 * r) == COLOURS[colour]
            side = pixel(image, cx + 0.8 * r, cy) == COLOURS[colour]
            assert (corner, side) == {"square": (True, True), "circle": (False, True), "triangle": (False, False)}[kind]
            checked += 1
    assert checked > 80


def test_fixed_prompts_are_fixed_cover_the_choices_and_parse_as_built_in_captions():
    prompts = fixed_prompts(100)
    assert prompts == fixed_prompts(100) and fixed_prompts(8) == prompts[:8]
    assert all(CAPTION.match(prompt) for prompt in prompts)
    assert len(set(prompts[:90])) == 90
    assert {PART.match(prompt).group(2) for prompt in prompts[:6]} == set(COLOURS)
    assert {PART.match(prompt).group(4) for prompt in prompts[:5]} == set(PLACE)
    assert {PART.match(prompt).group(3) for prompt in prompts[:3]} == set(KINDS)
    assert fixed_prompts(0) == []


def test_a_grid_enlarges_each_image_by_nearest_neighbour_to_at_least_128_pixels(tmp_path):
    images = torch.rand(5, 3, 16, 24) * 2 - 1
    images[0] = 1.0  # white
    images[1] = -1.0  # black
    path = save_image_grid(images, tmp_path / "samples" / "grid.png", columns=3)
    factor = 8  # the shorter side, 16 pixels, times 8 is 128
    cell_w, cell_h = 24 * factor, 16 * factor
    with Image.open(path) as grid:
        assert grid.format == "PNG" and grid.size == (3 * cell_w + 4 * GUTTER, 2 * cell_h + 3 * GUTTER)
        left = GUTTER + 2 * (cell_w + GUTTER)  # the third cell of the first row
        cell = grid.crop((left, GUTTER, left + cell_w, GUTTER + cell_h))
        pixels = torch.frombuffer(bytearray(cell.tobytes()), dtype=torch.uint8).view(cell_h, cell_w, 3)
        assert grid.getpixel((GUTTER, GUTTER)) == (255, 255, 255)
        assert grid.getpixel((2 * GUTTER + cell_w, GUTTER)) == (0, 0, 0)
    expected = ((images[2].clamp(-1, 1) + 1) * 127.5).round().permute(1, 2, 0)
    blocks = expected.repeat_interleave(factor, 0).repeat_interleave(factor, 1)  # each pixel as a square block
    assert torch.equal(pixels.float(), blocks)
    with Image.open(save_image_grid(images[:2], tmp_path / "row.png")) as row:
        assert row.size == (2 * cell_w + 3 * GUTTER, cell_h + 2 * GUTTER)
    with Image.open(save_image_grid(torch.zeros(1, 3, 200, 300), tmp_path / "large.png")) as large:
        assert large.size == (300 + 2 * GUTTER, 200 + 2 * GUTTER)  # large enough: kept at its size


def test_a_grid_wraps_each_caption_inside_its_own_cell(tmp_path):
    images = torch.full((2, 3, 16, 16), -1.0)
    long_caption = "a large purple triangle at the bottom and " + "unbreakable" * 6 + " on a white background"
    path = save_image_grid(images, tmp_path / "grid.png", captions=[long_caption, ""], columns=2)
    cell = 128
    with Image.open(path) as grid:
        band = grid.crop((0, GUTTER + cell + 1, grid.size[0], grid.size[1])).convert("L")
        width, height = band.size
        dark = [(x, y) for y in range(height) for x in range(width) if band.getpixel((x, y)) < 128]
    assert height > 4 * 10  # the caption took several lines
    assert dark, "the caption is drawn"
    assert all(GUTTER <= x < GUTTER + cell for x, _ in dark)  # all of it in the first cell, none in the second


def test_a_grid_as_an_image_is_what_save_image_grid_writes(tmp_path):
    images = torch.rand(3, 3, 16, 16) * 2 - 1
    grid = image_grid(images, captions=fixed_prompts(3))
    with Image.open(save_image_grid(images, tmp_path / "grid.png", captions=fixed_prompts(3))) as saved:
        assert grid.mode == "RGB" and grid.tobytes() == saved.convert("RGB").tobytes()


def test_a_grid_refuses_a_wrong_shape_and_a_wrong_number_of_captions(tmp_path):
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\]"):
        save_image_grid(torch.zeros(3, 16, 16), tmp_path / "x.png")
    with pytest.raises(ValueError, match="2 captions for 3 images"):
        save_image_grid(torch.zeros(3, 3, 16, 16), tmp_path / "x.png", captions=["a", "b"])
    with pytest.raises(ValueError, match="a list of strings, one per image"):
        save_image_grid(torch.zeros(1, 3, 16, 16), tmp_path / "x.png", captions="a")


def test_importing_the_images_package_loads_neither_datasets_nor_pil():
    result = run_python(
        "import sys, titanpod.data.images\n"
        "heavy = ('datasets', 'pyarrow', 'pandas', 'PIL')\n"
        "print(','.join(m for m in heavy if m in sys.modules) or 'none')\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "none"
