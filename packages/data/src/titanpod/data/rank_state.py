"""Per-rank positions of streamed data: gathering every rank's into a checkpoint, and taking this rank's back.

A streamed source (tokens or images) is read in a different place on each data-parallel rank, so
its saved position is ``{"per_rank": [state of data rank 0, ...]}``; a map-style source's position
is the same everywhere and is saved as it is.
"""

from __future__ import annotations

from typing import Any


def gather_rank_states(state: dict[str, Any], streamed_kind: str, gatherer: str) -> dict[str, Any]:
    """``state`` when its ``kind`` is not ``streamed_kind`` or there is one data rank; else every data rank's
    position as ``{"per_rank": [...]}``, gathered with torch.distributed (a collective: call it on every rank).
    ``gatherer`` names the caller in the error raised when torch.distributed is not initialised."""
    if state.get("kind") != streamed_kind or state["world_size"] == 1:
        return state
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError(f"{gatherer} with several data ranks needs torch.distributed initialised.")
    states: list[dict[str, Any]] = [{}] * dist.get_world_size()
    dist.all_gather_object(states, state)
    by_rank = {item["rank"]: item for item in states}  # ranks sharing a data rank (tp, cp) hold the same position
    return {"per_rank": [by_rank[index] for index in range(state["world_size"])]}


def this_rank_state(
    state: dict[str, Any], kind: str, rank: int, world_size: int, what: str, gatherer: str
) -> dict[str, Any]:
    """This data rank's position out of ``state`` (one rank's, or ``{"per_rank": [...]}``), checked to be of
    ``kind`` and of this rank; ``ValueError`` names the mismatch and how to resume. ``what`` is the data the
    run streams (``data``, ``images``); ``gatherer`` the function that saves every rank's position."""
    if "per_rank" in state:
        if len(state["per_rank"]) != world_size:
            raise ValueError(
                f"The saved {what} positions are of {len(state['per_rank'])} data ranks, but this run has "
                f"{world_size}: a streamed position cannot be re-sharded; resume on as many data ranks as it was "
                "saved from."
            )
        state = state["per_rank"][rank]
    if state.get("kind") != kind:
        raise ValueError(
            f"The saved data position is of a {state.get('kind', 'packed')} loader, but this run streams its "
            f"{what}: resume with the data settings the checkpoint was made with."
        )
    if (state["rank"], state["world_size"]) != (rank, world_size):
        raise ValueError(
            f"The saved {what} position is rank {state['rank']}'s of {state['world_size']}, but this is rank {rank} "
            f"of {world_size}: save every rank's position ({gatherer}) to resume a stream on several ranks."
        )
    return state
