"""Opening images and captions: a local image folder and Hub datasets through the ``datasets`` library (imported
lazily, inside each function).

Every failure here is a ``DataError`` that names the folder, file, dataset or column at fault.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from titanpod.data.config import closest
from titanpod.data.images.config import ImageDataConfig
from titanpod.data.images.transforms import check_image_file
from titanpod.data.sources import DataError, first_line, quiet_datasets, silenced

if TYPE_CHECKING:
    from datasets import Features, IterableDataset


def image_extensions() -> tuple[str, ...]:
    """File name extensions the ``imagefolder`` builder reads as images (``.png``, ``.jpg``, ...)."""
    from datasets.packaged_modules.imagefolder.imagefolder import ImageFolder

    return tuple(ImageFolder.EXTENSIONS)


def describe_images(config: ImageDataConfig) -> str:
    """A few words naming where the images come from."""
    if config.source == "hub":
        return f"hub {config.path}{f' ({config.name})' if config.name else ''} split {config.split}"
    if config.source == "imagefolder":
        return f"imagefolder {config.path}"
    return "built-in shapes"


def check_columns(columns: list[str], config: ImageDataConfig, where: str) -> None:
    """Refuse an image or caption column that is not one of ``columns``, listing them and suggesting the closest."""
    for field in ("image_field", "caption_field"):
        name = getattr(config, field)
        if name in columns:
            continue
        hint = ""
        folder = Path(str(config.path))
        if field == "caption_field" and config.source == "imagefolder" and not any(folder.rglob("metadata.*")):
            hint = (
                " imagefolder reads captions from a metadata.jsonl or metadata.csv beside the images, with a "
                f"file_name column and a {name} column; write one."
            )
        raise DataError(
            f"data.{field} {name!r} is not a column of {where}; its columns are {', '.join(columns)}."
            f"{closest(name, columns)} Set --data.{field}.{hint}"
        )


def _columns(features: Features | None, first: dict[str, Any] | None) -> list[str]:
    if features is not None:
        return list(features)
    return list(first or {})


def _undecoded(dataset: IterableDataset, config: ImageDataConfig) -> IterableDataset:
    """``dataset`` with only the image and caption columns, images left encoded (decoded by us, naming the file)."""
    import datasets

    dataset = dataset.select_columns([config.image_field, config.caption_field])
    features = dataset.features
    if features is not None and isinstance(features[config.image_field], datasets.Image):
        dataset = dataset.cast_column(config.image_field, datasets.Image(decode=False))
    return dataset


def image_name(value: Any) -> str | None:
    """The file name an image column value carries, if any (``{"bytes", "path"}`` or a path string)."""
    if isinstance(value, dict):
        return value.get("path") or None
    return value if isinstance(value, str) else None


def caption_text(value: Any, config: ImageDataConfig, where: str) -> str:
    """One caption, with an error naming the image when it is missing or not text."""
    if not isinstance(value, str):
        missing = "has no caption" if value is None else f"has a {type(value).__name__} caption, not text"
        raise DataError(
            f"{where} {missing} in column {config.caption_field!r}; give every image a caption (an empty string "
            "is allowed) or name the caption column with --data.caption_field."
        )
    return value


def read_image_folder(config: ImageDataConfig) -> tuple[list[Any], list[str]]:
    """Every image of the folder (its path, or ``{"bytes", "path"}`` from an archive) and its caption, in the
    ``imagefolder`` builder's order; every image file's header and checksums are checked here."""
    import datasets

    folder = Path(str(config.path))
    if not folder.exists():
        raise DataError(
            f"data.path {str(folder)!r} does not exist; give a folder of images with a metadata.jsonl or "
            f"metadata.csv holding a file_name and a {config.caption_field} column."
        )
    if not folder.is_dir():
        raise DataError(
            f"data.path {str(folder)!r} is a file; data.source 'imagefolder' reads a folder of images (with a "
            "metadata.jsonl or metadata.csv of captions): point data.path at that folder."
        )
    extensions = image_extensions()
    if not any(
        item.suffix.lower() in extensions and item.is_file() and not item.name.startswith(".")
        for item in folder.rglob("*")
    ):
        raise DataError(
            f"data.path {str(folder)!r} is a folder with no image files (.png, .jpg, .jpeg, .webp, ...); "
            "point data.path at the folder that holds the images."
        )
    quiet_datasets()
    where = describe_images(config)
    try:
        with silenced():
            stream = datasets.load_dataset("imagefolder", data_dir=str(folder), split="train", streaming=True)
            columns = _columns(stream.features, None if stream.features is not None else next(iter(stream), None))
            check_columns(columns, config, where)
            rows = list(_undecoded(stream, config))
    except DataError:
        raise
    except Exception as error:  # a metadata file that does not parse or names missing files, ...
        raise DataError(f"Cannot read the image folder {folder}: {first_line(error)}") from error
    images, captions = [], []
    for number, row in enumerate(rows):
        value = row[config.image_field]
        name = image_name(value)
        captions.append(caption_text(row[config.caption_field], config, f"The image {name or f'number {number}'}"))
        if isinstance(value, dict) and value.get("bytes") is None and name:
            check_image_file(name)
            value = name
        images.append(value)
    return images, captions


def open_hub(config: ImageDataConfig, split: str) -> IterableDataset:
    """``split`` of the configured Hub dataset streamed, with only the image and caption columns, images left
    encoded; its first row has been read, so a wrong id, split or column is found now, before training."""
    import datasets

    quiet_datasets()
    try:
        with silenced():
            stream = datasets.load_dataset(config.path, config.name, split=split, streaming=True)
            first = next(iter(stream), None)
    except Exception as error:
        raise DataError(
            f"Cannot stream the Hub dataset {config.path!r} (config {config.name!r}, split {split!r}): "
            f"{first_line(error)}. Check the id, data.name and the split, and the network (HF_HUB_OFFLINE unset); "
            "or download the images and read them with --data.source imagefolder --data.path FOLDER."
        ) from error
    where = f"hub {config.path} split {split}"
    if first is None:
        raise DataError(f"{where} holds no images.")
    check_columns(_columns(stream.features, first), config, where)
    return _undecoded(stream, config)
