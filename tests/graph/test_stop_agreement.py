"""Processes of one job stop after the same step when only one of them receives the signal.

Two gloo processes (spawned, on a file store); the signal reaches rank 1 alone, at step 3. Without
the agreement rank 0 would go on into step 4's collectives and wait there for rank 1 forever.
"""

from __future__ import annotations

import signal

import torch.distributed as dist
import torch.multiprocessing as mp

from titanpod.device import get_backend
from titanpod.graph.interrupt import StopRequest
from titanpod.graph.stop_agreement import StopAgreement

SIGNALLED_RANK, SIGNALLED_AT = 1, 3


def rank_main(rank: int, store_path: str, results) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    agreement = StopAgreement(get_backend("cpu"))
    stop = StopRequest()
    stopped = None
    for step in range(1, 8):
        if rank == SIGNALLED_RANK and step == SIGNALLED_AT:
            stop.signum = signal.SIGTERM  # what the handler records
        dist.barrier()  # stands in for the step's collectives
        signum = agreement.signal(stop)
        if signum is not None:
            stopped = (step, signum)
            break
    results[rank] = stopped
    dist.destroy_process_group()


def test_every_process_stops_after_the_step_where_one_saw_the_signal(tmp_path):
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(rank_main, args=(str(tmp_path / "store"), results), nprocs=2, join=True)
        assert dict(results) == {0: (SIGNALLED_AT, signal.SIGTERM), 1: (SIGNALLED_AT, signal.SIGTERM)}


def test_a_job_of_one_process_needs_no_agreement():
    agreement = StopAgreement(get_backend("cpu"))
    assert agreement.group is None
    assert agreement.signal(StopRequest()) is None
    assert agreement.signal(StopRequest(signum=signal.SIGINT)) == signal.SIGINT
