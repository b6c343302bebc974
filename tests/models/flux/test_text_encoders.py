"""FLUX's frozen text encoders: tiny random T5 + CLIP offline, shapes, determinism, padding, loading errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from titanpod.models.flux.text_encoders import FluxTextEncoders, TinyTextEncoderConfig, byte_level_tokenizer

pytest.importorskip("transformers")

CONFIG = TinyTextEncoderConfig(context_dim=48, pooled_dim=24, t5_max_length=16)
PROMPTS = ["a red cube on a table", "une crème brûlée, vue de dessus " * 4]


@pytest.fixture(scope="module")
def encoders() -> FluxTextEncoders:
    return FluxTextEncoders.random(CONFIG, seed=0)


def test_shapes_follow_the_config(encoders: FluxTextEncoders) -> None:
    context, pooled = encoders.encode(PROMPTS)
    assert context.shape == (2, 16, 48)
    assert pooled.shape == (2, 24)
    assert (encoders.context_dim, encoders.pooled_dim) == (48, 24)
    assert torch.isfinite(context).all()
    assert torch.isfinite(pooled).all()


def test_same_seed_same_embeddings_and_global_rng_untouched(encoders: FluxTextEncoders) -> None:
    state = torch.random.get_rng_state()
    again = FluxTextEncoders.random(CONFIG, seed=0)
    other = FluxTextEncoders.random(CONFIG, seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)
    for a, b in zip(encoders.encode(PROMPTS), again.encode(PROMPTS), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(encoders.encode(PROMPTS), other.encode(PROMPTS), strict=True):
        assert not torch.allclose(a, b)


def test_frozen_no_gradients_and_stays_in_eval(encoders: FluxTextEncoders) -> None:
    encoders.train()
    assert not encoders.training
    assert not any(m.training for m in encoders.modules())
    assert not any(p.requires_grad for p in encoders.parameters())
    context, pooled = encoders.encode(PROMPTS)
    assert not context.requires_grad
    assert not pooled.requires_grad
    assert all(p.grad is None for p in encoders.parameters())


def test_padding_and_truncation(encoders: FluxTextEncoders) -> None:
    """T5 ids end with </s> then <pad>; CLIP's start with <s>; long prompts are cut to length, </s> kept."""
    t5_ids, clip_ids = encoders.tokenize(["ab", "x" * 500])
    assert t5_ids.shape == (2, 16)
    assert clip_ids.shape == (2, 77)
    pad, eos, bos = 0, 1, 2
    a, b = encoders.t5_tokenizer.convert_tokens_to_ids(["a", "b"])
    assert t5_ids[0].tolist() == [a, b, eos] + [pad] * 13
    assert clip_ids[0, :4].tolist() == [bos, a, b, eos]
    assert (clip_ids[0, 4:] == pad).all()
    assert t5_ids[1, -1] == eos
    assert (t5_ids[1, :-1] != pad).all()
    assert clip_ids[1, 0] == bos
    assert clip_ids[1, -1] == eos
    # Every prompt is padded to the full length, so a prompt's embeddings do not depend on its batch.
    alone = encoders.encode(PROMPTS[:1])
    together = encoders.encode(PROMPTS)
    torch.testing.assert_close(alone[0][0], together[0][0], atol=1e-5, rtol=0)
    torch.testing.assert_close(alone[1][0], together[1][0], atol=1e-5, rtol=0)


def test_byte_level_tokenizer_encodes_any_text() -> None:
    tokenizer = byte_level_tokenizer(64, with_bos=False)
    ids = tokenizer("é 猫")["input_ids"]
    assert len(ids) == 2 + 1 + 3 + 1  # two bytes, a space, three bytes, </s>
    assert tokenizer.decode(ids, skip_special_tokens=True) == "é 猫"
    assert len(tokenizer) == 259


