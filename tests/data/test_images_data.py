"""build_image_data: the shapes set, a local image folder, and a streamed dataset (a local folder read with
streaming=True stands in for a Hub dataset, offline); resume, per-rank shares, caption dropout, validation."""

import csv
import json

import pytest
import torch
from PIL import Image

from tests.data.data_helpers import private_datasets_cache  # noqa: F401  (an autouse fixture)
from titanpod.data.images import ImageBatches, ImageDataConfig, build_image_data, drops_caption, gather_image_state
from titanpod.data.images.shapes import shapes_scene
from titanpod.data.images.transforms import to_tensor


def colour(index):
    """The solid colour image ``index`` of a test folder is painted in."""
    return (index * 37) % 256, (index * 91 + 40) % 256, (index * 53 + 80) % 256


def write_folder(folder, count, metadata="jsonl", start=0):
    """``count`` solid-colour PNGs of varied size and mode, captioned ``image <i>`` in a metadata file.

    Returns {caption: the RGB colour the loader should give}.
    """
    folder.mkdir(parents=True, exist_ok=True)
    rows, expected = [], {}
    for index in range(start, start + count):
        size = [(20, 20), (40, 20), (16, 48)][index % 3]
        name = f"img-{index:03d}.png"
        rgb = colour(index)
        if index % 5 == 3:  # opaque RGBA
            Image.new("RGBA", size, (*rgb, 255)).save(folder / name)
        elif index % 5 == 4:  # greyscale
            rgb = (rgb[0],) * 3
            Image.new("L", size, rgb[0]).save(folder / name)
        else:
            Image.new("RGB", size, rgb).save(folder / name)
        rows.append({"file_name": name, "text": f"image {index}", "id": index})
        expected[f"image {index}"] = rgb
    if metadata == "jsonl":
        (folder / "metadata.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    elif metadata == "csv":
        with open(folder / "metadata.csv", "w", newline="", encoding="utf-8") as file:
            writer = csv.DictWriter(file, fieldnames=["file_name", "text", "id"])
            writer.writeheader()
            writer.writerows(rows)
    return expected


def take(iterator, count):
    return [next(iterator) for _ in range(count)]


def same(first, second):
    return len(first) == len(second) and all(
        torch.equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(first, second, strict=True)
    )


def solid(image_CHW):
    """The RGB colour of a solid image in [-1, 1], as 0-255 integers (asserting it is solid)."""
    pixels = ((image_CHW + 1) * 127.5).round()
    assert torch.equal(pixels, pixels[:, :1, :1].expand_as(pixels)), "the image is not one solid colour"
    return tuple(int(value) for value in pixels[:, 0, 0])


@pytest.mark.parametrize("metadata", ["jsonl", "csv"])
def test_an_image_folder_reads_back_every_image_with_its_caption(tmp_path, metadata):
    expected = write_folder(tmp_path / "images", 12, metadata)
    config = ImageDataConfig(
        source="imagefolder", path=str(tmp_path / "images"), resolution=16, batch_size=4, caption_dropout=0.0
    )
    data = build_image_data(config, seed=0, rank=0, world_size=1)
    assert data.train.batches_per_epoch == 3 and data.validation is None
    seen = {}
    for images, captions in take(data.train, 3):
        assert images.shape == (4, 3, 16, 16) and images.dtype == torch.float32
        assert images.min() >= -1 and images.max() <= 1
        seen.update({caption: solid(image) for image, caption in zip(images, captions, strict=True)})
    assert seen == expected
    assert "imagefolder" in data.describe() and "12 images" in data.describe() and "16x16" in data.describe()


def test_images_are_resized_on_the_short_side_and_centre_cropped(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    wide = Image.new("RGB", (96, 32), (255, 0, 0))
    wide.paste((0, 255, 0), (32, 0, 64, 32))  # left third red, middle green, right third red
    wide.save(folder / "wide.png")
    tall = Image.new("RGB", (20, 60), (0, 0, 255))
    tall.paste((255, 255, 0), (0, 20, 20, 40))
    tall.save(folder / "tall.png")
    rows = [{"file_name": "wide.png", "text": "wide"}, {"file_name": "tall.png", "text": "tall"}]
    (folder / "metadata.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    config = ImageDataConfig(source="imagefolder", path=str(folder), resolution=16, batch_size=2, caption_dropout=0)
    images, captions = next(build_image_data(config, 0, 0, 1).train)
    got = {caption: solid(image) for image, caption in zip(images, captions, strict=True)}
    assert got == {"wide": (0, 255, 0), "tall": (255, 255, 0)}


def test_shapes_batches_are_the_drawn_images_with_their_captions():
    config = ImageDataConfig(resolution=32, batch_size=4, shapes_count=40, caption_dropout=0.0)
    data = build_image_data(config, seed=7, rank=0, world_size=1)
    order = data.train.next_indices()
    images, captions = next(data.train)
    assert captions == [shapes_scene(7, index).caption for index in order]
    assert torch.equal(images, torch.stack([to_tensor(shapes_scene(7, index).draw(32)) for index in order]))
    assert "built-in shapes (40 images, seed 7)" in data.describe()


def test_every_training_image_comes_once_per_epoch_and_the_order_changes_every_epoch():
    train = build_image_data(ImageDataConfig(batch_size=4, shapes_count=40, resolution=16), 0, 0, 1).train
    epochs = []
    for _ in range(2):
        order = []
        for _ in range(train.batches_per_epoch):
            order += train.next_indices()
            next(train)
        epochs.append(order)
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(40))
    assert epochs[0] != epochs[1]


def resumed(build, before, after):
    """``after`` batches following ``before`` of one loader, and of a new loader resumed from a JSON round trip of
    the first one's position."""
    reference = build().train
    expected = take(reference, before + after)[before:]
    first = build().train
    take(first, before)
    state = json.loads(json.dumps(first.state_dict()))
    second = build().train
    second.load_state_dict(state)
    return expected, take(second, after)


@pytest.mark.parametrize("source", ["shapes", "imagefolder", "hub"])
@pytest.mark.parametrize(("rank", "world_size"), [(0, 1), (1, 2)])
def test_resume_is_exact_across_an_epoch_boundary_dropped_captions_included(tmp_path, source, rank, world_size):
    fields = {"resolution": 16, "batch_size": 3, "caption_dropout": 0.5}
    if source == "shapes":
        fields["shapes_count"] = 20
    else:
        write_folder(tmp_path / "images", 14)
        fields["path"] = str(tmp_path / "images")
    config = ImageDataConfig(source=source, **fields)

    def build():
        return build_image_data(config, seed=3, rank=rank, world_size=world_size)

    expected, got = resumed(build, 5, 6)  # an epoch is 2 to 6 batches here
    assert same(expected, got)
    assert any(caption == "" for _, captions in got for caption in captions)
    assert any(caption != "" for _, captions in got for caption in captions)


def test_ranks_take_disjoint_shares_of_every_global_batch():
    config = ImageDataConfig(batch_size=3, shapes_count=30, resolution=16, caption_dropout=0.3)
    ranks = [build_image_data(config, seed=1, rank=rank, world_size=2).train for rank in range(2)]
    whole = build_image_data(
        ImageDataConfig(batch_size=6, shapes_count=30, resolution=16, caption_dropout=0.3), 1, 0, 1
    )
    assert ranks[0].batches_per_epoch == whole.train.batches_per_epoch == 5
    for _ in range(12):  # over two epochs
        shares = [ranks[0].next_indices(), ranks[1].next_indices()]
        assert not set(shares[0]) & set(shares[1])
        assert shares[0] + shares[1] == whole.train.next_indices()
        (first, first_captions), (second, second_captions) = next(ranks[0]), next(ranks[1])
        images, captions = next(whole.train)
        assert torch.equal(torch.cat([first, second]), images) and first_captions + second_captions == captions


def test_ranks_of_an_image_folder_and_of_a_stream_read_disjoint_images(tmp_path):
    expected = write_folder(tmp_path / "images", 12)
    for source in ("imagefolder", "hub"):
        config = ImageDataConfig(
            source=source, path=str(tmp_path / "images"), resolution=16, batch_size=2, caption_dropout=0.0
        )
        seen = [
            [caption for _, captions in take(build_image_data(config, 0, rank, 3).train, 2) for caption in captions]
            for rank in range(3)
        ]
        assert sorted(seen[0] + seen[1] + seen[2]) == sorted(expected), source


def test_caption_dropout_is_a_seeded_coin_per_image_and_epoch():
    decisions = [drops_caption(5, 0, index, 0.1) for index in range(20_000)]
    assert 0.09 < sum(decisions) / len(decisions) < 0.11
    assert decisions == [drops_caption(5, 0, index, 0.1) for index in range(20_000)]
    assert decisions != [drops_caption(5, 1, index, 0.1) for index in range(20_000)]
    assert decisions != [drops_caption(6, 0, index, 0.1) for index in range(20_000)]
    assert not any(drops_caption(5, 0, index, 0.0) for index in range(100))
    assert all(drops_caption(5, 0, index, 1.0) for index in range(100))


def test_the_loader_drops_captions_at_about_the_configured_rate_and_reproducibly():
    config = ImageDataConfig(batch_size=10, shapes_count=300, resolution=16, caption_dropout=0.25)

    def captions(seed):
        train = build_image_data(config, seed=seed, rank=0, world_size=1).train
        return [caption for _, batch in take(train, train.batches_per_epoch) for caption in batch]

    first = captions(0)
    assert 0.17 < first.count("") / len(first) < 0.33
    assert first == captions(0)
    assert first != captions(1)
    no_dropout = ImageBatches(lambda i: (torch.zeros(3, 2, 2), f"caption {i}"), list(range(50)), 5)
    assert all(caption for _, batch in take(no_dropout, 10) for caption in batch)


def test_held_out_shapes_give_fixed_validation_batches_without_dropped_captions():
    config = ImageDataConfig(
        batch_size=4,
        shapes_count=100,
        resolution=16,
        caption_dropout=1.0,
        validation_fraction=0.2,
        validation_batches=4,
    )
    data = build_image_data(config, seed=0, rank=0, world_size=1)
    assert data.validation is not None and len(data.validation) == 4
    assert all(caption for _, captions in data.validation for caption in captions)
    again = build_image_data(config, seed=0, rank=0, world_size=1).validation
    assert same(data.validation, again)
    held = {caption for _, captions in data.validation for caption in captions}
    assert len(data.train.indices) == 80 and not set(data.train.indices) & {i for i in range(100) if i % 5 == 4}
    assert all(next(data.train)[1] == [""] * 4 for _ in range(3))  # training captions all dropped at 1.0
    assert held and "validation: 4 batches from 20 held-out images" in data.describe()


def test_held_out_images_of_a_folder_are_not_trained_on(tmp_path):
    expected = write_folder(tmp_path / "images", 20)
    config = ImageDataConfig(
        source="imagefolder",
        path=str(tmp_path / "images"),
        resolution=16,
        batch_size=2,
        caption_dropout=0.0,
        validation_fraction=0.25,
        validation_batches=10,
    )
    data = build_image_data(config, seed=0, rank=0, world_size=1)
    held_out = {f"image {index}" for index in range(20) if index % 4 == 3}  # 5 images: 2 batches of 2 on 1 rank
    held = [caption for _, captions in data.validation for caption in captions]
    assert len(held) == 4 and set(held) < held_out
    trained = {caption for _, captions in take(data.train, 4 * data.train.batches_per_epoch) for caption in captions}
    assert trained == set(expected) - held_out


def test_a_stream_with_a_validation_split_gives_its_first_batches(tmp_path):
    write_folder(tmp_path / "data" / "train", 10)
    validation = write_folder(tmp_path / "data" / "validation", 4, start=100)
    config = ImageDataConfig(
        source="hub",
        path=str(tmp_path / "data"),
        resolution=16,
        batch_size=2,
        caption_dropout=1.0,
        validation_split="validation",
        validation_batches=2,
    )
    data = build_image_data(config, seed=0, rank=0, world_size=1)
    captions = [caption for _, batch in data.validation for caption in batch]
    assert captions == list(validation)
    for images, batch in data.validation:
        assert [solid(image) for image in images] == [validation[caption] for caption in batch]
    assert next(data.train)[1] == ["", ""]
    assert "streamed in order" in data.describe() and "2 batches from split validation" in data.describe()


def test_a_stream_cycles_epoch_after_epoch(tmp_path):
    expected = write_folder(tmp_path / "images", 5)
    config = ImageDataConfig(
        source="hub", path=str(tmp_path / "images"), resolution=16, batch_size=2, caption_dropout=0
    )
    train = build_image_data(config, 0, 0, 1).train
    captions = [caption for _, batch in take(train, 5) for caption in batch]
    assert captions == [*expected, *expected]
    assert train.state_dict()["epoch"] == 1


def test_a_streamed_position_saved_for_every_rank_resumes_each_rank(tmp_path):
    write_folder(tmp_path / "images", 10)
    config = ImageDataConfig(source="hub", path=str(tmp_path / "images"), resolution=16, batch_size=2)
    ranks = [build_image_data(config, 0, rank, 2).train for rank in range(2)]
    for train in ranks:
        take(train, 3)
    for alone in (build_image_data(config, 0, 0, 1).train, build_image_data(ImageDataConfig(), 0, 1, 2).train):
        assert gather_image_state(alone) == alone.state_dict()  # one stream, or an indexed set: nothing to gather
    saved = json.loads(json.dumps({"per_rank": [train.state_dict() for train in ranks]}))
    for rank, train in enumerate(ranks):
        resumed_rank = build_image_data(config, 0, rank, 2).train
        resumed_rank.load_state_dict(saved)
        assert same(take(resumed_rank, 4), take(train, 4))
    with pytest.raises(ValueError, match="positions are of 2 data ranks, but this run has 1"):
        build_image_data(config, 0, 0, 1).train.load_state_dict(saved)
