"""The step folders of a checkpoints location: which are complete, and the commit marker that says so.

A checkpoint is a folder ``step-NNNNNN/`` holding ``trainer.json``. Its ``COMMITTED`` marker is
written last, after every rank's files and ``trainer.json``; it holds the step and the SHA-256 of
``trainer.json`` (whose manifest lists the size of every other file), so the marker vouches for
the whole folder.

On a URL (``gs://``, ``memory://``, ``file://``: stores without rename) the marker is what makes a
folder a checkpoint: a step folder without one is a save that did not finish, and every reader
ignores it. Local folders are made whole by a rename (``.step-NNNNNN.partial`` becomes
``step-NNNNNN``), so there the marker is written too (a local checkpoint copied to a bucket stays
valid) but not required (checkpoints written before markers existed still load).

A step folder without ``trainer.json`` (part of a checkpoint copied by hand, say) is never
resumed from and never deleted: resume names it and goes on with the newest complete one, and a
save of that step moves it aside first (``step-NNNNNN.moved-<UTC time>``), saying so.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import time
from collections.abc import Callable

from titanpod.checkpoint.errors import DamagedCheckpointError
from titanpod.checkpoint.locations import (
    Location,
    base_name,
    children,
    exists,
    is_file,
    is_url,
    join,
    move,
    parent,
    read_bytes,
    write_bytes,
)

COMMIT_MARKER = "COMMITTED"
"""The file written last into a checkpoint folder: the save finished."""
TRAINER_FILE = "trainer.json"
"""The checkpoint's step, data position, recipe and file manifest."""
STEP_FOLDER = re.compile(r"^step-(\d{6,})$")
"""The name of a checkpoint folder."""


def step_folder_name(step_number: int) -> str:
    """``step-000010`` for step 10."""
    return f"step-{step_number:06d}"


def needs_marker(folder: Location) -> bool:
    """True where only the commit marker makes a step folder complete: at URLs (no rename there)."""
    return is_url(folder)


def unfinished_message(folder: Location) -> str:
    """What is said of a step folder without its marker: it names the folder and what that means."""
    return f"{folder}: no {COMMIT_MARKER} marker (a save that did not finish)"


def any_earlier_checkpoint(folder: Location) -> str:
    """What to do about the damaged checkpoint ``folder`` where no scan for a good one was made: resume from an
    earlier one, or start a new run. (A resume names the exact folder: ``titanpod.checkpoint.recovery``.)"""
    return (
        f"Resume from an earlier checkpoint (--checkpoint.resume {parent(folder)}/step-NNNNNN) or start a new run "
        "(--output.run-name NEW)."
    )


def write_marker(folder: Location, step_number: int, trainer_bytes: bytes) -> None:
    """Write the commit marker of ``folder``: call it last, once every other file of the checkpoint is written."""
    marker = {"step": step_number, "trainer_sha256": hashlib.sha256(trainer_bytes).hexdigest()}
    write_bytes(join(folder, COMMIT_MARKER), (json.dumps(marker) + "\n").encode())


def check_marker(folder: Location, trainer_bytes: bytes) -> None:
    """Check ``folder``'s commit marker against its ``trainer.json`` bytes.

    ``CheckpointError`` when the marker is missing where it is needed (a URL), unreadable, or vouches
    for another ``trainer.json``; a local folder without a marker (older than markers) passes.
    """
    path = join(folder, COMMIT_MARKER)
    try:
        marker = json.loads(read_bytes(path))
    except FileNotFoundError as error:
        if not needs_marker(folder):
            return
        problem = f"{unfinished_message(folder)}; it is not a usable checkpoint."
        raise DamagedCheckpointError(problem, any_earlier_checkpoint(folder)) from error
    except (OSError, ValueError) as error:
        problem = f"{path} is unreadable ({error}); {folder} is not a usable checkpoint."
        raise DamagedCheckpointError(problem, any_earlier_checkpoint(folder)) from error
    if not isinstance(marker, dict) or marker.get("trainer_sha256") != hashlib.sha256(trainer_bytes).hexdigest():
        problem = (
            f"The checkpoint {folder} is damaged: its {TRAINER_FILE} is not the one its {COMMIT_MARKER} marker "
            "vouches for (overwritten after the save)."
        )
        raise DamagedCheckpointError(problem, any_earlier_checkpoint(folder))


def complete_checkpoints(folder: Location, say: Callable[[str], None] | None = None) -> list[tuple[int, Location]]:
    """The complete checkpoints in ``folder`` (``step-NNNNNN`` with a trainer file and, at a URL, its
    commit marker), oldest first. Step folders at a URL without a marker, and step folders without a
    trainer file, are left out (and left as they are), each named to ``say`` when given."""
    found = []
    for path in children(folder):
        match = STEP_FOLDER.match(base_name(path))
        if not match:
            continue
        if needs_marker(folder) and not is_file(join(path, COMMIT_MARKER)):
            if say is not None:
                say(f"ignoring {unfinished_message(path)}")
            continue
        if is_file(join(path, TRAINER_FILE)):
            found.append((int(match.group(1)), path))
        elif say is not None:
            say(
                f"checkpoint {path} has no {TRAINER_FILE} (not a complete checkpoint); "
                "it is left as it is and not resumed from"
            )
    return sorted(found)


def step_folders(folder: Location) -> list[Location]:
    """Every ``step-NNNNNN`` folder in ``folder``, complete or not, by name."""
    return [path for path in children(folder) if STEP_FOLDER.match(base_name(path))]


def set_aside(path: Location) -> str:
    """Move the step folder ``path`` out of the way of a save of its step, to ``<name>.moved-<UTC time>``
    beside it (a name no reader, pruner or cleaner takes for a checkpoint); returns what to say about it."""
    what = "a complete checkpoint" if is_file(join(path, TRAINER_FILE)) else f"no {TRAINER_FILE}: incomplete"
    target = move_aside(path, "moved")
    return f"{path} was already there ({what}); moved it aside to {target} before saving that step"


def move_aside(path: Location, why: str) -> Location:
    """Move the step folder ``path`` to ``<name>.<why>-<UTC time>`` beside it (``-1``, ``-2`` ... when taken): a name
    no reader, pruner or cleaner takes for a checkpoint. Returns where it went."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = join(parent(path), f"{base_name(path)}.{why}-{stamp}")
    count = 1
    while exists(target):
        target = join(parent(path), f"{base_name(path)}.{why}-{stamp}-{count}")
        count += 1
    move(path, target)
    return target


def unfinished_saves(folder: Location) -> list[Location]:
    """What saves that never completed left in ``folder``: ``.step-NNNNNN.partial`` staging folders
    (local), or step folders without their commit marker (at a URL)."""
    if needs_marker(folder):
        return [
            path
            for path in children(folder)
            if STEP_FOLDER.match(base_name(path)) and not is_file(join(path, COMMIT_MARKER))
        ]
    return [path for path in children(folder) if fnmatch.fnmatch(base_name(path), ".step-*.partial")]