def test_matches_diffusers_flux_pipeline_encode_prompt(encoders: FluxTextEncoders) -> None:
    """The same ids into the same models as FluxPipeline.encode_prompt: identical outputs (max abs 0)."""
    diffusers = pytest.importorskip("diffusers")
    pipe = diffusers.FluxPipeline(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
        vae=None,
        text_encoder=encoders.clip,
        tokenizer=encoders.clip_tokenizer,
        text_encoder_2=encoders.t5,
        tokenizer_2=encoders.t5_tokenizer,
        transformer=None,
    )
    context, pooled, _ = pipe.encode_prompt(PROMPTS, prompt_2=None, device="cpu", max_sequence_length=16)
    ours = encoders.encode(PROMPTS)
    assert torch.equal(ours[0], context)
    assert torch.equal(ours[1], pooled)


def test_save_and_from_pretrained_round_trip(encoders: FluxTextEncoders, tmp_path: Path) -> None:
    folder = encoders.save_pretrained(tmp_path / "flux")
    assert sorted(p.name for p in folder.iterdir()) == ["text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2"]
    assert not list(folder.rglob("*.bin"))
    loaded = FluxTextEncoders.from_pretrained(folder, t5_max_length=16)
    assert not any(p.requires_grad for p in loaded.parameters())
    for a, b in zip(encoders.encode(PROMPTS), loaded.encode(PROMPTS), strict=True):
        assert torch.equal(a, b)
    assert loaded.encode(PROMPTS[:1])[0].shape == (1, 16, 48)


def test_unreachable_hub_id_says_to_pass_a_local_folder() -> None:
    with pytest.raises(OSError, match=r"'black-forest-labs/FLUX\.1-dev'.*local folder path") as raised:
        FluxTextEncoders.from_pretrained("black-forest-labs/FLUX.1-dev", local_files_only=True)
    assert "FluxTextEncoders.from_pretrained('/path/to/FLUX.1-dev')" in str(raised.value)


def test_local_folder_errors_name_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "text_encoder").mkdir()
    with pytest.raises(FileNotFoundError, match="lacks the subfolders tokenizer, text_encoder_2, tokenizer_2"):
        FluxTextEncoders.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a folder"):
        FluxTextEncoders.from_pretrained(tmp_path / "nowhere")


def test_config_validates() -> None:
    with pytest.raises(ValueError, match="clip_heads"):
        TinyTextEncoderConfig(pooled_dim=30, clip_heads=4)


def test_default_tiny_widths_feed_the_debug_transformer() -> None:
    from titanpod.models.flux import FLUX_FLAVORS

    debug = FLUX_FLAVORS["debug"]
    assert (TinyTextEncoderConfig().context_dim, TinyTextEncoderConfig().pooled_dim) == (
        debug.context_dim,
        debug.pooled_dim,
    )


def test_a_word_vocabulary_makes_each_word_one_token_and_other_words_unknown(tmp_path: Path) -> None:
    words = ("a", "red", "circle", "on", "the", "left")
    config = TinyTextEncoderConfig(context_dim=48, pooled_dim=24, t5_max_length=8, words=words)
    encoders = FluxTextEncoders.random(config, seed=0)
    t5_ids, clip_ids = encoders.tokenize(["a red circle on the left", "a blue circle"])
    pad, eos, bos, unk = 0, 1, 2, 3
    first = [4 + words.index(word) for word in words]  # the prompt is the vocabulary in order
    assert t5_ids.tolist() == [[*first, eos, pad], [4, unk, 6, eos, pad, pad, pad, pad]]
    assert clip_ids[0, :8].tolist() == [bos, *first, eos]
    assert encoders.t5.config.vocab_size == encoders.clip.config.vocab_size == 4 + len(words)
    context, pooled = encoders.encode(["a red circle on the left", "a red circle on the right"])
    assert context.shape == (2, 8, 48) and not torch.equal(pooled[0], pooled[1])
    encoders.save_pretrained(tmp_path / "words")
    loaded = FluxTextEncoders.from_pretrained(tmp_path / "words", t5_max_length=8)
    assert torch.equal(loaded.tokenize(["a red circle"])[0], encoders.tokenize(["a red circle"])[0])
