"""From a stored image to a training tensor: decode, RGB, resize on the short side, centre crop, scale to [-1, 1].

Legend: C channels, H height, W width. PIL is imported only when an image is decoded.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from titanpod.data.sources import DataError, first_line

if TYPE_CHECKING:
    from PIL import Image


def decode_image(value: Any, where: str) -> Image.Image:
    """The image a column value holds, fully decoded: a PIL image, ``{"bytes", "path"}`` as the ``datasets`` Image
    feature stores it, raw bytes, or a file path. ``where`` names the image in errors when no file name is known."""
    from PIL import Image

    if isinstance(value, dict) and ("bytes" in value or "path" in value):
        data, path = value.get("bytes"), value.get("path")
        where = path or where
        value = data if data is not None else path
    elif isinstance(value, str | Path):
        where = str(value)
    try:
        if isinstance(value, Image.Image):
            image = value
        elif isinstance(value, bytes | bytearray):
            image = Image.open(io.BytesIO(value))
        elif isinstance(value, str | Path):
            image = Image.open(value)
        else:
            raise DataError(
                f"{where} holds a {type(value).__name__} value, not an image; name the image column with "
                "--data.image_field."
            )
        image.load()
    except DataError:
        raise
    except Exception as error:  # PIL raises UnidentifiedImageError, OSError (truncated), ValueError, ...
        raise DataError(f"Cannot decode the image {where}: {first_line(error)}. Replace or remove the file.") from error
    return image


def check_image_file(path: str) -> None:
    """Read a local image file's header and check it (PNG: every chunk's checksum) without decoding its pixels."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.verify()
    except Exception as error:
        raise DataError(f"Cannot decode the image {path}: {first_line(error)}. Replace or remove the file.") from error


def to_rgb(image: Image.Image) -> Image.Image:
    """``image`` in RGB; transparent parts are laid on white (not on black, as a plain conversion would)."""
    from PIL import Image

    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def square(image: Image.Image, resolution: int) -> Image.Image:
    """The centred square of ``image``'s short side, resized to ``resolution`` x ``resolution`` (bicubic).

    The square is cut before resizing, so nothing outside it bleeds into the edges: the same as resizing the short
    side to ``resolution`` and centre-cropping, without the filter reaching across the cut.
    """
    from PIL import Image

    width, height = image.size
    side = min(width, height)
    left, top = (width - side) // 2, (height - side) // 2
    if side != width or side != height:
        image = image.crop((left, top, left + side, top + side))
    if side == resolution:
        return image
    return image.resize((resolution, resolution), Image.Resampling.BICUBIC, reducing_gap=3.0)


def to_tensor(image: Image.Image) -> torch.Tensor:
    """An RGB image as float32 [3, H, W] in [-1, 1] (0 -> -1, 255 -> 1)."""
    width, height = image.size
    pixels_HWC = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8).view(height, width, 3)
    return pixels_HWC.permute(2, 0, 1).to(torch.float32).div_(127.5).sub_(1.0)


def prepare(image: Image.Image, resolution: int) -> torch.Tensor:
    """A decoded image as a training tensor: RGB, short side resized to ``resolution``, centre-cropped, in [-1, 1]."""
    return to_tensor(square(to_rgb(image), resolution))


def to_pil(image_CHW: torch.Tensor) -> Image.Image:
    """A float [3, H, W] image in [-1, 1] (values outside are clipped) as an RGB PIL image."""
    from PIL import Image

    pixels_HWC = ((image_CHW.detach().to("cpu", torch.float32).clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    pixels_HWC = pixels_HWC.permute(1, 2, 0).contiguous()
    return Image.frombytes("RGB", (pixels_HWC.shape[1], pixels_HWC.shape[0]), pixels_HWC.numpy().tobytes())
