"""Whether a recipe's kernels run on the lane it trains on, asked before anything is built."""

from __future__ import annotations

from titanpod.device import Backend
from titanpod.kernels.config import KernelConfig


class KernelNotOnLaneError(ValueError):
    """A kernel the recipe chose cannot run on its lane as installed; the message names the field and the fix."""


def check_kernels_on_lane(config: KernelConfig, backend: Backend | type[Backend]) -> None:
    """Raise ``KernelNotOnLaneError`` when ``config`` picks a kernel the lane cannot run (today: PyTorch's SDPA
    where the lane's SDPA kernel does not compile, ``Backend.sdpa_problem``)."""
    if config.attention == "sdpa" and (problem := backend.sdpa_problem()) is not None:
        raise KernelNotOnLaneError(
            f"kernels.attention 'sdpa': {problem}. Install what it needs, or choose an attention that does not use "
            "it: --kernels.attention math (plain PyTorch ops, the whole score matrix in memory) or splash."
        )
