"""Background saves (``checkpoint.async_save``): the tensors copied to host memory and written while training
goes on, then the written files hashed off the training thread; one save in flight at a time."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch.distributed.checkpoint as dcp

from titanpod.checkpoint.dcp_reader import quiet_single_process
from titanpod.checkpoint.disk_space import state_bytes
from titanpod.checkpoint.locations import Location


@dataclass(frozen=True)
class PendingSave:
    """A background save whose files may still be being written."""

    manifest: Future[Any]
    """The written files' manifest (rank 0; ``None`` on other ranks), done once the write and hashing are."""
    target: Location
    """The folder the save writes into."""
    step_number: int
    """Optimizer steps the saved state has done."""
    data_state: dict[str, Any]
    """The data loader's position at the save."""
    state_bytes: int
    """Bytes of this process's state (named when the disk fills)."""


class BackgroundSaves:
    """Starts background saves and holds the one in flight; ``manifest(target)`` (a collective, every rank)
    lists a written folder's files with their hashes."""

    def __init__(self, manifest: Callable[[Location], dict[str, Any] | None]) -> None:
        self._manifest = manifest
        self._hasher: ThreadPoolExecutor | None = None
        self._pending: PendingSave | None = None

    def start(
        self,
        state: dict[str, Any],
        writer: dcp.FileSystemWriter,
        process_group: Any,
        target: Location,
        step_number: int,
        data_state: dict[str, Any],
    ) -> None:
        """Start writing ``state`` through ``writer`` (DCP's collectives over ``process_group``) in the background."""
        with quiet_single_process():
            future = dcp.async_save(state, storage_writer=writer, process_group=process_group)
        self._pending = PendingSave(
            self._hashed_after(future, target), target, step_number, data_state, state_bytes(state)
        )

    def written(self) -> bool:
        """Whether a save is in flight and its files are written and hashed."""
        return self._pending is not None and self._pending.manifest.done()

    def take(self) -> PendingSave | None:
        """The save in flight, no longer held here (``None`` when there is none)."""
        pending, self._pending = self._pending, None
        return pending

    def _hashed_after(self, future: Future[Any], target: Location) -> Future[Any]:
        """A future of ``target``'s file manifest, its files hashed in a background thread once ``future`` (the
        background write) is done, so training goes on."""
        if self._hasher is None:
            self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-hash")

        def written_manifest() -> dict[str, Any] | None:
            future.result()
            return self._manifest(target)

        return self._hasher.submit(written_manifest)
