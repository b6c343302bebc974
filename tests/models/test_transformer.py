"""The Llama 3 model: shapes, causality, initialisation, slots and counting.

Parity with transformers comes with the Hugging Face adapters; these tests check the
properties the model must have whatever its weights.
"""

import math

import pytest
import torch

from titanpod.models import IGNORE_INDEX, DecoderArgs, ModelOps, Transformer, parameter_count
from titanpod.recipes.families import build_model, get_flavor

TINY = DecoderArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128, ffn_dim=96, max_seq_len=64)


def tiny_model(seed: int = 0, ops: ModelOps | None = None) -> Transformer:
    with torch.device("meta"):
        model = Transformer(TINY, ops)
    model.to_empty(device="cpu")
    model.init_weights(seed)
    return model


def test_debug_flavor_shapes():
    args = get_flavor("llama3", "debug")
    assert (args.dim, args.n_layers, args.n_heads, args.vocab_size) == (256, 6, 16, 2048)
    assert args.resolved_head_dim == 16


def test_build_on_meta_allocates_nothing_and_counts_parameters():
    model = build_model("llama3", "debug")
    assert all(p.device.type == "meta" for p in model.parameters())
    args = model.args
    hd = args.resolved_head_dim
    per_layer = (
        args.dim * args.n_heads * hd * 2  # wq, wo
        + args.dim * args.n_kv_heads * hd * 2  # wk, wv
        + 3 * args.dim * args.ffn_dim  # w1, w2, w3
        + 2 * args.dim  # two norms
    )
    expected = 2 * args.vocab_size * args.dim + args.n_layers * per_layer + args.dim
    assert parameter_count(model) == expected


def test_flops_per_token_follows_the_stated_convention():
    model = build_model("llama3", "debug")
    args = model.args
    non_embedding = parameter_count(model) - args.vocab_size * args.dim
    expected = 6 * non_embedding + 12 * args.n_layers * args.n_heads * args.resolved_head_dim * 256
    assert model.flops_per_token(256) == expected


def test_unknown_flavor_or_family_suggests_the_closest():
    with pytest.raises(KeyError, match="Did you mean 'debug'"):
        get_flavor("llama3", "debg")
    with pytest.raises(KeyError, match="Did you mean 'llama3'"):
        get_flavor("lama3", "debug")


def test_logits_shape_and_initial_loss_near_uniform():
    model = tiny_model()
    tokens = torch.randint(0, TINY.vocab_size, (2, 16))
    assert model(tokens).shape == (2, 16, TINY.vocab_size)
    loss = model.loss(tokens, tokens)
    assert abs(loss.item() - math.log(TINY.vocab_size)) < 0.1


def test_future_tokens_do_not_change_past_logits():
    model = tiny_model()
    tokens = torch.randint(0, TINY.vocab_size, (1, 12))
    changed = tokens.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % TINY.vocab_size
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    torch.testing.assert_close(before[:, :8], after[:, :8])
    assert not torch.allclose(before[:, 8:], after[:, 8:])


def test_init_is_deterministic_per_seed():
    a, b, c = tiny_model(0), tiny_model(0), tiny_model(1)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb), name
        if not name.endswith("norm.weight"):
            assert not torch.equal(pa, pc), name


def test_loss_skips_ignored_labels():
    model = tiny_model()
    tokens = torch.randint(0, TINY.vocab_size, (1, 10))
    labels = tokens.clone()
    labels[0, 5:] = IGNORE_INDEX
    with torch.no_grad():
        logits = model(tokens)
    expected = torch.nn.functional.cross_entropy(logits[0, :5], labels[0, :5])
    torch.testing.assert_close(model.loss(tokens, labels), expected)


def test_slots_route_attention_and_head_loss_through_the_given_ops():
    calls = {"attention": 0, "head_loss": 0}

    def counting_attention(q, k, v):
        calls["attention"] += 1
        return ModelOps().attention(q, k, v)

    def counting_head_loss(h, w, labels):
        calls["head_loss"] += 1
        return ModelOps().head_loss(h, w, labels)

    reference, swapped = tiny_model(), tiny_model(ops=ModelOps(counting_attention, counting_head_loss))
    tokens = torch.randint(0, TINY.vocab_size, (2, 8))
    torch.testing.assert_close(swapped.loss(tokens, tokens), reference.loss(tokens, tokens))
    assert calls == {"attention": TINY.n_layers, "head_loss": 1}


def test_tied_embeddings_use_the_table_as_the_head_after_materialising():
    args = DecoderArgs(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=64, ffn_dim=48, tie_embeddings=True)
    with torch.device("meta"):
        model = Transformer(args)
    assert model.flops_per_token(8) == 6 * parameter_count(model) + 12 * 1 * 2 * 16 * 8
    model.to_empty(device="cpu")
    model.init_weights(0)
    assert model.output is None and model.head_weight is model.tok_embeddings.weight
    tokens = torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        expected = model.hidden_states(tokens) @ model.tok_embeddings.weight.T
        torch.testing.assert_close(model(tokens), expected)


def test_args_reject_inconsistent_heads():
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        DecoderArgs(dim=64, n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="divisible by n_heads"):
        DecoderArgs(dim=65, n_heads=4, n_kv_heads=2)
