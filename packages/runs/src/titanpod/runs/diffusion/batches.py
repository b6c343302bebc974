"""Training batches for the flow-matching objective: images and captions encoded once, noise and timesteps drawn.

Legend: B batch, C latent channels, H and W latent size, L image tokens, P packed channels,
T text tokens, D text width.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from titanpod.data.images.pipeline import ImageData, gather_image_state
from titanpod.data.positions import DataPositionError
from titanpod.graph.xla.ahead_of_time import NamedBatchShape
from titanpod.models.flux import FluxArgs
from titanpod.models.flux.flow_matching import (
    image_position_ids,
    pack_latents,
    sample_timesteps,
    text_position_ids,
)
from titanpod.runs.diffusion.components import DiffusionModels


class EncodingCache:
    """The frozen encoders' outputs by content: latents by image bytes, text states by caption.

    With a folder, entries are safetensors files that outlive the run (the folder is tied to
    the codec and text encoders that filled it: use one folder per pair); without, a dict.
    """

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.memory: dict[str, dict[str, torch.Tensor]] = {}
        self.hits = self.misses = 0
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def key(kind: str, payload: bytes) -> str:
        """A file-safe key for ``payload``."""
        return f"{kind}-{hashlib.blake2b(payload, digest_size=16).hexdigest()}"

    def get(self, key: str) -> dict[str, torch.Tensor] | None:
        """The tensors stored under ``key``, or ``None``."""
        found = self.memory.get(key)
        if found is None and self.folder is not None and (self.folder / f"{key}.safetensors").is_file():
            found = load_file(self.folder / f"{key}.safetensors")
            self.memory[key] = found
        self.hits += found is not None
        self.misses += found is None
        return found

    def put(self, key: str, tensors: dict[str, torch.Tensor]) -> None:
        """Store ``tensors`` under ``key`` (written atomically when there is a folder)."""
        tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in tensors.items()}
        self.memory[key] = tensors
        if self.folder is not None:
            partial = self.folder / f".{key}.{os.getpid()}.partial"  # ranks sharing the folder may write one key
            save_file(tensors, partial)
            partial.replace(self.folder / f"{key}.safetensors")


def flow_matching_batch_shape(
    batch: int, args: FluxArgs, image_tokens: int, text_tokens: int, micro_batches: int = 1
) -> NamedBatchShape:
    """The step's batch of named tensors as ``FlowMatchingBatches`` makes it (float32), for ``batch`` samples a
    micro-batch over the whole mesh of a transformer of shape ``args``: what ``--compile-for`` compiles with."""
    shapes = {
        "latents": (batch, image_tokens, args.in_channels),
        "noise": (batch, image_tokens, args.in_channels),
        "timesteps": (batch,),
        "text": (batch, text_tokens, args.context_dim),
        "pooled": (batch, args.pooled_dim),
        "img_ids": (image_tokens, len(args.axes_dims)),
        "txt_ids": (text_tokens, len(args.axes_dims)),
    }
    if args.guidance_embed:
        shapes["guidance"] = (batch,)
    return NamedBatchShape(micro_batches, batch, shapes, dict.fromkeys(shapes, "float32"))


class FlowMatchingBatches:
    """Endless batches for ``FlowMatchingModel.loss(**batch)``, resumable through ``state_dict``.

    This process's share of every global batch comes from ``data`` (its rank of its data world).
    The noise and timestep of each sample come from a generator seeded by (seed, the sample's
    position in the run's stream of global batches) alone, so a resumed run draws what the
    uninterrupted one would have, and a global batch gets the same noise however many data ranks
    share it (one process accumulating the same micro-batches included).
    """

    def __init__(
        self, data: ImageData, models: DiffusionModels, cache: EncodingCache, guidance: float | None, seed: int,
        device: torch.device,
    ) -> None:  # fmt: skip
        self.data, self.models, self.cache = data, models, cache
        self.guidance, self.seed, self.device = guidance, seed, device
        self.index = 0

    def encode_images(self, images_BCHW: torch.Tensor) -> torch.Tensor:
        """Latents [B, C, H, W] of each image, from the cache where it has them."""
        latents = []
        for image in images_BCHW:
            key = EncodingCache.key("latents", image.numpy().tobytes())
            found = self.cache.get(key)
            if found is None:
                found = {"latents": self.models.codec.encode(image[None].to(self.device))[0]}
                self.cache.put(key, found)
            latents.append(found["latents"])
        return torch.stack(latents).to(self.device)

    def encode_captions(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """T5 states [B, T, D] and pooled vectors [B, D_pooled] of each caption, from the cache where it has them.

        The captions the cache lacks are encoded together, in one call of the encoders: every caption is padded to
        the encoders' fixed lengths, so each one's states are those it gets alone, and a run's first epoch (most
        of its captions new) costs one encoder call a batch rather than one a caption.
        """
        keys = {caption: EncodingCache.key("text", caption.encode()) for caption in captions}
        found = {caption: self.cache.get(key) for caption, key in keys.items()}
        missing = [caption for caption, entry in found.items() if entry is None]
        if missing:
            states, vectors = self.models.text_encoders.encode(missing)
            for caption, state, vector in zip(missing, states, vectors, strict=True):
                found[caption] = {"text": state.clone(), "pooled": vector.clone()}  # not views of the batch
                self.cache.put(keys[caption], found[caption])
        text = torch.stack([found[caption]["text"] for caption in captions])
        pooled = torch.stack([found[caption]["pooled"] for caption in captions])
        return text.to(self.device), pooled.to(self.device)

    def sample_positions(self, batch_size: int) -> range:
        """Positions in the run's stream of global batches of this rank's next ``batch_size`` samples: global
        batch ``i`` holds the samples of data rank 0, then rank 1, and so on."""
        train = self.data.train
        start = (self.index * train.world_size + train.rank) * batch_size
        return range(start, start + batch_size)

    def draw_noise(self, shape_BLP: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
        """Noise [B, L, P] and timesteps [B] of this rank's next batch, each sample's from its own position."""
        _, L, P = shape_BLP
        noise, timesteps = [], []
        for position in self.sample_positions(shape_BLP[0]):
            digest = hashlib.blake2b(f"flow/{self.seed}/{position}".encode(), digest_size=8).digest()
            generator = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
            noise.append(torch.randn(L, P, generator=generator))
            timesteps.append(sample_timesteps(1, L, generator))
        return torch.stack(noise).to(self.device), torch.cat(timesteps).to(self.device)

    def __iter__(self) -> FlowMatchingBatches:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        images_BCHW, captions = next(self.data.train)
        latents_BCHW = self.encode_images(images_BCHW)
        _, _, H, W = latents_BCHW.shape
        x0_BLP = pack_latents(latents_BCHW)
        text_BTD, pooled_BD = self.encode_captions(captions)
        noise_BLP, timesteps_B = self.draw_noise(x0_BLP.shape)
        self.index += 1
        batch = {
            "latents": x0_BLP,
            "noise": noise_BLP,
            "timesteps": timesteps_B,
            "text": text_BTD,
            "pooled": pooled_BD,
            "img_ids": image_position_ids(H, W, self.device),
            "txt_ids": text_position_ids(text_BTD.shape[1], self.device),
        }
        if self.guidance is not None:
            batch["guidance"] = torch.full_like(timesteps_B, self.guidance)
        return batch

    def state_dict(self) -> dict[str, Any]:
        """The image loader's position and this iterator's batch count (JSON-able)."""
        return {"images": self.data.train.state_dict(), "index": self.index, "seed": self.seed}

    def gather_state(self) -> dict[str, Any]:
        """``state_dict`` with every data rank's position of a streamed source (``gather_image_state``): what a
        checkpoint saves. A collective under torch.distributed: call it on every rank."""
        return {**self.state_dict(), "images": gather_image_state(self.data.train)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict`` or ``gather_state`` output."""
        try:
            self.data.train.load_state_dict(state["images"])
        except DataPositionError as error:
            raise error.inside("images") from error
        self.index, self.seed = state["index"], state["seed"]
