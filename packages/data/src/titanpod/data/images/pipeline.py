"""The one entry point from an ``ImageDataConfig`` to this process's training and validation batches of images.

A batch is ``(images_BCHW, captions)``: float32 [batch_size, 3, resolution, resolution] in [-1, 1] and a list of
``batch_size`` strings, some replaced by "" for classifier-free guidance (training batches only).
Legend: B batch, C channels, H height, W width.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from titanpod.data.images.config import ImageDataConfig
from titanpod.data.images.shapes import draw_shapes
from titanpod.data.images.sources import caption_text, describe_images, image_name, open_hub, read_image_folder
from titanpod.data.images.transforms import decode_image, prepare, to_tensor
from titanpod.data.packing import is_held_out
from titanpod.data.positions import check_batch_index
from titanpod.data.rank_state import gather_rank_states, this_rank_state
from titanpod.data.sources import DataError, first_line

if TYPE_CHECKING:
    from datasets import IterableDataset

ImageBatch = tuple[torch.Tensor, list[str]]
"""``(images_BCHW float32 in [-1, 1], captions)``."""
Example = tuple[torch.Tensor, str]
"""One image [C, H, W] and its caption."""


def drops_caption(seed: int, epoch: int, index: int | str, probability: float) -> bool:
    """Whether the caption of image ``index`` is dropped in ``epoch``: a coin seeded by (seed, epoch, index) alone,
    so the decision is the same after a resume and whatever the number of ranks."""
    if probability <= 0.0:
        return False
    if probability >= 1.0:
        return True
    digest = hashlib.blake2b(f"caption-dropout/{seed}/{epoch}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < probability


def _stack(examples: list[Example]) -> ImageBatch:
    return torch.stack([image for image, _ in examples]), [caption for _, caption in examples]


class ImageBatches:
    """Endless batches of images read by index, reshuffled every epoch.

    ``load(i)`` gives image ``i`` of the data and its caption; ``indices`` are the images trained on. Their order is
    a seeded permutation per epoch; process ``rank`` of ``world_size`` takes its own slice of every global batch.
    ``state_dict`` holds the position, so a resumed run sees the same batches and the same dropped captions.
    """

    def __init__(
        self,
        load: Callable[[int], Example],
        indices: list[int],
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        caption_dropout: float = 0.0,
    ) -> None:
        global_batch = batch_size * world_size
        if len(indices) < global_batch:
            raise ValueError(
                f"{len(indices):,} training images are fewer than one global batch of {global_batch} "
                f"({batch_size} on each of {world_size} ranks). Use more images or a smaller data.batch_size."
            )
        self._load, self.indices = load, indices
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.caption_dropout = caption_dropout
        self.batches_per_epoch = len(indices) // global_batch
        self.epoch, self.index = 0, 0
        self._order = self._permutation(self.epoch)

    def _permutation(self, epoch: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.indices), generator=generator)

    def __iter__(self) -> ImageBatches:
        return self

    def next_indices(self) -> list[int]:
        """The images of the next batch (by index into the data), without moving on."""
        epoch, index, order = self.epoch, self.index, self._order
        if index == self.batches_per_epoch:
            epoch, index = epoch + 1, 0
            order = self._permutation(epoch)
        start = (index * self.world_size + self.rank) * self.batch_size
        return [self.indices[int(position)] for position in order[start : start + self.batch_size]]

    def __next__(self) -> ImageBatch:
        if self.index == self.batches_per_epoch:
            self.epoch, self.index = self.epoch + 1, 0
            self._order = self._permutation(self.epoch)
        chosen = self.next_indices()
        examples = []
        for image_index in chosen:
            image, caption = self._load(image_index)
            if drops_caption(self.seed, self.epoch, image_index, self.caption_dropout):
                caption = ""
            examples.append((image, caption))
        self.index += 1
        return _stack(examples)

    def state_dict(self) -> dict[str, Any]:
        """Where the iterator stands: epoch and batch within it, the seed of the order and the number of images."""
        return {
            "kind": "images",
            "epoch": self.epoch,
            "index": self.index,
            "seed": self.seed,
            "images": len(self.indices),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a position saved by ``state_dict``; ``DataPositionError`` for a batch index past an epoch."""
        if state.get("kind") != "images":
            raise ValueError(
                f"The saved data position is of a {state.get('kind', 'packed')} loader, but this run's data is a set "
                "of images read by index: resume with the data settings the checkpoint was made with."
            )
        if state["images"] != len(self.indices):
            raise ValueError(
                f"The saved data position is for {state['images']:,} training images, but this run has "
                f"{len(self.indices):,}: resume with the images and data settings the checkpoint was made with."
            )
        check_batch_index(state["index"], self.batches_per_epoch)
        self.seed, self.epoch, self.index = state["seed"], state["epoch"], state["index"]
        self._order = self._permutation(self.epoch)


