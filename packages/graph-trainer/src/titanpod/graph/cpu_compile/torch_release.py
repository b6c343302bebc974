"""The torch releases the cached compile has been checked against: it uses inductor internals that change
between releases without notice."""

from __future__ import annotations

import torch

CHECKED_TORCH_RELEASES = ("2.13",)
"""``major.minor`` torch releases whose inductor the cached compile's internals were checked against."""


def check_torch_release(version: str | None = None) -> None:
    """``RuntimeError`` naming the fix when ``version`` (torch's own by default) is not a checked release."""
    version = version or torch.__version__
    release = ".".join(version.split("+")[0].split(".")[:2])
    if release not in CHECKED_TORCH_RELEASES:
        raise RuntimeError(
            f"train.step_compiler='cached' relies on inductor internals checked against torch "
            f"{', '.join(CHECKED_TORCH_RELEASES)}; this is torch {version}. Set train.step_compiler to 'inductor' "
            "(the default: torch.compile with inductor's own caches)."
        )
