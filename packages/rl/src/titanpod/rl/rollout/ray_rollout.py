"""Rollout workers on Ray: each a ``BuiltinEngine`` in its own process, driven from the trainer's process.

``RayRollout`` follows the ``RolloutEngine`` protocol, so the GRPO loop (and ``sync_weights``)
uses it exactly as it uses a ``BuiltinEngine`` in the same process:

- ``generate`` splits the prompts into contiguous blocks, one per worker, samples them in
  parallel and returns the completions in order. Seeds count from each prompt's index in the
  whole list, so the completions equal those of one engine given every prompt.
- ``load_weights`` puts the trainer's weights in Ray's object store once (as raw bytes, see
  ``wire``); every worker loads them, checks its own checksum and reports it; the sync fails
  unless every worker holds exactly the trainer's weights at the new version.

The trainer is the process that creates ``RayRollout`` (the Ray driver); the workers are Ray
actors, on this machine or on any host of the cluster that has the resources they ask for.
Ray is imported only when a ``RayRollout`` is made.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from titanpod.models import DecoderArgs, Transformer
from titanpod.rl.rollout.builtin import BuiltinEngine, validate_prompts
from titanpod.rl.rollout.sync import check_version, state_bytes, trainer_state, weights_checksum
from titanpod.rl.rollout.types import Completion, SamplingParams, SyncReport
from titanpod.rl.rollout.wire import (
    WireTensor,
    completions_from_wire,
    completions_to_wire,
    state_from_wire,
    state_to_wire,
)

RAY_MISSING = (
    "rollout.mode 'ray' needs Ray, which is not installed. Install the extra "
    "(`pip install 'titanpod-posttrain[ray]'`, or `uv sync` in the titanpod workspace), "
    "or use rollout.mode 'local'."
)


UV_RUNTIME_ENV = "RAY_ENABLE_UV_RUN_RUNTIME_ENV"
"""Ray's switch for rebuilding a ``uv run`` driver's environment in every worker (read when Ray is imported)."""


def import_ray() -> Any:
    """The ``ray`` module; ``ImportError`` saying how to install it.

    Workers run in the driver's Python environment: unless the variable is already set, Ray's
    ``uv run`` hook (which would rebuild the project's environment for every worker, from the
    network) is switched off by setting ``RAY_ENABLE_UV_RUN_RUNTIME_ENV=0`` before Ray is first
    imported. On a cluster of several hosts, install titanpod on each (one image), or set the
    variable to 1 to let Ray replicate the environment.
    """
    os.environ.setdefault(UV_RUNTIME_ENV, "0")
    try:
        import ray
    except ImportError as error:
        raise ImportError(RAY_MISSING) from error
    return ray


@dataclass(frozen=True)
class WorkerInfo:
    """Where a rollout worker runs."""

    host: str
    """Host name of the worker's machine."""
    pid: int
    """Process id of the worker."""
    device: str
    """The device its engine decodes on."""


class RolloutWorker:
    """The body of one Ray rollout actor: a ``BuiltinEngine`` built from weights sent over the wire."""

    def __init__(
        self, args: DecoderArgs, weights: Mapping[str, WireTensor], version: int, device: str, max_batch: int
    ) -> None:
        """Build the engine for ``args`` on ``device`` holding ``weights`` as ``version``."""
        self.engine = BuiltinEngine.from_state(
            args, state_from_wire(weights), device, max_batch, weights_version=version
        )

    def info(self) -> WorkerInfo:
        """Where this worker runs."""
        return WorkerInfo(socket.gethostname(), os.getpid(), str(self.engine.device))

    def generate(self, prompts: list[list[int]], params: SamplingParams, first_prompt_index: int) -> list[Completion]:
        """The engine's completions of ``prompts`` (indices and seeds counted from ``first_prompt_index``)."""
        return completions_to_wire(self.engine.generate(prompts, params, first_prompt_index=first_prompt_index))

    def load_weights(self, weights: Mapping[str, WireTensor], version: int, checksum: str) -> SyncReport:
        """Load ``weights`` as ``version``; the engine's checksum after the copy must be the trainer's ``checksum``."""
        return self.engine.load_weights(state_from_wire(weights), version, expected_checksum=checksum)

    def checksum(self) -> str:
        """The checksum of the weights this worker holds."""
        return self.engine.checksum()


def split_evenly(count: int, parts: int) -> list[tuple[int, int]]:
    """``count`` items as up to ``parts`` contiguous (start, stop) blocks whose sizes differ by at most one;
    empty blocks are left out."""
    base, extra = divmod(count, parts)
    blocks, start = [], 0
    for part in range(parts):
        stop = start + base + (part < extra)
        if stop > start:
            blocks.append((start, stop))
        start = stop
    return blocks


