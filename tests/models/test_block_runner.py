"""The block runner slot: the decoder and FLUX run every block list through ``ops.block_runner``, once a list,
handing it the list itself, and a runner that runs the blocks another way gets the same result."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from tests.models.flux.test_flux_transformer import inputs as flux_inputs
from tests.models.flux.test_flux_transformer import random_model as random_flux
from titanpod.models import BlockCall, DecoderArgs, ModelOps, MoEArgs, Transformer, blocks_in_order
from titanpod.models.common.block_runner import Carry

MOE = DecoderArgs(dim=32, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=16,
                  moe=MoEArgs(n_experts=4, top_k=2, expert_ffn_dim=16, capacity_factor=1.0))  # fmt: skip


class RecordingRunner:
    """Runs each list one block at a time through ``blocks_in_order`` on a one-block slice, recording the lists."""

    def __init__(self) -> None:
        self.lists: list[Sequence[nn.Module]] = []

    def __call__(
        self, blocks: Sequence[nn.Module], call: BlockCall, carry: Carry, inputs: tuple[Any, ...]
    ) -> tuple[Carry, list[Any]]:
        self.lists.append(blocks)
        emitted: list[Any] = []
        for index in range(len(blocks)):
            carry, out = blocks_in_order([blocks[index]], call, carry, inputs)
            emitted.extend(out)
        return carry, emitted


def decoder(ops: ModelOps) -> Transformer:
    model = Transformer(MOE, ops)
    model.init_weights(0)
    return model


def test_the_decoder_runs_its_layers_through_the_slot_and_gets_each_blocks_routing():
    runner = RecordingRunner()
    tokens_BS = torch.randint(0, MOE.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    plain = decoder(ModelOps()).hidden_states_and_routing(tokens_BS)
    model = decoder(ModelOps(block_runner=runner))
    routed = model.hidden_states_and_routing(tokens_BS)
    assert runner.lists == [model.layers]
    torch.testing.assert_close(routed[0], plain[0], rtol=0, atol=0)
    assert len(routed[1]) == len(routed[2]) == MOE.n_layers
    for ours, reference in zip(routed[1] + routed[2], plain[1] + plain[2], strict=True):
        torch.testing.assert_close(ours, reference, rtol=0, atol=0)


def test_flux_runs_its_double_then_single_stream_blocks_through_the_slot():
    runner = RecordingRunner()
    plain = random_flux()
    model = random_flux(ops=dataclasses.replace(plain.ops, block_runner=runner))
    batch = flux_inputs()
    out = model(**batch)
    assert runner.lists == [model.double_blocks, model.single_blocks]
    torch.testing.assert_close(out, plain(**batch), rtol=0, atol=0)
