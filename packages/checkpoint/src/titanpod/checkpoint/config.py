"""When a run saves its trainer state and whether it resumes (``CheckpointConfig``), as a recipe states it: plain
data, read without torch (the command line reads every recipe); ``titanpod.checkpoint.trainer_state`` acts on it."""

from __future__ import annotations

from dataclasses import dataclass

from titanpod.models.field_checks import check_field_types, whole_number


@dataclass(frozen=True)
class CheckpointConfig:
    """When trainer-state checkpoints are written and whether a run resumes from one."""

    every: int = 0
    """Save the trainer state every this many steps (0: only at the end, if ``at_end``)."""
    at_end: bool = True
    """Save the trainer state after the last step (and when the run is interrupted)."""
    keep_last: int = 2
    """Complete checkpoints to keep; older ones are deleted once a newer one is complete (0 keeps all)."""
    async_save: bool = False
    """Write in the background: training goes on while the files are written."""
    resume: str = "auto"
    """``auto``: continue from the newest complete checkpoint in the run directory, if any;
    ``never``: start fresh (refused where checkpoints already are: name a new run); or the path of a
    checkpoint folder."""
    export_hf: bool = False
    """After the last step, also export the model as Hugging Face sharded safetensors to ``<run>/hf``."""
    dir: str = ""
    """Where checkpoints go: ``""`` means ``<run>/checkpoints``; else any local path or fsspec URL, such as
    ``gs://bucket/run/checkpoints`` (needs gcsfs), ``memory://run`` or ``file:///data/run/checkpoints``.
    At a URL a save is complete once its ``COMMITTED`` marker is written (there is no rename)."""
    allow_changes: tuple[str, ...] = ()
    """Recipe fields this run may change from the checkpoint it resumes, beyond the harmless ones
    (``titanpod.checkpoint.recipe_changes.HARMLESS_CHANGES``): dotted names, each its own argument or
    comma-separated, ``*`` matching any part (``--checkpoint.allow-changes model.flavor,kernels.window`` or
    ``--checkpoint.allow-changes 'data.*' train.lr``); ``data.path`` also accepts data files rewritten since the
    checkpoint. Any other change is refused before the model is built. Needed only by the run that makes it."""

    def __post_init__(self) -> None:
        check_field_types(self, "checkpoint")
        whole_number("checkpoint.every", self.every, at_least=0)
        whole_number("checkpoint.keep_last", self.keep_last, at_least=0)
        names = tuple(name.strip() for entry in self.allow_changes for name in entry.split(",") if name.strip())
        object.__setattr__(self, "allow_changes", names)  # a recipe file's list, or "a,b", as a tuple of names
