"""The rest of torch_tpu's launch environment, by torch_tpu itself.

``TORCH_TPU_TOPOLOGY`` (this host's chips, read from its PCI devices) and
``TORCH_TPU_XPROF_SESSION_ID`` come from ``torch.tpu.distributed.set_tpu_launch_env``, which
keeps every variable already set: the launcher sets its own first, so torch_tpu fills only
these. It runs in the launcher, the parent of every worker, as torch_tpu requires.
"""

from __future__ import annotations

import importlib
import importlib.util

FILLED_BY_TORCH_TPU = ("TORCH_TPU_TOPOLOGY", "TORCH_TPU_XPROF_SESSION_ID")
"""Launch variables torch_tpu decides from the machine itself."""


def torch_tpu_installed() -> bool:
    """True when torch_tpu can be imported here (never imports it)."""
    try:
        return importlib.util.find_spec("torch_tpu") is not None
    except (ImportError, ValueError):
        return False


def fill_from_torch_tpu(nnodes: int, nproc_per_node: int) -> None:
    """Let torch_tpu set the launch variables still unset in ``os.environ`` (see the module docstring)."""
    import torch_tpu  # noqa: F401 - registers torch.tpu when autoload is off

    distributed = importlib.import_module("torch.tpu.distributed")
    distributed.set_tpu_launch_env(nnodes=nnodes, nproc_per_node=nproc_per_node)
