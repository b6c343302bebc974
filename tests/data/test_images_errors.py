"""Bad image settings and bad images fail at build time with a message that names the thing and the fix."""

import json

import pytest
from PIL import Image

from tests.data.data_helpers import private_datasets_cache  # noqa: F401  (an autouse fixture)
from tests.data.test_images_data import write_folder
from titanpod.data import DataError
from titanpod.data.images import ImageBatches, ImageDataConfig, build_image_data


def build(**fields):
    return build_image_data(ImageDataConfig(**{"resolution": 16, "batch_size": 2, **fields}), 0, 0, 1)


@pytest.mark.parametrize("resolution", [0, 8, 40, 1000])
def test_a_resolution_that_is_not_a_multiple_of_16_says_why_and_what_fits(resolution):
    with pytest.raises(ValueError, match=r"data\.resolution must be a positive multiple of 16") as error:
        ImageDataConfig(resolution=resolution)
    message = str(error.value)
    assert f"got {resolution}" in message and "2x2 latent patches" in message and "downsamples 8x" in message
    below = max(16, resolution // 16 * 16)
    assert f"Use {below} or {below + 16}" in message


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"source": "shape"}, r"Unknown data.source 'shape' for images.*Did you mean 'shapes'"),
        ({"source": "imagefolder"}, "needs data.path: a folder of images"),
        ({"source": "hub"}, "needs data.path: a Hub dataset id"),
        ({"path": "some/folder"}, "data.path is not read for data.source 'shapes'"),
        ({"caption_dropout": 1.5}, "data.caption_dropout is a probability"),
        ({"caption_dropout": -0.1}, "data.caption_dropout is a probability"),
        ({"batch_size": 0}, "data.batch_size must be at least 1"),
        ({"shapes_count": 0}, "data.shapes_count must be at least 1"),
        ({"validation_fraction": 1.0}, "data.validation_fraction must be at least 0 and below 1"),
        ({"validation_batches": 0}, "data.validation_batches must be at least 1"),
        ({"validation_split": "validation"}, "data.validation_split is read only with data.source 'hub'"),
        ({"name": "default"}, "data.name is read only with data.source 'hub'"),
        ({"source": "hub", "path": "a/b", "validation_fraction": 0.1}, "name a held-out split"),
        ({"caption_field": ""}, "data.caption_field must name the column"),
        ({"image_field": ""}, "data.image_field must name the column"),
    ],
)
def test_bad_settings_are_refused_with_the_field_and_the_fix(fields, match):
    with pytest.raises(ValueError, match=match):
        ImageDataConfig(**fields)


def test_a_folder_that_does_not_exist_a_file_and_a_folder_without_images_are_named(tmp_path):
    missing = tmp_path / "missing"
    with pytest.raises(DataError, match="does not exist") as error:
        build(source="imagefolder", path=str(missing))
    assert str(missing) in str(error.value) and "metadata.jsonl" in str(error.value)
    (tmp_path / "file.png").write_bytes(b"")
    with pytest.raises(DataError, match=r"is a file; data\.source 'imagefolder' reads a folder"):
        build(source="imagefolder", path=str(tmp_path / "file.png"))
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("no images here")
    (empty / "metadata.jsonl").write_text('{"file_name": "a.png", "text": "a"}\n')
    with pytest.raises(DataError, match="is a folder with no image files") as error:
        build(source="imagefolder", path=str(empty))
    assert str(empty) in str(error.value) and ".png" in str(error.value)


@pytest.mark.parametrize("source", ["imagefolder", "hub"])
def test_a_caption_column_that_is_missing_lists_the_columns_and_the_closest(tmp_path, source):
    write_folder(tmp_path / "images", 4)
    with pytest.raises(DataError, match=r"data\.caption_field 'txt' is not a column") as error:
        build(source=source, path=str(tmp_path / "images"), caption_field="txt")
    message = str(error.value)
    assert "image, text, id" in message and "Did you mean 'text'?" in message and "--data.caption_field" in message
    with pytest.raises(DataError, match=r"data\.image_field 'img' is not a column") as error:
        build(source=source, path=str(tmp_path / "images"), image_field="img")
    assert "Did you mean 'image'?" in str(error.value)


