"""Training batches for the flow-matching objective: images and captions encoded once, noise and timesteps drawn.

Legend: B batch, C latent channels, H and W latent size, L image tokens, P packed channels,
T text tokens, D text width.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from titanpod.data.images.pipeline import ImageData
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
            partial = self.folder / f".{key}.partial"
            save_file(tensors, partial)
            partial.replace(self.folder / f"{key}.safetensors")


class FlowMatchingBatches:
    """Endless batches for ``FlowMatchingModel.loss(**batch)``, resumable through ``state_dict``.

    Noise and timesteps of batch ``i`` come from a generator seeded by (seed, rank, i), so a
    resumed run draws what the uninterrupted one would have.
    """

    def __init__(
        self, data: ImageData, models: DiffusionModels, cache: EncodingCache, guidance: float | None, seed: int,
        rank: int, device: torch.device,
    ) -> None:  # fmt: skip
        self.data, self.models, self.cache = data, models, cache
        self.guidance, self.seed, self.rank, self.device = guidance, seed, rank, device
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
        """T5 states [B, T, D] and pooled vectors [B, D_pooled] of each caption, from the cache where it has them."""
        text, pooled = [], []
        for caption in captions:
            key = EncodingCache.key("text", caption.encode())
            found = self.cache.get(key)
            if found is None:
                states, vector = self.models.text_encoders.encode([caption])
                found = {"text": states[0], "pooled": vector[0]}
                self.cache.put(key, found)
            text.append(found["text"])
            pooled.append(found["pooled"])
        return torch.stack(text).to(self.device), torch.stack(pooled).to(self.device)

    def __iter__(self) -> FlowMatchingBatches:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        images_BCHW, captions = next(self.data.train)
        latents_BCHW = self.encode_images(images_BCHW)
        _, _, H, W = latents_BCHW.shape
        x0_BLP = pack_latents(latents_BCHW)
        text_BTD, pooled_BD = self.encode_captions(captions)
        digest = hashlib.blake2b(f"flow/{self.seed}/{self.rank}/{self.index}".encode(), digest_size=8).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
        noise_BLP = torch.randn(x0_BLP.shape, generator=generator).to(self.device)
        timesteps_B = sample_timesteps(x0_BLP.shape[0], x0_BLP.shape[1], generator).to(self.device)
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

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict`` output."""
        self.data.train.load_state_dict(state["images"])
        self.index, self.seed = state["index"], state["seed"]
