"""The pixel check of a shapes prompt, against images the built-in set's own renderer draws: what it draws
passes, and a prompt naming another colour, position, shape or background fails on exactly that attribute."""

import dataclasses
import itertools

import pytest
import torch

from titanpod.data.images import Scene, Shape, shapes_scene
from titanpod.data.images.prompt_check import check_prompt, parse_prompt
from titanpod.data.images.shapes import BACKGROUNDS, COLOURS, KINDS, POSITIONS
from titanpod.data.images.transforms import to_tensor


def drawn(scene: Scene, resolution: int) -> torch.Tensor:
    return to_tensor(scene.draw(resolution))


def one_shape_scenes() -> list[Scene]:
    """Every large shape in every colour at every position on every background, jittered like the set's."""
    scenes = []
    for n, (kind, colour, position, background) in enumerate(itertools.product(KINDS, COLOURS, POSITIONS, BACKGROUNDS)):
        shift = (0.03 * ((n % 3) - 1), 0.03 * (((n // 3) % 3) - 1))
        scenes.append(Scene(background, (Shape(kind, colour, "large", position, shift),)))
    return scenes


@pytest.mark.parametrize("resolution", [16, 32])
def test_every_image_of_the_built_in_set_matches_its_own_caption(resolution):
    for index in range(300):
        scene = shapes_scene(0, index)
        check = check_prompt(scene.caption, drawn(scene, resolution))
        assert check.passed, check.describe()


def test_every_large_shape_colour_position_and_background_matches_at_16_pixels():
    for scene in one_shape_scenes():
        check = check_prompt(scene.caption, drawn(scene, 16))
        assert check.passed, check.describe()


def other(values, value):
    return next(v for v in values if v != value)


def with_shape(scene: Scene, **changes) -> Scene:
    return dataclasses.replace(scene, shapes=(dataclasses.replace(scene.shapes[0], **changes),))


def test_a_prompt_naming_another_attribute_fails_on_that_attribute_alone():
    for n, scene in enumerate(one_shape_scenes()[::7]):
        image = drawn(scene, 16)
        shape = scene.shapes[0]
        kind = KINDS[(KINDS.index(shape.kind) + 1 + n % 2) % 3]
        wrong = {
            "colour": with_shape(scene, colour=other(COLOURS, shape.colour)),
            "position": with_shape(scene, position=other(POSITIONS, shape.position)),
            "shape": with_shape(scene, kind=kind),
            "background": dataclasses.replace(scene, background=other(BACKGROUNDS, scene.background)),
        }
        for attribute, prompt_scene in wrong.items():
            check = check_prompt(prompt_scene.caption, image)
            assert not check.passed, check.describe()
            assert [name for name, ok in check.matches.items() if not ok] == [attribute], check.describe()


def test_an_empty_background_shows_no_shape_and_a_swapped_pair_fails_its_colours():
    blank = Scene("grey", ())
    check = check_prompt("a large red circle on the left on a grey background", drawn(blank, 16))
    assert check.matches == {"background": True, "colour": False, "position": False, "shape": False}
    pair = Scene("white", (Shape("square", "red", "large", "left"), Shape("circle", "blue", "large", "right")))
    assert check_prompt(pair.caption, drawn(pair, 16)).passed
    swapped = Scene("white", (Shape("square", "blue", "large", "left"), Shape("circle", "red", "large", "right")))
    assert check_prompt(swapped.caption, drawn(pair, 16)).matches["colour"] is False


def test_prompts_parse_back_into_their_scene_and_other_text_is_refused():
    for index in range(50):
        scene = shapes_scene(1, index)
        assert parse_prompt(scene.caption).caption == scene.caption
    with pytest.raises(ValueError, match="shapes vocabulary"):
        parse_prompt("a photo of a cat")
    with pytest.raises(ValueError, match="square RGB image"):
        check_prompt("a large red circle on the left on a grey background", torch.zeros(3, 16, 8))
