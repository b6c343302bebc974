"""What a run starts from: unfinished saves cleared away, a fresh start refused where checkpoints already are,
and the checkpoint ``checkpoint.resume`` points at."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from titanpod.checkpoint.errors import CheckpointError
from titanpod.checkpoint.locations import Location, as_location, base_name, is_file, join, remove_tree
from titanpod.checkpoint.step_folders import (
    COMMIT_MARKER,
    TRAINER_FILE,
    complete_checkpoints,
    needs_marker,
    step_folders,
    unfinished_message,
    unfinished_saves,
)


def remove_partial(folder: Location, is_main: bool, say: Callable[[str], None]) -> list[Location]:
    """Delete what saves into ``folder`` that never completed left behind (rank 0; every rank calls this);
    returns those folders."""
    removed = []
    if is_main:
        for path in unfinished_saves(folder):
            remove_tree(path)
            removed.append(path)
            why = f"no {COMMIT_MARKER} marker: a save that did not finish" if needs_marker(folder) else None
            say(f"removed {path}: an incomplete checkpoint ({why or 'its save was interrupted'})")
    if dist.is_initialized():
        dist.barrier()
    return removed


def check_fresh_start(folder: Location, resume: str, run_dir: Path) -> None:
    """With ``resume`` ``never``: refuse, before anything is written, a checkpoints ``folder`` that already holds
    step folders (a fresh run's saves would mix with them, or replace them)."""
    if resume != "never":
        return
    found = [str(base_name(path)) for path in step_folders(folder)]
    if not found:
        return
    names = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
    where, elsewhere = (run_dir, "") if folder == Path(run_dir) / "checkpoints" else (folder, " or --checkpoint.dir")
    raise CheckpointError(
        f"{where} already holds checkpoints ({names}): name a new run (--output.run-name ...{elsewhere}), "
        "resume them (--checkpoint.resume auto) or start over (--output.start-over: they are moved into "
        "previous-<UTC time>/, nothing is deleted)."
    )


def resume_folder(folder: Location, resume: str, say: Callable[[str], None]) -> Location | None:
    """The checkpoint ``resume`` (``checkpoint.resume``) points at, the newest complete one in ``folder`` for
    ``auto``: None to start fresh."""
    if resume == "never":
        return None
    if resume != "auto":
        chosen = as_location(resume)
        if needs_marker(chosen) and not is_file(join(chosen, COMMIT_MARKER)):
            raise CheckpointError(
                f"checkpoint.resume={resume!r} is not a complete checkpoint: "
                f"{unfinished_message(chosen)}; pass a complete step-NNNNNN folder, 'auto' or 'never'."
            )
        if not is_file(join(chosen, TRAINER_FILE)):
            raise CheckpointError(
                f"checkpoint.resume={resume!r} is not a complete checkpoint folder "
                f"(no {TRAINER_FILE}); pass a checkpoints/step-NNNNNN folder, 'auto' or 'never'."
            )
        return chosen
    found = complete_checkpoints(folder, say=say)
    return found[-1][1] if found else None
