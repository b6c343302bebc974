"""The step compiler behind ``train.step_compiler``: the lane's own ``torch.compile`` by default, titanpod's cached
compile as an opt-in module that refuses a torch release it was not checked against.

The two compile the same captured graph with different inductor settings (the cached one stores the residual
stream once per layer), so fp32 losses agree to rounding, not bit for bit: within 1e-5 relative over 3 steps.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import run_json_script
from titanpod.device import get_backend
from titanpod.graph import TrainConfig, WholeStep, train
from titanpod.graph.cpu_compile import CHECKED_TORCH_RELEASES, check_torch_release
from titanpod.graph.cpu_compile import torch_release as torch_release_module
from titanpod.graph.step_compiler import BackendStepCompiler
from titanpod.models import DecoderArgs, Transformer

TINY = DecoderArgs(dim=32, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=64, ffn_dim=64, max_seq_len=32)
BACKEND = get_backend("cpu")


def model() -> Transformer:
    built = Transformer(TINY)
    built.init_weights(0)
    return built


def run(tmp_path, **changes):
    trained = model()
    config = TrainConfig(
        steps=3, warmup_steps=0, log_every=1, step_mode="whole_step", compile_cache_dir=str(tmp_path), **changes
    )
    generator = torch.Generator().manual_seed(0)

    def batches():
        while True:
            tokens = torch.randint(0, 64, (2, 17), generator=generator)
            yield tokens[:, :-1], tokens[:, 1:]

    return trained, train(trained, batches(), config, BACKEND, flops_per_token=1.0)


def test_the_default_is_the_lanes_torch_compile_and_trains_like_the_cached_compile(tmp_path):
    assert TrainConfig().step_compiler == "inductor"
    step = WholeStep(model(), TrainConfig(step_mode="whole_step"), BACKEND)
    assert isinstance(step._compiler, BackendStepCompiler)
    plain_model, plain = run(tmp_path)
    cached_model, cached = run(tmp_path, step_compiler="cached")
    assert plain.compile_seconds is None and "compile_seconds" not in plain.reports[0].logged()
    assert cached.compile_cache == "miss" and len(list(tmp_path.glob("*.shortcut.json"))) == 1
    assert plain.losses == pytest.approx(cached.losses, rel=1e-5)
    for a, b in zip(plain_model.parameters(), cached_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_without_a_compiler_the_captured_graph_runs_as_it_is():
    step = WholeStep(model(), TrainConfig(step_mode="whole_step", compiler="none"), BACKEND)
    assert step._compiler is None
    tokens = torch.randint(0, 64, (2, 17))
    step([(tokens[:, :-1], tokens[:, 1:])], 1e-3)
    assert step.compile_report is None and step._program is step.graph


def test_the_cached_compile_refuses_a_torch_release_it_was_not_checked_against(monkeypatch):
    check_torch_release()  # this environment's torch is one of them
    assert ".".join(torch.__version__.split(".")[:2]) in CHECKED_TORCH_RELEASES
    with pytest.raises(RuntimeError, match=r"torch 2\.99\.0.*Set train\.step_compiler to 'inductor'"):
        check_torch_release("2.99.0+cpu")
    monkeypatch.setattr(torch_release_module.torch, "__version__", "2.99.0")
    with pytest.raises(RuntimeError, match="step_compiler"):  # when the step is built, before any capture
        WholeStep(model(), TrainConfig(step_mode="whole_step", step_compiler="cached"), BACKEND)
    assert isinstance(
        WholeStep(model(), TrainConfig(step_mode="whole_step"), BACKEND)._compiler, BackendStepCompiler
    )  # the default does not care


def test_an_unknown_step_compiler_is_named():
    with pytest.raises(ValueError, match=r"train\.step_compiler must be one of inductor, cached; got 'fast'"):
        TrainConfig(step_compiler="fast")  # type: ignore[arg-type]


def test_the_default_never_imports_the_cached_compile():
    script = """
import json, sys
import torch
from titanpod.device import get_backend
from titanpod.graph import TrainConfig, WholeStep
from titanpod.models import DecoderArgs, Transformer
model = Transformer(DecoderArgs(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=64, ffn_dim=64, max_seq_len=32))
model.init_weights(0)
step = WholeStep(model, TrainConfig(step_mode="whole_step"), get_backend("cpu"))
print(json.dumps({"loaded": sorted(name for name in sys.modules if name.startswith("titanpod.graph.cpu_compile"))}))
"""
    assert run_json_script(script)["loaded"] == []
