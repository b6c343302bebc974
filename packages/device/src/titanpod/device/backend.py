"""The interface every lane implements: what a backend does, and what its class says about the lane."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch

from titanpod.device.chips import ChipSpec
from titanpod.device.host_launch import HostLaunch
from titanpod.device.memory import MemoryStats


class Backend(ABC):
    """What the rest of titanpod asks of a lane: where tensors live, how to wait for them,
    how much memory they take, how fast the chip is, and how its devices form a mesh."""

    lane: ClassVar[str]
    """The lane's name (see ``titanpod.device.lanes.LANES``)."""
    device_type: ClassVar[str]
    """The ``torch.device`` type of tensors on this lane."""
    dist_backend: ClassVar[str | None]
    """The torch.distributed backend; ``None`` lets PyTorch pick the one registered for the device."""
    compile_backend: ClassVar[str | None]
    """The ``torch.compile`` backend; ``None`` where the lane compiles another way (``jax.jit``)."""
    compiled_step_donates_inputs: ClassVar[bool] = True
    """The lane's compile of a captured step lets the program write its in-place updates into its inputs' buffers.
    Where it does not (torch_tpu 0.2.0's ``torch.compile`` backend donates no input), a whole step that updated
    the parameters and AdamW moments inside the program would hold the old and the new state at once, so the
    whole step leaves the update to run after the program (``TrainConfig.whole_step_update``)."""
    update_as_one_program: ClassVar[bool] = False
    """An AdamW update outside a compiled program runs as one JAX program over every parameter
    (``titanpod.graph.adamw_program``) rather than op by op: each eager op on this lane's device is a dispatch of its
    own (torch_tpu 0.2.0: about 0.1 ms each, some sixteen a parameter). Only for parameters that are plain tensors."""
    single_controller: ClassVar[bool] = False
    """One process drives every device of the job and the compiler partitions the step (the xla lane): the step is
    one ``jax.jit`` program (``titanpod.graph.xla.XlaStep``), and the dry run plans that program's memory;
    otherwise each process drives one device and shards through torch.distributed."""
    device_memory_is_host: ClassVar[bool] = False
    """The devices are the host's own memory (the cpu lane): nothing is held on the host beyond them."""
    supports_pipeline: ClassVar[bool] = True
    """The torch executor builds pipeline stages (``parallel.pp`` > 1) on this lane, under torchrun."""
    spmd_on_request: ClassVar[bool] = False
    """One process of a single-process run can be switched to driving every device of its host, the compiler
    partitioning the step (``use_spmd``, the torch_xla lane)."""
    traces_with_jax: ClassVar[bool] = False
    """The profiler records this lane with ``jax.profiler``; otherwise with ``torch.profiler``."""
    stand_in_lanes: ClassVar[tuple[str, ...]] = ()
    """Lanes that build this lane's step the same ways on a machine without its device, for a rehearsal
    (a lane that runs anywhere names itself); empty: it cannot be rehearsed away from its device."""
    launch: ClassVar[HostLaunch | None] = None
    """How ``titanpod-launch`` starts this lane on each host of a job; ``None``: the launcher does not."""

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this lane cannot run on this machine, with the fix; ``None`` when it can. Looks, imports nothing."""
        return None

    @classmethod
    def sdpa_problem(cls) -> str | None:
        """Why ``scaled_dot_product_attention`` cannot run on this lane's devices as installed, and what the
        installation needs; ``None`` when it can. Reads installed versions only."""
        return None

    @classmethod
    def detected(cls) -> bool:
        """Whether this machine has what the lane runs on, for the automatic choice (see ``LaneRegistry``)."""
        return cls.unavailable_reason() is None

    @classmethod
    def profiler_config(cls, folder: Path, rank: int) -> Any:
        """The lane's extra ``torch.profiler`` option (``experimental_config``) for a trace of process ``rank``
        written to ``folder``; ``None`` where the lane adds nothing."""
        return None

    def device(self, local_rank: int = 0) -> torch.device:
        """The device a process with this local rank drives."""
        return torch.device(self.device_type, local_rank)

    def parameter_device(self, local_rank: int = 0) -> torch.device:
        """Where a model's parameters are materialised before its step takes them: the device of this
        process, or the host where the step places them on its devices itself (the xla lane)."""
        return self.device(local_rank)

    def devices_in_job(self, world_size: int) -> int:
        """How many devices one training step spans: every device of this host for a single controller,
        else one per process of the job."""
        return self.device_count() if self.single_controller else world_size

    @abstractmethod
    def device_count(self) -> int:
        """How many devices of this lane this host sees."""

    @abstractmethod
    def synchronize(self, local_rank: int = 0) -> None:
        """Block until all work queued on the device of this local rank is done (for honest timings)."""

    def compile_step(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """The whole training step (a captured graph) compiled as one program: ``torch.compile`` with the lane's
        backend, the whole graph and static shapes. ``ValueError`` on a lane that compiles another way."""
        if self.compile_backend is None:
            raise ValueError(f"The {self.lane} lane compiles with jax.jit; use the xla step for it.")
        return torch.compile(step, backend=self.compile_backend, fullgraph=True, dynamic=False)

    def place_batch(self, tensor: torch.Tensor, local_rank: int = 0) -> torch.Tensor:
        """A batch tensor on the device of the process with this local rank (laid out over the mesh, where the
        lane shards batches itself)."""
        return tensor.to(self.device(local_rank))

    def end_step(self) -> None:  # noqa: B027 - optional: only lazy lanes record work to cut
        """Mark the end of a training step: a lazy lane (torch_xla) runs the step's recorded ops as one program."""

    @abstractmethod
    def memory_stats(self, local_rank: int = 0) -> MemoryStats:
        """Memory use of the device of the process with this local rank."""

    def reset_peak_memory(self, local_rank: int = 0) -> None:  # noqa: B027 - optional: not every lane can reset
        """Start a new peak-memory window on the device of this local rank, where the lane supports it."""

    @abstractmethod
    def chip(self) -> ChipSpec:
        """The chip this lane runs on, for MFU (a measured figure on a CPU)."""

    def runtime(self) -> contextlib.AbstractContextManager[Any]:
        """A context the lane's tensor work must run inside (torchax's environment on xla)."""
        return contextlib.nullcontext()

    def build_mesh(self, axes: Mapping[str, int]) -> Any:
        """A device mesh with named axes over every process of the job.

        Torch lanes return a ``torch.distributed.DeviceMesh``, the xla lane a
        ``jax.sharding.Mesh``. ``axes`` maps axis name to size, outermost first.
        """
        from titanpod.device.mesh import build_torch_mesh

        return build_torch_mesh(self, axes)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(lane={self.lane!r}, device_type={self.device_type!r})"
