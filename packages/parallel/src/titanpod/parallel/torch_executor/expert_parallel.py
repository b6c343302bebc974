"""Expert parallelism: each ep rank holds a slice of the experts; their buffers travel to them and back.

Legend: E experts (global), L experts on this rank, P ep ranks, C rows per expert buffer
(its capacity), M model dim.

Every rank routes its own tokens into E fixed-size buffers of C rows, so the exchange is an
all-to-all of equal splits (L x C rows to each rank): no sizes are exchanged or read back to
the host, and the layer traces into a captured step.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from titanpod.parallel.errors import PlanError
from titanpod.parallel.torch_executor.collectives import all_to_all


def make_expert_parallel(experts: nn.Module, ep_mesh: DeviceMesh) -> None:
    """Make ``experts`` (a ``GroupedExperts`` whose weights hold this rank's experts) dispatch over ``ep_mesh``.

    Its forward then takes the buffers of all E experts, [E, C, M], sends expert e's to the rank
    holding it, runs this rank's L experts over the P x C rows they received, and sends the
    results back: [E, C, M] again, in the same places.
    """
    ranks = ep_mesh.size()
    local_forward = type(experts).forward  # computes the experts this rank holds

    def forward(self: nn.Module, x_ECM: torch.Tensor) -> torch.Tensor:
        E, C, M = x_ECM.shape
        if E % ranks:
            raise PlanError(f"{E} experts do not divide over ep={ranks} ranks; choose an ep that divides {E}.")
        L = E // ranks
        received_PLCM = all_to_all(x_ECM.view(ranks, L, C, M), [1] * ranks, [1] * ranks, ep_mesh)
        mine_LTM = received_PLCM.transpose(0, 1).reshape(L, ranks * C, M)  # each local expert: every rank's rows
        done_LPCM = local_forward(self, mine_LTM).view(L, ranks, C, M)
        returned_PLCM = all_to_all(done_LPCM.transpose(0, 1).contiguous(), [1] * ranks, [1] * ranks, ep_mesh)
        return returned_PLCM.view(E, C, M)

    experts.__class__ = type(f"ExpertParallel{type(experts).__name__}", (type(experts),), {"forward": forward})
