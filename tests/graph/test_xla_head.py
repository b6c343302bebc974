"""Which parameter the xla step gathers for the head + loss slot, and the policy that keeps the loss kernels' results.

The regathered head's numerics are checked where a sharded xla step trains like eager with the Pallas loss
(tests/kernels/test_xla_kernels.py) and with the reference loss (tests/graph/test_xla_step.py).
"""

from __future__ import annotations

from torch import nn

from titanpod.graph.xla.head import head_parameter, kernel_outputs_saveable
from titanpod.models import DecoderArgs, Transformer

ARGS = {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "vocab_size": 64, "ffn_dim": 48}


def test_the_head_is_the_output_layer_or_the_tied_embedding_table():
    assert head_parameter(Transformer(DecoderArgs(**ARGS))) == "output.weight"
    assert head_parameter(Transformer(DecoderArgs(**ARGS, tie_embeddings=True))) == "tok_embeddings.weight"


def test_a_model_without_a_head_and_loss_slot_has_no_head():
    assert head_parameter(nn.Linear(4, 4)) is None


def test_only_pallas_results_are_saved():
    class Primitive:
        def __init__(self, name: str) -> None:
            self.name = name

    assert kernel_outputs_saveable(Primitive("pallas_call"))
    assert not kernel_outputs_saveable(Primitive("sharding_constraint"))
    assert not kernel_outputs_saveable(Primitive("convert_element_type"))
