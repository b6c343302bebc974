"""Errors raised when a checkpoint does not fit what is asked of it."""


class CheckpointMismatchError(ValueError):
    """A checkpoint's tensors do not match the model: lists what is missing, extra or mis-shaped."""


class CheckpointError(ValueError):
    """A trainer checkpoint cannot be used: what is wrong with it, and what to do."""


class DamagedCheckpointError(CheckpointError):
    """A checkpoint that is not as its save left it (a file missing, truncated or altered, a value out of range).
    ``problem`` names what and where; the message adds ``fix``, which a resume replaces with the exact command that
    resumes from the newest earlier checkpoint that passes its checks (``titanpod.checkpoint.recovery``)."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem} {fix}")
        self.problem = problem
        """What is wrong, and where (the message without what to do)."""
        self.fix = fix
        """What to do about it."""


class CheckpointFolderUnwritableError(OSError):
    """A save found the checkpoint folder no longer writable (permission denied, a read-only file system): names
    the folder, what the system said and what to do."""


def failure_text(error: BaseException) -> str:
    """What went wrong, in one line per failure: a DCP ``CheckpointException`` (which gathers every rank's
    error, tracebacks included, and is not an ``Exception``) as ``rank N: Type: message``; else ``str(error)``."""
    from torch.distributed.checkpoint.api import CheckpointException

    if not isinstance(error, CheckpointException):
        return str(error)
    return "; ".join(
        f"rank {rank}: {type(failure).__name__}: {failure}" for rank, (failure, _) in sorted(error.failures.items())
    )