class RayRollout:
    """The ``RolloutEngine`` protocol over ``workers`` Ray actors, each holding a copy of the weights."""

    def __init__(
        self,
        model: Transformer,
        workers: int = 1,
        *,
        address: str | None = None,
        worker_cpus: float = 1.0,
        worker_gpus: float = 0.0,
        max_batch: int = 64,
        say: Callable[[str], None] | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        """Start ``workers`` actors holding ``model``'s weights in ``dtype`` as version 0, and check each one's
        checksum (of the weights in ``dtype``).

        Joins the Ray cluster this process is already connected to; otherwise calls ``ray.init(address)``
        (``None``: the cluster ``RAY_ADDRESS`` names, else a new local one, shut down by ``close``).
        Each actor asks for ``worker_cpus`` CPUs and ``worker_gpus`` GPUs; with GPUs it decodes on cuda.
        """
        if workers < 1:
            raise ValueError(f"RayRollout needs at least 1 worker, got {workers}.")
        ray = import_ray()
        self._ray = ray
        self._say = say or (lambda message: None)
        self._started_ray = False
        self.workers: list[Any] = []
        if not ray.is_initialized():
            self._say(f"starting Ray ({'a local cluster' if address is None else address})")
            ray.init(address=address, include_dashboard=False, logging_level="WARNING")
            self._started_ray = True
        self.args = model.args
        self.max_seq_len = model.args.max_seq_len
        self.weights_version = 0
        self.dtype = dtype
        """The dtype the workers hold the weights in; ``load_weights`` takes them in it."""
        try:
            state = {name: tensor.to(dtype) for name, tensor in trainer_state(model).items()}
            weights = ray.put(state_to_wire(state))
            actor = ray.remote(num_cpus=worker_cpus, num_gpus=worker_gpus)(RolloutWorker)
            device = "cuda" if worker_gpus > 0 else "cpu"
            self.workers = [actor.remote(model.args, weights, 0, device, max_batch) for _ in range(workers)]
            self.infos: list[WorkerInfo] = self._get([w.info.remote() for w in self.workers], "starting")
            self._check_all(weights_checksum(state), version=0)
        except BaseException:
            self.close()
            raise

    def _get(self, pending: list[Any], doing: str = "working") -> list[Any]:
        """The results of ``pending`` worker calls; a worker's failure becomes a ``RuntimeError`` naming it."""
        try:
            return self._ray.get(pending)
        except self._ray.exceptions.RayError as error:
            raise RuntimeError(f"A Ray rollout worker failed while {doing}: {error}") from error

    def describe(self) -> str:
        """One line naming the workers and where they run."""
        places = ", ".join(f"{i.host}:{i.pid} ({i.device})" for i in self.infos)
        return f"{len(self.workers)} Ray rollout worker{'s' * (len(self.workers) > 1)}: {places}"

    def _check_all(self, expected: str, version: int) -> list[str]:
        checksums = self._get([w.checksum.remote() for w in self.workers])
        wrong = [f"worker {i}: {c}" for i, c in enumerate(checksums) if c != expected]
        if wrong:
            raise RuntimeError(
                f"Rollout workers do not hold the trainer's weights at version {version} (checksum {expected}): "
                + "; ".join(wrong)
            )
        return checksums

    def checksum(self) -> str:
        """The checksum every worker holds (``RuntimeError`` if they differ)."""
        checksums = self._get([w.checksum.remote() for w in self.workers])
        if len(set(checksums)) != 1:
            raise RuntimeError(f"Rollout workers hold different weights: {checksums}")
        return checksums[0]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """``len(prompts) * params.n`` completions, grouped by prompt, sampled by the workers in parallel."""
        validate_prompts(prompts, params, self.args.vocab_size, self.args.max_seq_len, self.max_seq_len)
        blocks = split_evenly(len(prompts), len(self.workers))
        pending = [
            worker.generate.remote(prompts[start:stop], params, start)
            for worker, (start, stop) in zip(self.workers, blocks, strict=False)
        ]
        return [c for block in self._get(pending, "sampling") for c in completions_from_wire(block)]

    def load_weights(self, state: Mapping[str, torch.Tensor], version: int) -> SyncReport:
        """Send ``state`` to every worker as ``version``; each checks that its weights then have the trainer's
        checksum, and a worker that does not fails the sync (``RuntimeError`` naming it). ``seconds`` is the wall
        time of the whole sync (transfer, copies and checks)."""
        check_version(version, self.weights_version)
        start = time.perf_counter()
        expected = weights_checksum(state)
        weights = self._ray.put(state_to_wire(state))
        reports: list[SyncReport] = self._get(
            [w.load_weights.remote(weights, version, expected) for w in self.workers], "loading weights"
        )
        self.weights_version = version
        return SyncReport(
            version=version,
            checksum=expected,
            bytes=state_bytes(state),
            seconds=time.perf_counter() - start,
            extra={"workers": len(self.workers), "worker_seconds": [r.seconds for r in reports]},
        )

    def close(self) -> None:
        """Stop the workers, and the local Ray cluster if this object started it."""
        if self._ray.is_initialized():
            for worker in self.workers:
                self._ray.kill(worker)
        self.workers = []
        if self._started_ray and self._ray.is_initialized():
            self._ray.shutdown()
        self._started_ray = False

    def __enter__(self) -> RayRollout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
