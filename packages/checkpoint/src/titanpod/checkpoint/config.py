"""When a run saves its trainer state and whether it resumes (``CheckpointConfig``), as a recipe states it: plain
data, read without torch (the command line reads every recipe); ``titanpod.checkpoint.trainer_state`` acts on it."""

from __future__ import annotations

from dataclasses import dataclass

from titanpod.models.field_checks import check_field_types, expand_home, real_number, whole_number


@dataclass(frozen=True)
class CheckpointConfig:
    """When trainer-state checkpoints are written and whether a run resumes from one."""

    every: int = 0
    """Save the trainer state every this many steps (0: only at the end, if ``at_end``)."""
    every_seconds: float = 0.0
    """Also save the trainer state once this many seconds have passed since the first step or the last save
    (0: off), checked after each step: a run killed without notice (``kill -9``, a lost VM) then loses at most
    about this much work. Every process saves after the same step."""
    notice_seconds: float = 30.0
    """How long a stop signal (SIGTERM) leaves before the machine goes, as a preemptible Cloud TPU VM's 30 s:
    after one the trainer state is saved first, and the final weights (and Hugging Face export) only while the
    time left still covers a save as long as that checkpoint's; else the resumed run that finishes writes them.
    0: always write them."""
    watch_preemption: bool = True
    """Stop as for SIGTERM when the metadata server of a Compute Engine or Cloud TPU VM says the VM is being
    preempted (``titanpod.runs.preemption_watch``); off a cloud VM it finds no server and does nothing."""
    at_end: bool = True
    """Save the trainer state after the last step (and when the run is interrupted)."""
    keep_last: int = 2
    """Complete checkpoints that pass their checks to keep; older ones are deleted once a newer one is complete
    (0 keeps all). A damaged one is moved aside, a linked one left as it is (``titanpod.checkpoint.trainer_save``)."""
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
        expand_home(self, "dir")
        whole_number("checkpoint.every", self.every, at_least=0)
        whole_number("checkpoint.keep_last", self.keep_last, at_least=0)
        real_number("checkpoint.every_seconds", self.every_seconds, at_least=0)
        real_number("checkpoint.notice_seconds", self.notice_seconds, at_least=0)
        names = tuple(name.strip() for entry in self.allow_changes for name in entry.split(",") if name.strip())
        object.__setattr__(self, "allow_changes", names)  # a recipe file's list, or "a,b", as a tuple of names
