"""The image part of a diffusion run's config: where images and captions come from, and their size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from titanpod.data.config import closest
from titanpod.models.field_checks import expand_home

ImageSource = Literal["shapes", "imagefolder", "hub"]
"""What ``ImageDataConfig.source`` accepts."""
IMAGE_SOURCES: tuple[str, ...] = get_args(ImageSource)
"""Every value ``ImageDataConfig.source`` accepts."""
RESOLUTION_STEP = 16
"""Image sides must be a multiple of this: FLUX's autoencoder downsamples 8x and the transformer packs 2x2 latent
patches into one token, so each token covers 16 x 16 pixels."""


@dataclass(frozen=True)
class ImageDataConfig:
    """Where images and their captions come from, and how they become batches for diffusion training.

    Every image is resized on its short side to ``resolution`` and centre-cropped to a square; batches are
    ``(images_BCHW, captions)`` with float32 pixels in [-1, 1].
    """

    source: ImageSource = "shapes"
    """shapes (built-in synthetic shapes with exact captions), imagefolder (a local folder) or hub (a Hub dataset)."""
    path: str | None = None
    """``imagefolder``: a folder of images with a metadata.jsonl or metadata.csv (``file_name`` and caption columns).
    ``hub``: a dataset id such as user/pokemon-captions."""
    name: str | None = None
    """``hub`` only: the dataset's config name (None: its default)."""
    split: str = "train"
    """``hub`` only: the split to train on."""
    image_field: str = "image"
    """The column holding the images (imagefolder always names it ``image``)."""
    caption_field: str = "text"
    """The column holding each image's caption (imagefolder: a column of its metadata file)."""
    resolution: int = 64
    """Side of the square training images in pixels, a multiple of 16 (64 suits the debug recipe)."""
    batch_size: int = 8
    """Images per batch on each process."""
    caption_dropout: float = 0.1
    """Probability that a training caption is replaced by "" (the unconditional case of classifier-free guidance).
    The decision for an image is seeded by (seed, epoch, image index), so a resumed run makes the same ones."""
    shapes_count: int = 512
    """``shapes`` only: how many built-in images (image i depends only on the seed and i)."""
    validation_split: str | None = None
    """``hub`` only: the split held out for validation, e.g. validation (None: no validation)."""
    validation_fraction: float = 0.0
    """``shapes`` and ``imagefolder``: the fraction of images held out for validation, chosen by index (0: none)."""
    validation_batches: int = 8
    """Batches on each process per evaluation (at most this many when few images are held out)."""

    @property
    def has_validation(self) -> bool:
        """Whether any images are held out for validation."""
        return self.validation_split is not None or self.validation_fraction > 0

    def __post_init__(self) -> None:
        expand_home(self, "path")
        if self.source not in IMAGE_SOURCES:
            raise ValueError(
                f"Unknown data.source {self.source!r} for images; choose one of {', '.join(IMAGE_SOURCES)}."
                f"{closest(self.source, IMAGE_SOURCES)}"
            )
        if self.source != "shapes" and not self.path:
            what = "a Hub dataset id" if self.source == "hub" else "a folder of images with a metadata.jsonl"
            raise ValueError(f"data.source {self.source!r} needs data.path: {what}.")
        if self.source == "shapes" and self.path is not None:
            raise ValueError(
                "data.path is not read for data.source 'shapes' (the images are drawn, not read); drop it, or set "
                "data.source to imagefolder or hub."
            )
        if self.source != "hub":
            for field, value in (("name", self.name), ("validation_split", self.validation_split)):
                if value is not None:
                    raise ValueError(
                        f"data.{field} is read only with data.source 'hub', not {self.source!r}; drop it"
                        + (" and hold out images with data.validation_fraction (e.g. 0.1)." if field != "name" else ".")
                    )
        if self.source == "hub" and self.validation_fraction > 0:
            raise ValueError(
                "data.validation_fraction holds out images of the shapes set or a local folder; for data.source 'hub' "
                "name a held-out split with data.validation_split (e.g. validation) instead."
            )
        if not self.image_field:
            raise ValueError("data.image_field must name the column that holds the images, e.g. 'image'.")
        if not self.caption_field:
            raise ValueError("data.caption_field must name the column that holds the captions, e.g. 'text'.")
        if self.resolution < RESOLUTION_STEP or self.resolution % RESOLUTION_STEP:
            below = max(RESOLUTION_STEP, self.resolution // RESOLUTION_STEP * RESOLUTION_STEP)
            raise ValueError(
                f"data.resolution must be a positive multiple of {RESOLUTION_STEP}, got {self.resolution}: FLUX's "
                "autoencoder downsamples 8x and the transformer packs 2x2 latent patches, so every 16 x 16 pixels "
                f"make one token. Use {below} or {below + RESOLUTION_STEP}."
            )
        if self.batch_size < 1:
            raise ValueError(f"data.batch_size must be at least 1, got {self.batch_size}.")
        if not 0.0 <= self.caption_dropout <= 1.0:
            raise ValueError(
                f"data.caption_dropout is a probability, between 0 and 1 (0.1 is usual), got {self.caption_dropout}."
            )
        if self.shapes_count < 1:
            raise ValueError(f"data.shapes_count must be at least 1, got {self.shapes_count}.")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ValueError(
                f"data.validation_fraction must be at least 0 and below 1 (e.g. 0.1), got {self.validation_fraction}."
            )
        if self.validation_batches < 1:
            raise ValueError(f"data.validation_batches must be at least 1, got {self.validation_batches}.")