class StreamedImageBatches:
    """Endless batches from a stream of images (this rank's shard of a Hub dataset), in stream order, epoch after
    epoch.

    The saved position is the dataset's own ``state_dict`` after the last batch served, so a resume is exact.
    The caption of the ``n``-th image this rank reads in an epoch is dropped by ``drops_caption`` with index
    ``rank:n``. With ``repeat`` False the batches end with the stream (for validation).
    """

    batches_per_epoch = None
    """Unknown for a stream."""

    def __init__(
        self,
        open_dataset: Callable[[], IterableDataset],
        convert: Callable[[dict[str, Any], str], Example],
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        caption_dropout: float = 0.0,
        repeat: bool = True,
    ) -> None:
        self._open_dataset, self._convert = open_dataset, convert
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.caption_dropout, self.repeat = caption_dropout, repeat
        self.epoch, self.position = 0, 0
        self._snapshot: dict[str, Any] | None = None
        self._dataset: IterableDataset | None = None
        self._iterator: Iterator[dict[str, Any]] | None = None

    def _open(self) -> None:
        self._dataset = self._open_dataset()
        if self._snapshot is not None:
            self._dataset.load_state_dict(self._snapshot)
        self._iterator = iter(self._dataset)

    def __iter__(self) -> StreamedImageBatches:
        return self

    def __next__(self) -> ImageBatch:
        examples: list[Example] = []
        while len(examples) < self.batch_size:
            if self._iterator is None:
                self._open()
            assert self._iterator is not None and self._dataset is not None
            try:
                row = next(self._iterator)
            except StopIteration:
                if self.position == 0:
                    raise DataError(
                        f"The image stream of rank {self.rank} of {self.world_size} holds no images; use fewer ranks "
                        "or a dataset with more images (or more shards)."
                    ) from None
                if not self.repeat:
                    raise
                self.epoch, self.position, self._snapshot, self._iterator = self.epoch + 1, 0, None, None
                continue
            except Exception as error:  # a dropped connection, a file that does not parse
                raise DataError(
                    f"Reading the image stream failed on rank {self.rank} (epoch {self.epoch}, after {self.position} "
                    f"images of it): {first_line(error)}"
                ) from error
            image, caption = self._convert(row, f"number {self.position} of rank {self.rank}'s stream")
            if drops_caption(self.seed, self.epoch, f"{self.rank}:{self.position}", self.caption_dropout):
                caption = ""
            examples.append((image, caption))
            self.position += 1
        self._snapshot = self._dataset.state_dict()
        return _stack(examples)

    def state_dict(self) -> dict[str, Any]:
        """This rank's position: epoch, images read in it, and the dataset's own state after them."""
        return {
            "kind": "image_stream",
            "epoch": self.epoch,
            "position": self.position,
            "dataset": self._snapshot,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a position saved by ``state_dict`` (or by ``gather_image_state``: ``{"per_rank": [...]}``)."""
        state = this_rank_state(state, "image_stream", self.rank, self.world_size, "images", "gather_image_state")
        self.seed, self.epoch, self.position = state["seed"], state["epoch"], state["position"]
        self._snapshot, self._iterator = state["dataset"], None


TrainImages = ImageBatches | StreamedImageBatches
"""What ``ImageData.train`` is."""


@dataclass
class ImageData:
    """This process's images: training batches, optional validation batches, and a line that describes them."""

    train: TrainImages
    """Endless training batches with ``state_dict`` / ``load_state_dict`` (save it in checkpoints)."""
    validation: list[ImageBatch] | None
    """A fixed list of validation batches (captions never dropped), or ``None`` without held-out images."""
    description: str
    """One line for the run's start: source, images, resolution, batches, caption dropout, validation."""

    def describe(self) -> str:
        """One line for the run's start."""
        return self.description


def build_image_data(config: ImageDataConfig, seed: int, rank: int, world_size: int) -> ImageData:
    """Open the configured images for process ``rank`` of ``world_size``: training batches and validation batches.

    Every problem with the configuration or the data (a missing or empty folder, a missing column, an image that
    cannot be decoded, too few images) is raised here, before training.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not one of the {world_size} data-parallel ranks.")
    if config.source == "hub":
        return _streamed(config, seed, rank, world_size)
    if config.source == "shapes":
        count = config.shapes_count

        def load(index: int) -> Example:
            image, caption = draw_shapes(seed, index, config.resolution)
            return to_tensor(image), caption

        where = f"built-in shapes ({count:,} images, seed {seed})"
    else:
        images, captions = read_image_folder(config)
        count = len(images)

        def load(index: int) -> Example:
            return prepare(decode_image(images[index], f"number {index}"), config.resolution), captions[index]

        where = f"{describe_images(config)} ({count:,} images, captions from {config.caption_field!r})"
    return _indexed(config, load, count, where, seed, rank, world_size)


def _indexed(
    config: ImageDataConfig,
    load: Callable[[int], Example],
    count: int,
    where: str,
    seed: int,
    rank: int,
    world_size: int,
) -> ImageData:
    fraction = config.validation_fraction
    held = [index for index in range(count) if is_held_out(index, fraction)]
    kept = [index for index in range(count) if not is_held_out(index, fraction)]
    try:
        train = ImageBatches(load, kept, config.batch_size, seed, rank, world_size, config.caption_dropout)
    except ValueError as error:
        raise DataError(f"{where}: {error}") from error
    validation = None
    summary = "none"
    if fraction > 0:
        global_batch = config.batch_size * world_size
        batches = min(config.validation_batches, len(held) // global_batch)
        if batches == 0:
            raise DataError(
                f"The held-out validation images ({fraction:g} of {count:,}: {len(held):,}) are fewer than one global "
                f"batch of {global_batch}; raise data.validation_fraction or lower data.batch_size."
            )
        validation = []
        for batch in range(batches):
            start = (batch * world_size + rank) * config.batch_size
            validation.append(_stack([load(index) for index in held[start : start + config.batch_size]]))
        summary = f"{batches} batches from {len(held):,} held-out images ({fraction:g})"
    description = (
        f"images: {where} at {config.resolution}x{config.resolution}, {len(kept):,} for training -> "
        f"{train.batches_per_epoch:,} batches of {config.batch_size} per epoch on each of {world_size} rank(s), "
        f"caption dropout {config.caption_dropout:g}; validation: {summary}"
    )
    return ImageData(train, validation, description)


def _streamed(config: ImageDataConfig, seed: int, rank: int, world_size: int) -> ImageData:
    from datasets.distributed import split_dataset_by_node

    def opener(split: str) -> Callable[[], IterableDataset]:
        base = open_hub(config, split)

        def open_dataset() -> IterableDataset:  # a new object each time: a dataset keeps the state it was loaded at
            dataset = base.select_columns([config.image_field, config.caption_field])
            return split_dataset_by_node(dataset, rank, world_size) if world_size > 1 else dataset

        return open_dataset

    def convert(row: dict[str, Any], where: str) -> Example:
        value = row[config.image_field]
        name = image_name(value) or f"{where} in {describe_images(config)}"
        image = prepare(decode_image(value, name), config.resolution)
        return image, caption_text(row[config.caption_field], config, f"The image {name}")

    open_train = opener(config.split)
    train = StreamedImageBatches(open_train, convert, config.batch_size, seed, rank, world_size, config.caption_dropout)
    # The first batch is read now, so an image that cannot be decoded or a missing caption is found before training.
    next(StreamedImageBatches(open_train, convert, config.batch_size, seed, rank, world_size))
    validation = None
    summary = "none"
    if config.validation_split is not None:
        held = StreamedImageBatches(
            opener(config.validation_split), convert, config.batch_size, seed, rank, world_size, repeat=False
        )
        validation = list(itertools.islice(held, config.validation_batches))
        if len(validation) < config.validation_batches:
            got = len(validation)
            fix = f"lower data.validation_batches to {got}" if got else "use a smaller data.batch_size"
            raise DataError(
                f"The validation split {config.validation_split!r} gives rank {rank} of {world_size} only {got} "
                f"batches of {config.batch_size} images; {fix}."
            )
        summary = f"{len(validation)} batches from split {config.validation_split}"
    description = (
        f"images: {describe_images(config)}, streamed in order, rank {rank} of {world_size} reads its own shard in "
        f"batches of {config.batch_size} at {config.resolution}x{config.resolution}, caption dropout "
        f"{config.caption_dropout:g}; validation: {summary}"
    )
    return ImageData(train, validation, description)


def gather_image_state(train: TrainImages) -> dict[str, Any]:
    """The image data position to save in a checkpoint, from every rank: a collective when torch.distributed runs.

    An indexed set's position is the same on every rank, so this is ``train.state_dict()``. A stream's position
    differs per rank: it returns ``{"per_rank": [state of data rank 0, ...]}``, which ``load_state_dict`` on each
    rank understands. Call it on every rank.
    """
    return gather_rank_states(train.state_dict(), "image_stream", "gather_image_state")
