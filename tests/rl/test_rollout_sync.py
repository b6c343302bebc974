"""Weight sync into a rollout engine: checksums, versions, verification (the vLLM engine: test_rollout_vllm)."""

import pytest
import torch

from tests.rl.test_rollout import PROMPTS, TINY, greedy_by_hand, tiny_model
from titanpod.rl.rollout import (
    BuiltinEngine,
    SamplingParams,
    sync_weights,
    trainer_state,
    weights_checksum,
)

GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)


def train_towards(model, token: int, steps: int = 5) -> None:
    """A few optimizer steps teaching ``model`` to always predict ``token``."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, TINY.vocab_size, (4, 16), generator=torch.Generator().manual_seed(0))
    for _ in range(steps):
        optimizer.zero_grad()
        model.loss(tokens, torch.full_like(tokens, token)).backward()
        optimizer.step()


def test_checksum_is_order_independent_and_sees_every_change():
    state = {"b": torch.arange(6.0).view(2, 3), "a": torch.ones(4, dtype=torch.bfloat16), "c": torch.tensor(2)}
    reference = weights_checksum(state)
    assert weights_checksum(dict(reversed(list(state.items())))) == reference
    assert weights_checksum({**state, "c": torch.tensor(3)}) != reference  # a value
    assert weights_checksum({**state, "b": state["b"].double()}) != reference  # a dtype
    assert weights_checksum({**state, "b": state["b"].view(3, 2)}) != reference  # a shape
    assert weights_checksum({"B" if k == "b" else k: v for k, v in state.items()}) != reference  # a name
    assert weights_checksum({**state, "b": state["b"].t().contiguous().t()}) == reference  # layout is not content


def test_engine_keeps_its_own_weights():
    model = tiny_model()
    engine = BuiltinEngine(model)
    assert engine.checksum() == weights_checksum(model.state_dict()) and engine.weights_version == 0
    with torch.no_grad():
        model.tok_embeddings.weight.add_(1.0)
    assert engine.checksum() != weights_checksum(model.state_dict())


def test_sync_after_training_changes_generations_and_matches_the_trainer():
    model = tiny_model()
    engine = BuiltinEngine(model)
    before = engine.generate(PROMPTS, GREEDY)
    train_towards(model, token=7)
    assert [c.token_ids for c in engine.generate(PROMPTS, GREEDY)] == [c.token_ids for c in before]  # not synced
    report = sync_weights(model, engine, version=1)
    after = engine.generate(PROMPTS, GREEDY)
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    assert [c.token_ids for c in after] == [greedy_by_hand(model, p, 6) for p in PROMPTS]
    assert report.checksum == engine.checksum() == weights_checksum(trainer_state(model))
    assert report.version == engine.weights_version == 1 and all(c.weights_version == 1 for c in after)
    assert report.bytes == sum(p.numel() * 4 for p in model.parameters()) and report.seconds >= 0


def test_stale_versions_are_refused_naming_both():
    model = tiny_model()
    engine = BuiltinEngine(model, weights_version=3)
    with pytest.raises(ValueError, match="Weights version 3 is not newer than the engine's version 3"):
        sync_weights(model, engine, 3)
    sync_weights(model, engine, 5)
    with pytest.raises(ValueError, match="Weights version 4 is not newer than the engine's version 5"):
        sync_weights(model, engine, 4)


def test_a_tampered_copy_fails_verification_and_blocks_generation(monkeypatch):
    model = tiny_model()
    engine = BuiltinEngine(model)
    honest_copy = engine._copy_in

    def tampered_copy(state):
        honest_copy(state)
        with torch.no_grad():
            engine.model.layers[1].attention.wk.weight[0, 0] += 1e-3

    monkeypatch.setattr(engine, "_copy_in", tampered_copy)
    with pytest.raises(RuntimeError, match=r"failed verification.*stays at version 0"):
        sync_weights(model, engine, 1)
    assert engine.weights_version == 0
    with pytest.raises(RuntimeError, match="failed their last sync verification"):
        engine.generate(PROMPTS, GREEDY)
    monkeypatch.setattr(engine, "_copy_in", honest_copy)
    assert sync_weights(model, engine, 1).checksum == engine.checksum()
    engine.generate(PROMPTS, GREEDY)


def test_a_tampering_subclass_is_caught_too():
    class LossyEngine(BuiltinEngine):
        def _copy_in(self, state):
            super()._copy_in({name: t.bfloat16().float() for name, t in state.items()})

    model = tiny_model()
    engine = LossyEngine(model)  # construction copies without verifying; the sync verifies
    with pytest.raises(RuntimeError, match="failed verification"):
        sync_weights(model, engine, 1)


def test_weights_that_arrive_changed_fail_against_the_senders_checksum():
    # A remote trainer sends its checksum with the weights; bytes changed on the way fail the load.
    model = tiny_model()
    engine = BuiltinEngine(model)
    sent = weights_checksum(trainer_state(model))
    damaged = {name: t.clone() for name, t in trainer_state(model).items()}
    damaged["output.weight"][0, 0] += 1.0
    with pytest.raises(RuntimeError, match="failed verification"):
        engine.load_weights(damaged, 1, expected_checksum=sent)
    assert engine.load_weights(trainer_state(model), 1, expected_checksum=sent).checksum == sent


def test_wrong_tensors_are_named():
    engine = BuiltinEngine(tiny_model())
    state = trainer_state(tiny_model())
    del state["norm.weight"]
    state["extra.weight"] = torch.zeros(1)
    state["output.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match=r"missing norm.weight.*unexpected extra.weight.*output.weight: got \[3, 3\]"):
        engine.load_weights(state, 1)
    assert engine.weights_version == 0


def test_compiled_trainer_names_are_plain():
    model = tiny_model()
    wrapper = torch.nn.Module()
    wrapper._orig_mod = model  # what torch.compile's OptimizedModule holds
    assert trainer_state(wrapper).keys() == model.state_dict().keys()
