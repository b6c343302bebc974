"""The xla lane's step compiles through JAX's persistent cache in ``train.compile_cache_dir``.

One subprocess with host devices (torchax must not load in the pytest process) trains the
llama3 debug model for 2 steps six times, each with a freshly built ``XlaStep``: into an
empty folder (compiled), the same folder again (loaded: JAX reports a cache hit), with the
cache off, into a second folder (JAX's cache moves there), the first folder again, and a
folder that cannot be made (under a file: a warning, and the run trains without a cache).
The loaded program must train exactly like the compiled one.
"""

from __future__ import annotations

import pytest

from tests.conftest import XLA_ENV, run_json_script

SCRIPT = """
import json, sys, warnings, torch
from titanpod.device import get_backend
from titanpod.graph import TrainConfig, train
from titanpod.graph.xla import XlaStep
from titanpod.recipes.families import build_model

first, second, blocked = sys.argv[1], sys.argv[2], sys.argv[3]
generator = torch.Generator().manual_seed(1)
data = [torch.randint(0, 2048, (4, 33), generator=generator) for _ in range(2)]

def run(cache_dir):
    torch.manual_seed(0)
    model = build_model("llama3", "debug", device="cpu")
    model.init_weights(0)
    config = TrainConfig(steps=2, lr=1e-3, warmup_steps=1, log_every=1, step_mode="whole_step",
                         compile_cache_dir=cache_dir)
    backend = get_backend("xla")
    step = XlaStep(model, config, backend)
    summary = train(model, iter([(d[:, :-1], d[:, 1:]) for d in data]), config, backend, flops_per_token=1.0,
                    step=step)
    first_report = summary.reports[0]
    return {"losses": summary.losses, "cache": summary.compile_cache, "seconds": summary.compile_seconds,
            "first_report": [first_report.compile_seconds, first_report.compile_cache_hit]}

result = {"cold": run(first), "warm": run(first), "off": run("off"), "other": run(second), "back": run(first)}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    result["unmakeable"] = run(blocked)
result["unmakeable"]["warnings"] = [str(w.message) for w in caught if "compiled-step cache" in str(w.message)]
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("xla-cache")
    first, second = folder / "first", folder / "second"
    (folder / "a-file").write_text("not a folder")
    blocked = folder / "a-file" / "cache"
    folders = ", ".join(repr(str(path)) for path in (first, second, blocked))
    script = SCRIPT.replace("sys.argv[1], sys.argv[2], sys.argv[3]", folders)
    result = run_json_script(script, env=XLA_ENV)
    result["first_files"] = sorted(path.name for path in (first / "xla").iterdir())
    result["second_files"] = sorted(path.name for path in (second / "xla").iterdir())
    return result


def test_a_second_build_loads_the_compiled_step_and_trains_exactly_alike(runs):
    assert runs["cold"]["cache"] == "miss" and runs["warm"]["cache"] == "hit"
    assert runs["warm"]["losses"] == runs["cold"]["losses"]
    assert runs["cold"]["first_report"] == [runs["cold"]["seconds"], False]
    assert runs["warm"]["first_report"] == [runs["warm"]["seconds"], True]
    assert all(runs[name]["seconds"] > 0 for name in ("cold", "warm", "off"))
    assert any(name.startswith("jit_step") for name in runs["first_files"])


def test_the_cache_switches_off_and_moves_between_folders_in_one_process(runs):
    assert runs["off"]["cache"] == "off" and runs["off"]["losses"] == runs["cold"]["losses"]
    assert runs["other"]["cache"] == "miss"  # a new folder starts empty: JAX's cache was moved, not kept
    assert any(name.startswith("jit_step") for name in runs["second_files"])
    assert runs["back"]["cache"] == "hit"


def test_a_folder_that_cannot_be_made_warns_and_the_run_trains_without_a_cache(runs):
    unmakeable = runs["unmakeable"]
    assert unmakeable["cache"] == "off" and unmakeable["losses"] == runs["cold"]["losses"]
    assert len(unmakeable["warnings"]) == 1 and "train.compile_cache_dir" in unmakeable["warnings"][0]
