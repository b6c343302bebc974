"""Expert parallelism: each ep rank holds a slice of the experts; tokens travel to them and back.

Legend: T routed rows, E experts (global), L experts on this rank, P ep ranks, M model dim.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from titanpod.parallel.torch_executor.collectives import all_to_all


def _regroup_order(sizes_PL: torch.Tensor) -> torch.Tensor:
    """Row order that turns (source rank, local expert) blocks into (local expert, source rank) blocks."""
    starts_PL = (sizes_PL.flatten().cumsum(0) - sizes_PL.flatten()).view_as(sizes_PL)
    pieces = [
        torch.arange(int(starts_PL[p, e]), int(starts_PL[p, e] + sizes_PL[p, e]))
        for e in range(sizes_PL.shape[1])
        for p in range(sizes_PL.shape[0])
    ]
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long)


def make_expert_parallel(experts: nn.Module, ep_mesh: DeviceMesh) -> None:
    """Make ``experts`` (a ``GroupedExperts`` whose weights hold this rank's experts) dispatch over ``ep_mesh``."""
    ranks = ep_mesh.size()
    local_forward = type(experts).forward  # computes the experts this rank holds

    def forward(self: nn.Module, x_TM: torch.Tensor, group_sizes_E: torch.Tensor) -> torch.Tensor:
        sizes_PL = group_sizes_E.view(ranks, -1)
        received_PL = all_to_all(sizes_PL.flatten(), [sizes_PL.shape[1]] * ranks, [sizes_PL.shape[1]] * ranks, ep_mesh)
        received_PL = received_PL.view_as(sizes_PL)
        send, receive = sizes_PL.sum(1).tolist(), received_PL.sum(1).tolist()
        arrived_TM = all_to_all(x_TM, send, receive, ep_mesh)
        order = _regroup_order(received_PL).to(x_TM.device)
        local_sizes_L = received_PL.sum(0)
        done_TM = local_forward(self, arrived_TM[order], local_sizes_L)
        restored_TM = torch.empty_like(done_TM).index_copy_(0, order, done_TM)
        return all_to_all(restored_TM, receive, send, ep_mesh)

    experts.__class__ = type(f"ExpertParallel{type(experts).__name__}", (type(experts),), {"forward": forward})
