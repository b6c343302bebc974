"""Context parallelism's pieces in one process: which chunks a rank keeps, and where they sit.

The multi-process parity (cp ranks train like one process) is in test_torchrun.py.
"""

from __future__ import annotations

import pytest
import torch

from titanpod.kernels import local_causal_sdpa
from titanpod.models import SequenceChunks, WholeSequence, positioned_form, positioned_sdpa_attention, sdpa_attention
from titanpod.parallel.torch_executor.context_parallel import ContextParallelSequence, gathered_chunks, rank_chunks


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_the_ranks_chunks_cover_every_position_once_and_balance_causal_work(cp):
    S = 2 * cp * 5
    row_BS = torch.arange(S).expand(2, S)
    kept = [ContextParallelSequence(rank, cp).local(row_BS) for rank in range(cp)]
    assert sorted(torch.cat(kept, dim=1)[0].tolist()) == list(range(S))
    for rank, local_Bs in enumerate(kept):
        # the tokens kept are those at the positions RoPE is given
        assert local_Bs[1].tolist() == ContextParallelSequence(rank, cp).positions(S, torch.device("cpu")).tolist()
    # causal work of a rank: for each of its queries, the keys at or before it
    work = [sum(p + 1 for p in local_Bs[0].tolist()) for local_Bs in kept]
    assert len(set(work)) == 1
    assert gathered_chunks(cp) == tuple(c for rank in range(cp) for c in rank_chunks(rank, cp))
    assert sorted(gathered_chunks(cp)) == list(range(2 * cp))


def test_a_sequence_that_does_not_cut_into_chunks_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match=r"cuts each row into 4 equal chunks, but the sequence has 30 tokens.*seq_len"):
        ContextParallelSequence(0, 2).local(torch.zeros(1, 30, dtype=torch.long))


def test_sequence_chunks_positions():
    at = SequenceChunks(3, (0, 3))
    assert at.length == 6
    assert at.positions().tolist() == at.position_list() == [0, 1, 2, 9, 10, 11]
    assert WholeSequence().positions(4, torch.device("cpu")).tolist() == [0, 1, 2, 3]


def test_attention_ops_have_a_positioned_form_only_where_it_is_exact():
    assert positioned_form(sdpa_attention) is positioned_sdpa_attention
    assert positioned_form(local_causal_sdpa(8)) is None  # refused by make_context_parallel, not approximated
