"""Parallel degrees that need more processes than were started: refused before any work, with the command
that starts them.

On a multi-process lane (cpu, cuda, tpu, torch_xla) each degree of ``recipe.parallel`` is a number of
processes that torchrun starts. One process started alone cannot shard anything, so ``--parallel.fsdp 4``
without torchrun would train unsharded while its recipe.json says fsdp 4. A single-controller lane (xla)
drives every device from one process and is never refused here, nor is torch_xla over several devices of one
process (SPMD: ``titanpod.runs.torch_xla_spmd``).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from titanpod.device import Backend
from titanpod.parallel import ParallelConfig, PlanError

DEGREES = ("pp", "dp_replicate", "fsdp", "cp", "ep", "tp")
"""The parallel degrees that count processes (``fsdp=-1`` takes what the others leave: 1 here)."""


def required_processes(parallel: ParallelConfig) -> int:
    """The processes the explicit degrees of ``parallel`` multiply to (``fsdp=-1`` counts as 1)."""
    count = 1
    for name in DEGREES:
        count *= max(1, getattr(parallel, name))
    return count


def launch_hint(entry_module: str, processes: int, argv: list[str] | None = None) -> str:
    """``torchrun --nproc-per-node N -m MODULE ARGS``: this command's own arguments when ``argv`` (default
    ``sys.argv``) is the entry point's own command line, else a placeholder for them."""
    argv = sys.argv if argv is None else argv
    program = Path(argv[0]).name if argv else ""
    own = program.startswith("titanpod-") or program in ("cli.py", "__main__.py")
    arguments = shlex.join(argv[1:]) if own else "<the same arguments>"
    return f"torchrun --nproc-per-node {processes} -m {entry_module} {arguments}".rstrip()


def check_process_count(
    parallel: ParallelConfig, backend: Backend, world_size: int, entry_module: str, argv: list[str] | None = None
) -> None:
    """Refuse degrees above 1 in a job of one process on a multi-process lane, naming the torchrun command
    (``entry_module``: the module torchrun runs, e.g. ``titanpod.pretrain.cli``). Jobs of several processes
    are checked by the mesh itself (``ParallelConfig.mesh_axes``)."""
    needed = required_processes(parallel)
    if backend.single_controller or world_size > 1 or needed == 1:
        return
    degrees = ", ".join(f"parallel.{name}={getattr(parallel, name)}" for name in DEGREES if getattr(parallel, name) > 1)
    raise PlanError(
        f"{degrees} needs {needed} processes; this is 1 (started without torchrun). Start it with: "
        f"{launch_hint(entry_module, needed, argv)}; or set the degrees to 1 to train in one process."
    )
