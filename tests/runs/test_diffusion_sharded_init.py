"""A sharded diffusion run creates its seeded FLUX transformer shard by shard from the meta device: each rank's
shards equal one process's ``init_weights(seed)`` at that rank's region, bit for bit, and the frozen codec and
text encoders are whole and the same as one process's."""

from __future__ import annotations

from tests.conftest import run_json_script

FAKE_RANKS = """
import dataclasses, json
import torch, torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore
from titanpod.device import get_backend
from titanpod.parallel import ParallelConfig
from titanpod.recipes.families import sharding_plan
from titanpod.parallel.torch_executor import local_region, parallelize
from titanpod.recipes.diffusion.registry import get_diffusion_recipe
from titanpod.runs.diffusion.components import build_diffusion_models

CPU = torch.device("cpu")
recipe = get_diffusion_recipe("flux_debug")
recipe = dataclasses.replace(recipe, train=dataclasses.replace(recipe.train, seed=5))
one = build_diffusion_models(recipe, CPU)
reference = dict(one.transformer.named_parameters())
frozen = dict(one.text_encoders.named_parameters())
found = {"one_process_values": one.initial_values is None}
for layout, config in {"fsdp2": ParallelConfig(fsdp=2), "hsdp": ParallelConfig(dp_replicate=2, fsdp=1)}.items():
    for rank in range(2):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=2)
        models = build_diffusion_models(recipe, CPU, sharded=True)
        meta = all(param.is_meta for param in models.transformer.parameters())
        plan = sharding_plan("flux")
        sharded = parallelize(models.transformer, plan, config, get_backend("cpu"), models.initial_values)
        wrong, local, full = [], 0, 0
        for name, param in models.transformer.named_parameters():
            assert isinstance(param, DTensor), name
            region = local_region(param.shape, sharded.mesh, param.placements)
            if not torch.equal(param.to_local(), reference[name][region]):
                wrong.append(name)
            local += param.to_local().numel()
            full += param.numel()
        encoders = dict(models.text_encoders.named_parameters())
        frozen_wrong = [name for name, value in frozen.items() if not torch.equal(encoders[name], value)]
        found[f"{layout}/{rank}"] = {
            "meta": meta, "wrong": wrong, "share": local / full, "parameters": len(reference), "frozen": frozen_wrong,
            "encoders": len(encoders)
        }
        dist.destroy_process_group()
print(json.dumps(found))
"""


def test_each_rank_creates_its_shards_of_the_seeded_transformer_equal_to_one_process_init():
    """FSDP=2 and HSDP (dp_replicate 2), both ranks of each on a fake process group: the transformer comes
    from ``build_diffusion_models(sharded=True)`` on the meta device, and after ``parallelize`` each local
    shard equals the one-process init at that rank's region; FSDP ranks hold about half, HSDP ranks all."""
    found = run_json_script(FAKE_RANKS, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert found.pop("one_process_values") is True  # one process: initialised whole, nothing left to create
    assert sorted(found) == ["fsdp2/0", "fsdp2/1", "hsdp/0", "hsdp/1"]
    for key, result in found.items():
        assert result["meta"] is True, key
        assert result["parameters"] > 0, key
        assert result["wrong"] == [], key
        assert result["encoders"] > 0 and result["frozen"] == [], key
    for rank in range(2):
        assert 0.45 <= found[f"fsdp2/{rank}"]["share"] <= 0.55
        assert found[f"hsdp/{rank}"]["share"] == 1.0
