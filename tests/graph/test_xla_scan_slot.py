"""``train.scan_layers`` fills the block runner slot of the module holding each stacked block list, for the trace
only, and refuses a model it cannot scan: one whose blocks' owner has no slot, or one that ran a stacked list
without it. No JAX is loaded: the refused models never reach the scan."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from titanpod.graph.xla.scan import ScanRunner, scanned_layers
from titanpod.models import DecoderArgs, Transformer

TINY = DecoderArgs(dim=16, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=32, ffn_dim=24, max_seq_len=8)


def stacked_stand_ins(model: nn.Module) -> dict[str, list[None]]:
    """One placeholder a parameter of block 0: what the slot's installation checks, not what a scan reads."""
    return {"layers": [None for _ in model.layers[0].parameters()]}


def test_the_slot_holds_a_scan_runner_for_the_trace_and_its_own_runner_after():
    with torch.device("meta"):
        model = Transformer(TINY)
    before = model.ops
    # Nothing runs the layers in the context, so leaving it is refused.
    with pytest.raises(ValueError, match="without its block runner"), scanned_layers(model, stacked_stand_ins(model)):
        assert isinstance(model.ops.block_runner, ScanRunner)
        assert model.ops.attention is before.attention and model.ops.sequence is before.sequence
    assert model.ops is before


def test_a_model_without_a_block_runner_slot_is_refused():
    class Loop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(2))

    model = Loop()
    refusal = r"block runner slot.*Loop, which holds layers.*scan_layers=false"
    with pytest.raises(ValueError, match=refusal), scanned_layers(model, {"layers": [None, None]}):
        pass