def test_a_folder_without_a_metadata_file_says_where_captions_come_from(tmp_path):
    write_folder(tmp_path / "images", 4, metadata=None)
    with pytest.raises(DataError, match=r"data\.caption_field 'text' is not a column") as error:
        build(source="imagefolder", path=str(tmp_path / "images"))
    assert "its columns are image." in str(error.value) and "metadata.jsonl or metadata.csv" in str(error.value)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_an_image_that_cannot_be_decoded_is_named(tmp_path, damage):
    folder = tmp_path / "images"
    write_folder(folder, 4)
    bad = folder / "img-002.png"
    if damage == "garbage":
        bad.write_bytes(b"this is not a png")
    else:
        bad.write_bytes(bad.read_bytes()[:-20])
    with pytest.raises(DataError, match="Cannot decode the image") as error:
        build(source="imagefolder", path=str(folder))
    message = str(error.value)
    assert str(bad) in message and "Replace or remove the file" in message and "\n" not in message


def test_a_streamed_image_that_cannot_be_decoded_is_named_before_training(tmp_path):
    folder = tmp_path / "images"
    write_folder(folder, 4)
    (folder / "img-001.png").write_bytes(b"not an image either")
    with pytest.raises(DataError, match="Cannot decode the image") as error:
        build(source="hub", path=str(folder))
    assert str(folder / "img-001.png") in str(error.value)


@pytest.mark.parametrize("source", ["imagefolder", "hub"])
def test_an_image_without_a_caption_is_named(tmp_path, source):
    folder = tmp_path / "images"
    folder.mkdir()
    rows = []
    for index, text in enumerate(["one", None, "three", "four"]):
        Image.new("RGB", (16, 16), (index * 50, 0, 0)).save(folder / f"{index}.png")
        rows.append({"file_name": f"{index}.png", "text": text})
    (folder / "metadata.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    with pytest.raises(DataError, match="has no caption in column 'text'") as error:
        build(source=source, path=str(folder))
    assert str(folder / "1.png") in str(error.value)


def test_too_few_images_for_a_global_batch_say_how_many_and_the_fix(tmp_path):
    write_folder(tmp_path / "images", 3)
    with pytest.raises(DataError, match="3 training images are fewer than one global batch of 4") as error:
        build_image_data(
            ImageDataConfig(source="imagefolder", path=str(tmp_path / "images"), resolution=16, batch_size=2), 0, 1, 2
        )
    assert "smaller data.batch_size" in str(error.value)
    with pytest.raises(DataError, match="held-out validation images"):
        build(shapes_count=20, validation_fraction=0.05, batch_size=4)


def test_a_saved_position_of_other_data_is_refused():
    train = build(shapes_count=20).train
    with pytest.raises(ValueError, match="of a packed loader"):
        train.load_state_dict({"kind": "packed", "epoch": 0, "index": 0, "seed": 0})
    with pytest.raises(ValueError, match="for 30 training images, but this run has 20"):
        train.load_state_dict({**train.state_dict(), "images": 30})
    with pytest.raises(ValueError, match="rank 7 is not one of the 2"):
        build_image_data(ImageDataConfig(), 0, 7, 2)
    assert isinstance(train, ImageBatches)


def offline(monkeypatch):
    import datasets
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read at import time
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)


def test_a_hub_dataset_offline_names_the_dataset_and_suggests_a_local_folder(monkeypatch):
    offline(monkeypatch)
    with pytest.raises(DataError, match="Cannot stream the Hub dataset 'someone/captioned-images'") as error:
        build(source="hub", path="someone/captioned-images")
    assert "--data.source imagefolder" in str(error.value)
