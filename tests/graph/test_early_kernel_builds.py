"""C++ kernels start building while inductor is still generating code, and each is built once.

Shape suffixes: B batch, S sequence, D model dim.
"""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from titanpod.graph.cpu_compile.compiled_steps import compile_step


def _layers(inputs):
    """A residual stream, normalised and fed through a matmul per layer: kernels on either side of each matmul."""
    h_BSD, *weights = inputs
    for w in weights:
        normed_BSD = h_BSD * torch.rsqrt(h_BSD.pow(2).mean(-1, keepdim=True) + 1e-5)
        h_BSD = h_BSD + torch.nn.functional.silu((normed_BSD.view(-1, h_BSD.shape[-1]) @ w).view(h_BSD.shape))
    return [h_BSD.sum()]


def test_kernels_are_submitted_as_they_are_generated_and_built_once(monkeypatch):
    from torch._inductor import config
    from torch._inductor.async_compile import AsyncCompile
    from torch._inductor.graph import GraphLowering
    from torch._inductor.utils import fresh_cache, run_and_get_code

    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(24, 24, generator=generator) / 5 for _ in range(3)]
    inputs = ([torch.randn(2, 4, 24, generator=generator), *weights],)
    graph = make_fx(_layers)(*inputs)

    submitted: list[bool] = []  # per build handed to the workers: whether code generation was still going on
    generating = [False]
    submit, codegen = AsyncCompile.submit.__func__, GraphLowering.codegen

    def recording_submit(cls, task):
        submitted.append(generating[0])
        return submit(cls, task)

    def recording_codegen(self, *args, **kwargs):
        generating[0] = True
        try:
            return codegen(self, *args, **kwargs)
        finally:
            generating[0] = False

    monkeypatch.setattr(AsyncCompile, "submit", classmethod(recording_submit))
    monkeypatch.setattr(GraphLowering, "codegen", recording_codegen)
    with config.patch({"compile_threads": 2}), fresh_cache():
        (loss,), (code,) = run_and_get_code(lambda: compile_step(graph, inputs, None)[0](*inputs))
    kernels = code.count("= async_compile.cpp_pybinding")
    assert kernels >= 2
    assert submitted == [True] * kernels  # every kernel during generation, none a second time at load
    torch.testing.assert_close(loss, _layers(*inputs)[0], rtol=1e-5, atol=1e-5)


def test_overlapping_blocks_leave_inductor_as_they_found_it():
    from torch._inductor import config
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen

    from titanpod.graph.cpu_compile.early_kernel_builds import kernels_built_as_generated

    original = PythonWrapperCodegen.define_kernel
    with config.patch({"compile_threads": 2}):
        first, second = kernels_built_as_generated(), kernels_built_as_generated()
        first.__enter__()  # two compiles in two threads: the first to start ends first
        assert PythonWrapperCodegen.define_kernel is not original
        second.__enter__()
        first.__exit__(None, None, None)
        second.__exit__(None, None, None)
    assert PythonWrapperCodegen.define_kernel is original
