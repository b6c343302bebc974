"""Diffusion training pieces: resumable flow-matching batches, the encodings cache, block recompute, sampling."""

import dataclasses
import json

import pytest
import torch

from titanpod.data.images import build_image_data
from titanpod.models.flux.flow_matching import FlowMatchingModel, sampling_schedule
from titanpod.recipes.diffusion.recipe import SampleConfig
from titanpod.recipes.diffusion.registry import get_diffusion_recipe
from titanpod.runs.diffusion.batches import EncodingCache, FlowMatchingBatches
from titanpod.runs.diffusion.components import build_diffusion_models
from titanpod.runs.diffusion.sampling import generate

CPU = torch.device("cpu")


def small_recipe(**model):
    recipe = get_diffusion_recipe("flux_debug")
    data = dataclasses.replace(recipe.data, resolution=16, batch_size=4, shapes_count=32)
    return dataclasses.replace(recipe, data=data, model=dataclasses.replace(recipe.model, **model))


def batches_of(recipe, models, cache, rank=0, world_size=1):
    data = build_image_data(recipe.data, 0, rank, world_size)
    return FlowMatchingBatches(data, models, cache, recipe.model.guidance, seed=0, device=CPU)


def test_flow_matching_batches_resume_exactly():
    recipe = small_recipe()
    models = build_diffusion_models(recipe, CPU)
    straight = batches_of(recipe, models, EncodingCache(None))
    expected = [next(straight) for _ in range(7)]
    first = batches_of(recipe, models, EncodingCache(None))
    for _ in range(3):
        next(first)
    state = json.loads(json.dumps(first.state_dict()))
    resumed = batches_of(recipe, models, EncodingCache(None))
    resumed.load_state_dict(state)
    for want in expected[3:]:
        got = next(resumed)
        assert got.keys() == want.keys()
        for name in want:
            assert got[name].equal(want[name]), name


def test_a_global_batch_is_the_same_however_many_data_ranks_share_it():
    recipe = small_recipe()  # 4 images per rank
    models = build_diffusion_models(recipe, CPU)
    one = batches_of(recipe, models, EncodingCache(None))
    ranks = [batches_of(recipe, models, EncodingCache(None), rank, 2) for rank in range(2)]
    for step in range(3):  # one process's micro-batches 2s and 2s + 1 are ranks 0 and 1 of global batch s
        halves = [next(one), next(one)]
        for rank, batches in enumerate(ranks):
            got = next(batches)
            for name, tensor in halves[rank].items():
                assert got[name].equal(tensor), f"step {step} rank {rank} {name}"
    noise = next(one)["noise"]
    assert not noise[0].equal(noise[1])  # each sample draws its own


def test_encodings_cache_on_disk_is_reused_and_gives_the_same_batches(tmp_path):
    recipe = small_recipe()
    models = build_diffusion_models(recipe, CPU)
    cold = EncodingCache(tmp_path / "cache")
    first = [next(batches_of(recipe, models, cold)) for _ in range(1)]
    assert cold.misses > 0 and list((tmp_path / "cache").glob("*.safetensors"))
    warm = EncodingCache(tmp_path / "cache")
    again = next(batches_of(recipe, models, warm))
    assert warm.misses == 0 and warm.hits > 0
    for name, tensor in first[0].items():
        assert again[name].equal(tensor), name


def test_captions_the_cache_lacks_are_encoded_together_as_each_is_alone():
    recipe = small_recipe()
    models = build_diffusion_models(recipe, CPU)
    cache = EncodingCache(None)
    batches = batches_of(recipe, models, cache)
    captions = [
        "a large red circle on the left on a white background",
        "",
        "a small blue square at the top on a grey background",
    ]
    cached_text, cached_pooled = models.text_encoders.encode(captions[:1])
    cache.put(EncodingCache.key("text", captions[0].encode()), {"text": cached_text[0], "pooled": cached_pooled[0]})
    text, pooled = batches.encode_captions([*captions, captions[2]])  # one cached, two new, one new twice
    assert text.shape[0] == pooled.shape[0] == 4 and text[3].equal(text[2]) and pooled[3].equal(pooled[2])
    for row, caption in enumerate(captions):
        alone_text, alone_pooled = models.text_encoders.encode([caption])
        assert text[row].equal(alone_text[0]) and pooled[row].equal(alone_pooled[0]), caption
    assert len(cache.memory) == 3


def test_recomputed_blocks_give_the_same_loss_and_gradients():
    recipe = small_recipe()
    batch = next(batches_of(recipe, build_diffusion_models(recipe, CPU), EncodingCache(None)))
    grads = []
    for recompute in (False, True):
        models = build_diffusion_models(small_recipe(recompute_blocks=recompute), CPU)
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():  # adaLN-Zero starts modulations at 0: give every block something to do
            for param in models.transformer.parameters():
                if not param.any():
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
        loss = FlowMatchingModel(models.transformer).loss(**batch)
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in models.transformer.parameters() if p.grad is not None]))
    (loss_a, grads_a), (loss_b, grads_b) = grads
    assert loss_a.equal(loss_b) and len(grads_a) == len(grads_b) > 0
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_sampling_is_seeded_and_gives_images_in_range():
    recipe = small_recipe()
    models = build_diffusion_models(recipe, CPU)
    config = SampleConfig(prompts=2, steps=3, cfg_scale=2.0, seed=5)
    prompts = ["a large red circle on the left on a white background", "a small blue square"]
    a = generate(models, prompts, 16, config)
    b = generate(models, prompts, 16, config)
    assert a.shape == (2, 3, 16, 16) and a.equal(b)
    assert a.min() >= -1 and a.max() <= 1


def test_guidance_stops_at_cfg_stop():
    recipe = small_recipe()
    models = build_diffusion_models(recipe, CPU)
    forward = models.transformer.forward
    calls = []

    def counting(*args, **kwargs):
        calls.append(float(args[4][0]))  # the step's timestep
        return forward(*args, **kwargs)

    models.transformer.forward = counting
    prompts = ["a large red circle on the left on a white background"]
    generate(models, prompts, 16, SampleConfig(prompts=1, steps=6, cfg_scale=3.0, seed=1))
    assert len(calls) == 12  # a conditional and an unconditional pass every step
    calls.clear()
    config = SampleConfig(prompts=1, steps=6, cfg_scale=3.0, cfg_stop=0.5, seed=1)
    generate(models, prompts, 16, config)
    schedule = sampling_schedule(6, 64)[:-1].tolist()
    above = sum(t > 0.5 for t in schedule)
    assert 0 < above < 6 and len(calls) == 6 + above  # the steps from t <= 0.5 on: the conditional pass alone
    calls.clear()
    generate(models, prompts, 16, SampleConfig(prompts=1, steps=6, cfg_scale=1.0, seed=1))
    assert len(calls) == 6  # no guidance: the conditional pass alone, every step
    with pytest.raises(ValueError, match="cfg_stop"):
        SampleConfig(cfg_stop=1.0)
