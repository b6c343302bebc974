"""The compiled-step cache: a second run of the same step loads what the first compiled, and trains the same.

Both runs execute the same compiled code, so their losses and parameters must be equal exactly;
a run without the cache compiles the same graph afresh and must agree exactly as well.
"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from titanpod.device import get_backend
from titanpod.graph import TrainConfig, train
from titanpod.graph.constant_folding import fold_constants
from titanpod.graph.cpu_compile import compiled_steps
from titanpod.graph.cpu_compile.compiled_steps import step_key
from titanpod.graph.step_compiler import cache_dir_of
from titanpod.models import DecoderArgs, Transformer

TINY = DecoderArgs(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=64, ffn_dim=64, max_seq_len=32)
BACKEND = get_backend("cpu")


def run(cache: str, batch: int = 2):
    model = Transformer(TINY)
    model.init_weights(0)
    config = TrainConfig(
        steps=3, warmup_steps=0, log_every=1, step_mode="whole_step", step_compiler="cached", compile_cache_dir=cache
    )
    generator = torch.Generator().manual_seed(0)

    def batches():
        while True:
            tokens = torch.randint(0, 64, (batch, 17), generator=generator)
            yield tokens[:, :-1], tokens[:, 1:]

    summary = train(model, batches(), config, BACKEND, flops_per_token=1.0)
    return model, summary


def test_second_run_loads_the_first_runs_artifact_and_trains_the_same(tmp_path):
    first_model, first = run(str(tmp_path))
    assert first.compile_cache == "miss" and first.compile_seconds is not None
    artifacts = sorted(tmp_path.glob("*.bin"))
    assert len(artifacts) == 1
    second_model, second = run(str(tmp_path))
    assert second.compile_cache == "hit"
    assert sorted(tmp_path.glob("*.bin")) == artifacts
    assert second.losses == first.losses
    for a, b in zip(first_model.parameters(), second_model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert first.reports[0].compile_cache_hit is False and second.reports[0].compile_cache_hit is True
    assert all(report.compile_seconds is None for report in second.reports[1:])


def test_another_batch_shape_is_another_artifact_and_off_keeps_none(tmp_path):
    run(str(tmp_path), batch=2)
    _, other = run(str(tmp_path), batch=3)
    assert other.compile_cache == "miss"
    assert len(list(tmp_path.glob("*.bin"))) == 2
    _, uncached = run("off")
    assert uncached.compile_cache == "off"
    _, reference = run(str(tmp_path))
    assert uncached.losses == reference.losses


def test_cache_folder_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir_of("default") == tmp_path / "titanpod" / "compiled-steps"
    assert cache_dir_of("off") is None
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir_of("~/steps") == tmp_path / "home" / "steps"


@pytest.mark.parametrize("mode", ["eager", "per_block"])
def test_steps_that_compile_no_whole_program_report_no_compile(mode):
    model = Transformer(TINY)
    model.init_weights(0)
    config = TrainConfig(steps=1, warmup_steps=0, step_mode=mode)
    tokens = torch.randint(0, 64, (2, 17))
    summary = train(model, iter([(tokens[:, :-1], tokens[:, 1:])]), config, BACKEND, flops_per_token=1.0)
    assert summary.compile_seconds is None and "compile_seconds" not in summary.reports[0].logged()


def test_a_cache_folder_that_cannot_be_written_warns_and_trains_on(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.warns(UserWarning, match="could not be saved"):
        _, summary = run(str(blocker / "cache"))
    assert summary.compile_cache == "off"  # compiled and kept nowhere: the summary must not say cached
    _, uncached = run("off")
    assert summary.losses == uncached.losses


def test_the_key_covers_the_vector_instructions_and_the_values_of_the_graphs_constants(monkeypatch):
    graph = make_fx(lambda x: x * torch.arange(4.0).cos())(torch.ones(4))
    fold_constants(graph)
    inputs = [torch.ones(4)]
    key = step_key(graph, inputs)
    assert step_key(graph, inputs) == key
    other = "avx512" if compiled_steps._vector_isa() == "avx2" else "avx2"  # whatever this machine's is
    monkeypatch.setattr(compiled_steps, "_vector_isa", lambda: other)
    assert step_key(graph, inputs) != key
    monkeypatch.undo()
    constant = next(name for name, _ in graph.named_buffers())
    getattr(graph, constant).add_(1.0)  # another value of the same shape is another artifact
    assert step_key(graph, inputs) != key
    key = step_key(graph, inputs)
    assert step_key(graph, inputs, options={}) != key  # compiled with other inductor settings: another artifact


def _residual_stack(inputs):
    """Layers that each normalise the residual stream and add a matmul of it back (a decoder's skeleton)."""
    h_BSD, *weights = inputs
    for w in weights:
        normed_BSD = h_BSD * torch.rsqrt(h_BSD.pow(2).mean(-1, keepdim=True) + 1e-5)
        h_BSD = h_BSD + (normed_BSD.view(-1, h_BSD.shape[-1]) @ w).view(h_BSD.shape)
    return [h_BSD]


def test_cpu_steps_store_the_residual_stream_once_so_layers_share_their_kernels(monkeypatch):
    from torch._inductor.utils import run_and_get_code

    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(32, 32, generator=generator) / 8 for _ in range(8)]
    inputs = ([torch.randn(2, 8, 32, generator=generator), *weights],)
    graph = make_fx(_residual_stack)(*inputs)
    expected = _residual_stack(*inputs)[0]

    def kernels_and_output(options):
        monkeypatch.setattr(compiled_steps, "CPU_OPTIONS", options)
        (output,), (code,) = run_and_get_code(lambda: compiled_steps.compile_step(graph, inputs, None)[0](*inputs))
        return code.count("= async_compile.cpp_pybinding"), output

    ours, output = kernels_and_output(compiled_steps.CPU_OPTIONS)
    defaults, default_output = kernels_and_output({})
    assert ours < defaults  # inductor's defaults re-sum earlier layers' outputs in each norm: a kernel per depth
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(default_output, expected, rtol=1e-5, atol=1e-5)
