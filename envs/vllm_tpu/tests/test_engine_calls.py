"""titanpod's calls to start vLLM, sample from it and read its outputs, checked against the installed vLLM TPU build.

The calls are read from titanpod's source (``titanpod_calls``); nothing here starts an engine (no TPU).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import typing

import pytest
from titanpod_calls import UNKNOWN, Call, engine_calls

CALLS = engine_calls()

SAMPLES = {
    "model": "/tmp/titanpod-hf-export",
    "dtype": "bfloat16",
    "enforce_eager": True,
    "gpu_memory_utilization": 0.5,
    "kv_cache_memory_bytes": 64 * 2**20,
    "max_model_len": 256,
    "max_num_seqs": 16,
    "max_tokens": 8,
    "seed": 1234,
    "stop_token_ids": [2],
    "temperature": 0.7,
    "top_p": 0.9,
}
"""A value for each keyword titanpod passes as a variable (its constants are taken from its source)."""


def values(call: Call) -> dict[str, object]:
    """``call``'s keywords with titanpod's constants, and ``SAMPLES`` for those it passes as variables."""
    missing = [name for name, value in call.keywords.items() if value is UNKNOWN and name not in SAMPLES]
    assert not missing, f"titanpod passes {missing} (line {call.line}) as variables: add sample values to SAMPLES"
    return {name: SAMPLES[name] if value is UNKNOWN else value for name, value in call.keywords.items()}


def test_the_reader_finds_the_calls_titanpod_makes():
    assert len(CALLS.llm) == 1 and "worker_extension_cls" in CALLS.llm[0].keywords
    assert len(CALLS.sampling) >= 2
    assert {"collective_rpc", "generate", "reset_prefix_cache"} <= set(CALLS.llm_methods)
    assert CALLS.dtypes and CALLS.vllm_imports


def test_the_llm_constructor_takes_every_keyword_titanpod_passes(vllm):
    from vllm.engine.arg_utils import EngineArgs

    own = set(inspect.signature(vllm.LLM.__init__).parameters) - {"self", "kwargs"}
    fields = {f.name for f in dataclasses.fields(EngineArgs)}  # LLM hands **kwargs to EngineArgs
    for call in CALLS.llm:
        unknown = [name for name in call.keywords if name not in own | fields]
        assert not unknown, f"vllm.LLM (line {call.line}) takes no {unknown} in vllm-tpu {vllm.__version__}"
        args = EngineArgs(**values(call))
        for name, value in values(call).items():
            assert getattr(args, name) == value, name


def test_titanpods_constant_engine_settings_are_ones_vllm_takes(vllm):
    from vllm.config.model import LogprobsMode, ModelDType
    from vllm.config.parallel import ParallelConfig

    (call,) = CALLS.llm
    assert call.keywords["logprobs_mode"] in typing.get_args(LogprobsMode)
    assert set(CALLS.dtypes) <= set(typing.get_args(ModelDType))
    assert isinstance(call.keywords["worker_extension_cls"], str)  # a qualified name, resolved in the worker
    assert "worker_extension_cls" in {f.name for f in dataclasses.fields(ParallelConfig)}


def test_sampling_params_take_titanpods_fields(vllm):
    for call in CALLS.sampling:
        params = vllm.SamplingParams(**values(call))
        for name, value in values(call).items():
            assert getattr(params, name) == value, f"SamplingParams.{name} (line {call.line})"


def test_the_llm_methods_titanpod_calls_take_its_arguments(vllm):
    for method, calls in CALLS.llm_methods.items():
        assert hasattr(vllm.LLM, method), f"vllm.LLM has no {method} in vllm-tpu {vllm.__version__}"
        signature = inspect.signature(getattr(vllm.LLM, method))
        for call in calls:
            signature.bind(None, *call.positional, **{name: None for name in call.keywords})
    rpc = inspect.signature(vllm.LLM.collective_rpc).parameters
    assert list(rpc)[1] == "method" and "args" in rpc  # collective_rpc("titanpod_...", args=(...))


def test_vllms_outputs_hold_what_titanpod_reads(vllm):
    from vllm.logprobs import Logprob
    from vllm.outputs import CompletionOutput, RequestOutput

    held = {
        "request_output": set(inspect.signature(RequestOutput.__init__).parameters),
        "completion_output": {f.name for f in dataclasses.fields(CompletionOutput)},
        "logprob": {f.name for f in dataclasses.fields(Logprob)},
    }
    for kind, names in CALLS.output_reads.items():
        assert names and names <= held[kind], f"{kind} lacks {sorted(names - held[kind])}"


def test_the_names_titanpod_imports_from_vllm_exist(vllm):
    for module, name in CALLS.vllm_imports:
        assert hasattr(importlib.import_module(module), name), f"{module}.{name}"


@pytest.mark.parametrize("method", sorted(CALLS.platform_methods))
def test_the_platform_answers_titanpods_questions(vllm, method):
    from vllm.platforms import current_platform

    assert isinstance(getattr(current_platform, method)(), bool)
