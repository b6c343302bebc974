"""Streamed weight sync (``titanpod.rl.rollout.streamed``): weights reach a ``BuiltinEngine`` one at a time in the
engine's dtype, checked by checksum, and the gather never holds more than one weight at once."""

import weakref

import pytest
import torch

from tests.rl.test_rollout import PROMPTS, tiny_model
from titanpod.recipes.posttrain.rollout_config import RolloutConfig
from titanpod.rl.rollout import BuiltinEngine, SamplingParams, trainer_state, weights_checksum
from titanpod.rl.rollout.streamed import gathered_weights, sync_engine
from titanpod.rl.rollout.sync import ChecksumStream

GREEDY = SamplingParams(max_new_tokens=4, temperature=0.0)


def test_checksum_stream_equals_the_whole_state_checksum_and_wants_sorted_names():
    state = {"b": torch.arange(6.0).view(2, 3), "a": torch.ones(4, dtype=torch.bfloat16), "c": torch.tensor(2)}
    stream = ChecksumStream()
    for name in sorted(state):
        stream.add(name, state[name])
    assert stream.hexdigest() == weights_checksum(state)
    with pytest.raises(ValueError, match="sorted name order"):
        stream.add("a", state["a"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_empty_engine_filled_by_a_streamed_sync_holds_the_weights_in_its_dtype(dtype):
    model = tiny_model()
    engine = BuiltinEngine.empty(model.args, dtype, "cpu", ops=model.ops)
    with pytest.raises(RuntimeError, match="sync again"):
        engine.generate(PROMPTS[:1], GREEDY)
    report = sync_engine(model, engine, 0)
    # The checksum the engine verified is that of the trainer's weights cast to the engine's dtype, by hand.
    cast = {name: tensor.to(dtype) for name, tensor in trainer_state(model).items()}
    assert report.version == engine.weights_version == 0
    assert report.checksum == engine.checksum() == weights_checksum(cast)
    assert engine.dtype == dtype
    assert report.bytes == sum(t.numel() for t in cast.values()) * (4 if dtype == torch.float32 else 2)
    if dtype == torch.float32:  # the same weights as an engine built from the whole model sample the same
        whole = BuiltinEngine(model).generate(PROMPTS, GREEDY)
        assert [c.token_ids for c in engine.generate(PROMPTS, GREEDY)] == [c.token_ids for c in whole]
    else:
        assert len(engine.generate(PROMPTS, GREEDY)) == len(PROMPTS)


def test_a_streamed_sync_refuses_a_wrong_dtype_a_missing_weight_and_an_old_version():
    model = tiny_model()
    engine = BuiltinEngine.empty(model.args, torch.bfloat16, "cpu")
    with pytest.raises(ValueError, match="engine's dtype"):
        engine.load_stream(gathered_weights(model, torch.float32), 0)
    with pytest.raises(ValueError, match="left out"):
        engine.load_stream(list(gathered_weights(model, torch.bfloat16))[1:], 0)
    sync_engine(model, engine, 1)
    with pytest.raises(ValueError, match="not newer"):
        sync_engine(model, engine, 1)


def test_the_gather_holds_one_weight_at_a_time_not_a_whole_copy():
    """Count the bytes of gathered tensors still alive each time the next one is made, as the engine draws them."""
    model = tiny_model()
    engine = BuiltinEngine.empty(model.args, torch.bfloat16, "cpu")
    alive: list[weakref.ref] = []
    peak = 0

    def metered():
        nonlocal peak
        for name, tensor in gathered_weights(model, torch.bfloat16):
            alive.append(weakref.ref(tensor))
            held = sum(t.numel() * t.element_size() for t in (ref() for ref in alive) if t is not None)
            peak = max(peak, held)
            yield name, tensor
            del tensor

    engine.load_stream(metered(), 0)
    params = list(model.parameters())
    largest_bf16 = max(p.numel() for p in params) * 2
    whole_fp32 = sum(p.numel() for p in params) * 4
    assert 0 < peak <= largest_bf16 < whole_fp32 // 4


def test_the_rollout_dtype_is_the_engines_and_vllm_keeps_its_own():
    assert RolloutConfig().inference_dtype == "float32"  # as before: the debug recipes' engines hold fp32
    assert RolloutConfig(dtype="bfloat16").inference_dtype == "bfloat16"
    assert RolloutConfig(mode="vllm").inference_dtype == "bfloat16"
    with pytest.raises(ValueError, match=r"--rollout\.vllm-dtype"):
        RolloutConfig(mode="vllm", dtype="bfloat16")
    with pytest.raises(ValueError, match=r"rollout\.dtype"):
        RolloutConfig(dtype="int8")  # type: ignore[arg-type]


def test_a_streamed_copy_that_differs_fails_verification_and_blocks_generation():
    class LossyEngine(BuiltinEngine):
        def _copy_weight(self, param, tensor):
            param.copy_(tensor.bfloat16().float())

    model = tiny_model()
    engine = LossyEngine.empty(model.args, torch.float32, "cpu", ops=model.ops)
    with pytest.raises(RuntimeError, match=r"failed verification: [\d,]+ elements .* stays at version -1"):
        sync_engine(model, engine, 0)
    with pytest.raises(RuntimeError, match="sync again"):
        engine.generate(PROMPTS[:1], GREEDY)


def test_a_streamed_sync_of_weights_holding_nan_verifies_nan_as_equal():
    model = tiny_model()
    with torch.no_grad():
        model.norm.weight[0] = float("nan")
    engine = BuiltinEngine.empty(model.args, torch.float32, "cpu", ops=model.ops)
    report = sync_engine(model, engine, 0)
    assert report.checksum == engine.checksum() == weights_checksum(trainer_state(model))
    assert torch.isnan(engine.model.norm.weight[0])
