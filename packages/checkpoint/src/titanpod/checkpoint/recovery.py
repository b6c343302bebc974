"""What to do about a damaged checkpoint: the newest earlier checkpoint beside it that passes every check, named in
the flags that resume from it.

A resume refused for damage says the exact folder to resume from rather than ``step-NNNNNN``: the checkpoints
beside the damaged one are read, newest first, with every check a resume makes of ``trainer.json`` (its commit
marker, its fields, each file's size and content hash), and the first that passes is named. Reading them costs as
much as a resume's checks, and is done only once a checkpoint was refused.
"""

from __future__ import annotations

import shlex

from titanpod.checkpoint.checksums import VerifiedHashes
from titanpod.checkpoint.errors import CheckpointError
from titanpod.checkpoint.locations import Location, base_name, parent
from titanpod.checkpoint.step_folders import STEP_FOLDER, complete_checkpoints
from titanpod.checkpoint.trainer_file import read_trainer_file


def newest_good_before(folder: Location, verified: VerifiedHashes | None = None) -> Location | None:
    """The newest complete checkpoint beside ``folder`` whose step is lower (any other, where ``folder`` is not named
    ``step-NNNNNN``) that passes ``read_trainer_file``'s checks; ``None`` when none does."""
    named = STEP_FOLDER.match(base_name(folder))
    below = int(named.group(1)) if named else None
    for number, path in reversed(complete_checkpoints(parent(folder))):
        if str(path) == str(folder) or (below is not None and number >= below):
            continue
        try:
            read_trainer_file(path, verified=verified)
        except (CheckpointError, OSError):
            continue
        return path
    return None


def resume_fix(folder: Location, rerun: str = "", verified: VerifiedHashes | None = None) -> str:
    """What to do about the damaged checkpoint ``folder``: the flags that resume from the newest earlier one that
    passes its checks (``--checkpoint.resume PATH`` then ``rerun``, the flags that name the same run again), or,
    when none does, to resume from another copy or start a new run."""
    good = newest_good_before(folder, verified)
    if good is None:
        return (
            f"No earlier checkpoint in {parent(folder)} passes its checks: resume from another checkpoint "
            "(--checkpoint.resume PATH) or start a new run (--output.run-name NEW)."
        )
    flags = " ".join(part for part in (f"--checkpoint.resume {shlex.quote(str(good))}", rerun) if part)
    return (
        f"Resume from an earlier checkpoint: the newest that passes its checks is {good}; run the same command "
        f"with {flags} (in place of any --resume or --checkpoint.resume)."
    )
