"""Document masking: a packed row with document ids computes each document as if it were alone.

Two documents A (5 tokens) and B (7 tokens) are packed into one row of 12 with ids
[0]*5 + [1]*7. With the ids, every token attends only to earlier tokens of its own document,
and RoPE is relative, so B's logits in the packed row equal B's logits alone even though B
starts at position 5. Gradients: the packed loss is the mean over 12 labelled tokens, so it
equals (5 x loss_A + 7 x loss_B) / 12 and so must every parameter's gradient.

Tolerances (fp32): logits and losses within 1e-5 absolute (measured 1.6e-7 for logits,
4.8e-7 for the loss: the packed run sums the same terms with masked zeros in between);
gradients within 1e-5 absolute (measured 6e-8). Ids that are all equal give plain causal
attention within 1e-6 (measured: exactly equal on this CPU; SDPA with an explicit mask may
take a different kernel from ``is_causal`` elsewhere, so bit-equality is not asserted).
"""

from __future__ import annotations

import pytest
import torch

from titanpod.models import DecoderArgs, ModelOps, MoEArgs, Transformer, document_causal_mask, sdpa_attention

DENSE = DecoderArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128, ffn_dim=96, max_seq_len=64)
QK_NORM_MOE = DecoderArgs(
    dim=64, n_layers=2, n_heads=4, n_kv_heads=1, vocab_size=128, ffn_dim=96, max_seq_len=64, qk_norm=True,
    moe=MoEArgs(n_experts=4, top_k=2, expert_ffn_dim=32),
)  # fmt: skip
LEN_A, LEN_B = 5, 7
ATOL = 1e-5


def model_for(args: DecoderArgs) -> Transformer:
    model = Transformer(args)
    model.init_weights(0)
    return model


def two_documents(vocab: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Tokens and labels of A and B, each [1, len]."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, vocab, (1, n), generator=g) for n in (LEN_A, LEN_A, LEN_B, LEN_B))


def packed_ids(batch: int = 1) -> torch.Tensor:
    return torch.tensor([[0] * LEN_A + [1] * LEN_B] * batch)


@pytest.mark.parametrize("args", [DENSE, QK_NORM_MOE], ids=["dense", "qk_norm_moe"])
def test_packed_documents_give_the_logits_of_each_document_alone(args):
    model = model_for(args)
    tokens_a, _, tokens_b, _ = two_documents(args.vocab_size)
    with torch.no_grad():
        packed = model(torch.cat([tokens_a, tokens_b], dim=1), packed_ids())
        alone_a, alone_b = model(tokens_a), model(tokens_b)
        unmasked = model(torch.cat([tokens_a, tokens_b], dim=1))
    torch.testing.assert_close(packed[:, :LEN_A], alone_a, atol=ATOL, rtol=0)
    torch.testing.assert_close(packed[:, LEN_A:], alone_b, atol=ATOL, rtol=0)
    assert (unmasked[:, LEN_A:] - alone_b).abs().max() > 1e-2  # without ids, B does see A


def test_packed_loss_and_gradients_equal_the_separate_documents():
    packed_model, separate_model = model_for(DENSE), model_for(DENSE)
    tokens_a, labels_a, tokens_b, labels_b = two_documents(DENSE.vocab_size, seed=1)
    tokens, labels = torch.cat([tokens_a, tokens_b], dim=1), torch.cat([labels_a, labels_b], dim=1)
    packed_loss = packed_model.loss(tokens, labels, packed_ids())
    separate_loss = LEN_A * separate_model.loss(tokens_a, labels_a) + LEN_B * separate_model.loss(tokens_b, labels_b)
    separate_loss = separate_loss / (LEN_A + LEN_B)
    torch.testing.assert_close(packed_loss, separate_loss, atol=ATOL, rtol=0)
    packed_loss.backward()
    separate_loss.backward()
    for (name, p), q in zip(packed_model.named_parameters(), separate_model.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, atol=ATOL, rtol=1e-4, msg=name)
        assert q.grad.abs().max() > 0, name


def test_rows_of_a_batch_keep_their_own_documents():
    model = model_for(DENSE)
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, DENSE.vocab_size, (2, LEN_A + LEN_B), generator=g)
    ids = torch.stack([packed_ids()[0], torch.zeros(LEN_A + LEN_B, dtype=torch.long)])  # row 1: one document
    with torch.no_grad():
        both = model(tokens, ids)
        row_0 = model(tokens[:1], ids[:1])
        row_1_causal = model(tokens[1:])
    torch.testing.assert_close(both[:1], row_0, atol=ATOL, rtol=0)
    torch.testing.assert_close(both[1:], row_1_causal, atol=1e-6, rtol=0)


def test_equal_ids_are_plain_causal_attention():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, h, 16, 8, generator=g) for h in (4, 2, 2))
    ids = torch.full((2, 16), 7)
    torch.testing.assert_close(sdpa_attention(q, k, v, ids), sdpa_attention(q, k, v), atol=1e-6, rtol=0)
    model = model_for(DENSE)
    tokens = torch.randint(0, DENSE.vocab_size, (2, 16), generator=g)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens, torch.zeros_like(tokens)), model(tokens), atol=1e-6, rtol=0)


def test_document_causal_mask_is_causal_and_within_documents():
    mask = document_causal_mask(torch.tensor([[0, 0, 1, 1, 1, 4]]))
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [0, 0, 1, 0, 0, 0],
            [0, 0, 1, 1, 0, 0],
            [0, 0, 1, 1, 1, 0],
            [0, 0, 0, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert mask.shape == (1, 1, 6, 6)
    assert torch.equal(mask[0, 0], expected)


def test_without_ids_the_attention_op_is_called_as_before():
    calls: list[int] = []

    def three_argument_attention(q, k, v):  # an op written before document masking
        calls.append(q.shape[2])
        return sdpa_attention(q, k, v)

    model = Transformer(DENSE, ModelOps(attention=three_argument_attention))
    model.init_weights(0)
    tokens = torch.randint(0, DENSE.vocab_size, (1, 6))
    assert torch.equal(model.loss(tokens, tokens), model_for(DENSE).loss(tokens, tokens))
    assert calls == [6] * DENSE.n_layers


def test_document_ids_of_the_wrong_shape_are_refused():
    model = model_for(DENSE)
    tokens = torch.zeros(2, 6, dtype=torch.long)
    with pytest.raises(ValueError, match=r"document_ids_BS has shape \[2, 5\].*one document id per token"):
        model.loss(tokens, tokens, torch.zeros(2, 5, dtype=torch.long))
