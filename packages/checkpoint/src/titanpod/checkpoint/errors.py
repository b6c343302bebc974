"""Errors raised when a checkpoint does not fit what is asked of it."""


class CheckpointMismatchError(ValueError):
    """A checkpoint's tensors do not match the model: lists what is missing, extra or mis-shaped."""


class CheckpointError(ValueError):
    """A trainer checkpoint cannot be used: what is wrong with it, and what to do."""


def failure_text(error: BaseException) -> str:
    """What went wrong, in one line per failure: a DCP ``CheckpointException`` (which gathers every rank's
    error, tracebacks included, and is not an ``Exception``) as ``rank N: Type: message``; else ``str(error)``."""
    from torch.distributed.checkpoint.api import CheckpointException

    if not isinstance(error, CheckpointException):
        return str(error)
    return "; ".join(
        f"rank {rank}: {type(failure).__name__}: {failure}" for rank, (failure, _) in sorted(error.failures.items())
    )
