"""The vLLM rollout engine against a recording stand-in of the vLLM calls it makes (vLLM needs a CUDA GPU).

The stand-in (``tests.rl.vllm_standin``) runs titanpod's worker extension on a real torch model laid out
as vLLM lays out weights, so the loading and the checksum read back from the worker are real.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.rl.test_rollout import TINY, TINY_QWEN_MOE, tiny_model
from tests.rl.vllm_standin import StandInLLM, standin_vllm
from titanpod.models.adapters import hf_tensors
from titanpod.recipes.families import hf_adapter
from titanpod.recipes.posttrain.rollout_config import RolloutConfig
from titanpod.rl.rollout import SamplingParams, sync_weights, weights_checksum
from titanpod.rl.rollout.engines import close_rollout, open_rollout
from titanpod.rl.rollout.sampling import completion_seed
from titanpod.rl.rollout.vllm_engine import VLLMEngine, chunks, vllm_adapter
from titanpod.rl.rollout.vllm_worker import read_back
from titanpod.rl.rollout.wire import tensor_from_bytes, tensor_to_bytes

DENSE = dataclasses.replace(TINY, vocab_size=100)  # vLLM pads 100 vocabulary rows to 128
MOE = dataclasses.replace(TINY_QWEN_MOE, vocab_size=100)
EXTENSION = "titanpod.rl.rollout.vllm_worker.TitanpodWorkerExtension"


@pytest.fixture
def vllm(monkeypatch):
    """The stand-in, installed as ``vllm`` for one test."""
    module = standin_vllm()
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


def sent_form(model, dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
    """``model``'s tensors as the engine must send them: Hugging Face names, in the engine's dtype."""
    return {name: tensor.detach().to(dtype) for name, tensor in hf_tensors(model)}


def train_a_little(model) -> None:
    """Move every weight (the head and embeddings included)."""
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.1)


@pytest.mark.parametrize(("family", "args"), [("llama3", DENSE), ("qwen3_moe", MOE)], ids=["llama3", "qwen3_moe"])
def test_start_makes_exactly_these_vllm_calls_and_checks_the_workers_weights(vllm, family, args):
    model = tiny_model(args)
    engine = VLLMEngine(model, family, dtype="bfloat16", gpu_memory_utilization=0.3, enforce_eager=True, max_batch=16)
    llm: StandInLLM = engine.llm
    folder = Path(llm.calls[0][1]["model"])
    assert llm.calls[0] == (
        "LLM",
        {
            "model": str(folder),
            "skip_tokenizer_init": True,
            "dtype": "bfloat16",
            "enforce_eager": True,
            "max_model_len": args.max_seq_len,
            "max_num_seqs": 16,
            "logprobs_mode": "raw_logprobs",
            "worker_extension_cls": EXTENSION,
            "gpu_memory_utilization": 0.3,
        },
    )
    # vLLM started from titanpod's export of the model, in the engine's dtype.
    assert set(llm.started_from) == set(sent_form(model))
    assert all(torch.equal(llm.started_from[name], t) for name, t in sent_form(model).items())
    assert llm.config == hf_adapter(family).hf_config_from_args(args, torch.bfloat16)
    assert llm.methods() == ["LLM", "titanpod_load_weights", "reset_prefix_cache", "titanpod_checksum"]

    expected = sent_form(model)
    _, _, (names, sent), kwargs = llm.calls[1]
    assert kwargs == {} and names == list(expected)
    tensors = [tensor_from_bytes(item) for item in sent]
    assert all(torch.equal(tensor, expected[name]) for name, tensor in zip(names, tensors, strict=True))
    _, _, (specs,), _ = llm.calls[3]
    assert specs == [[name, list(tensor.shape)] for name, tensor in expected.items()]

    # The weights really are in the worker's model, in vLLM's layout, and its checksum is theirs.
    for name, tensor in expected.items():
        assert torch.equal(llm.model.hf_view(name), tensor), name
    assert engine.checksum() == weights_checksum(expected)
    assert engine.weights_version == 0
    engine.close()
    assert not folder.parent.exists()


def test_a_sync_changes_the_workers_weights_and_verifies_them(vllm):
    model = tiny_model(MOE)
    engine = VLLMEngine(model, "qwen3_moe", max_batch=8)
    llm: StandInLLM = engine.llm
    before = {name: llm.model.hf_view(name).clone() for name in sent_form(model)}
    train_a_little(model)
    start = len(llm.calls)

    report = sync_weights(model, engine, version=1)

    expected = sent_form(model)
    assert llm.methods()[start:] == ["titanpod_load_weights", "reset_prefix_cache", "titanpod_checksum"]
    for name, tensor in expected.items():
        assert torch.equal(llm.model.hf_view(name), tensor), name
        assert not torch.equal(llm.model.hf_view(name), before[name]), name
    assert report.checksum == weights_checksum(expected) == engine.checksum()
    assert (report.version, engine.weights_version) == (1, 1)
    assert report.bytes == sum(t.numel() * t.element_size() for t in expected.values())
    assert report.extra["workers"] == 1
    with pytest.raises(ValueError, match="not newer than the engine's version 1"):
        sync_weights(model, engine, version=1)
    engine.close()


def test_a_worker_holding_other_weights_fails_the_sync(vllm, monkeypatch):
    model = tiny_model(DENSE)
    engine = VLLMEngine(model, "llama3")
    worker_model = engine.llm.model
    load = worker_model.load_weights

    def load_then_drift(weights):
        loaded = load(weights)
        with torch.no_grad():
            worker_model.hf_view("model.layers.1.self_attn.v_proj.weight")[-1, 0] += 1
        return loaded

    monkeypatch.setattr(worker_model, "load_weights", load_then_drift)
    train_a_little(model)
    with pytest.raises(RuntimeError, match=r"do not hold the trainer's weights at version 1 \(sent checksum"):
        sync_weights(model, engine, version=1)
    assert engine.weights_version == 0
    engine.close()


def test_generate_sends_one_seeded_request_per_completion_and_reads_the_outputs(vllm):
    engine = VLLMEngine(tiny_model(DENSE), "llama3")
    llm: StandInLLM = engine.llm
    prompts = [[1, 2, 3], [9, 8, 7, 6], [42]]
    params = SamplingParams(max_new_tokens=5, temperature=0.7, top_p=0.9, stop_token_ids=(7,), seed=11, n=2)

    completions = engine.generate(prompts, params)

    kind, requests, sampling, options = llm.calls[-1]
    assert kind == "generate" and options == {"use_tqdm": False}
    pairs = [(i, j) for i in range(3) for j in range(2)]
    assert requests == [{"prompt_token_ids": prompts[i]} for i, _ in pairs]
    assert [s.kwargs for s in sampling] == [
        {
            "n": 1,
            "temperature": 0.7,
            "top_p": 0.9,
            "max_tokens": 5,
            "stop_token_ids": [7],
            "seed": completion_seed(11, i, j),
            "logprobs": 0,
            "detokenize": False,
        }
        for i, j in pairs
    ]
    outputs = llm.generate(requests, sampling)  # the same made-up outputs again, to compare against
    assert [(c.prompt_index, c.sample_index, c.prompt_ids) for c in completions] == [
        (i, j, prompts[i]) for i, j in pairs
    ]
    for completion, output in zip(completions, outputs, strict=True):
        choice = output.outputs[0]
        assert completion.token_ids == choice.token_ids
        expected_logprobs = [step[token].logprob for step, token in zip(choice.logprobs, choice.token_ids, strict=True)]
        assert torch.equal(completion.logprobs, torch.tensor(expected_logprobs, dtype=torch.float32))
        assert completion.finish_reason == choice.finish_reason
        assert completion.weights_version == 0
    assert {c.finish_reason for c in completions} == {"stop", "length"}
    with pytest.raises(ValueError, match="Prompt 0 holds token ids outside the vocabulary"):
        engine.generate([[100]], params)
    engine.close()


def test_read_back_names_a_tensor_the_model_does_not_hold():
    params = {"model.embed_tokens.weight": torch.zeros(128, 4)}
    assert read_back(params, [("model.embed_tokens.weight", (100, 4))])["model.embed_tokens.weight"].shape == (100, 4)
    with pytest.raises(ValueError, match=r"no parameter model\.layers\.0\.self_attn\.qkv_proj\.weight, where .*q_proj"):
        read_back(
            params,
            [("model.layers.0.self_attn.q_proj.weight", (4, 4)), ("model.layers.0.self_attn.k_proj.weight", (4, 4))],
        )
    with pytest.raises(ValueError, match=r"does not fit vLLM's model\.embed_tokens\.weight"):
        read_back(params, [("model.embed_tokens.weight", (100, 8))])


def test_rollout_mode_vllm_parses_and_opens_the_vllm_engine(vllm):
    from titanpod.posttrain.command import parse_command  # the app's own parsing; imported here, as it loads GRPO

    command = parse_command(
        [
            "--recipe",
            "grpo_debug",
            "--rollout.mode",
            "vllm",
            "--rollout.vllm-dtype",
            "float32",
            "--rollout.vllm-gpu-memory-utilization",
            "0.25",
        ]
    )
    assert command.recipe.rollout == RolloutConfig(mode="vllm", vllm_dtype="float32", vllm_gpu_memory_utilization=0.25)
    said = []
    model = tiny_model(DENSE)
    engine = open_rollout(command.recipe.rollout, model, 12, said.append, family="llama3")
    assert isinstance(engine, VLLMEngine)
    options = engine.llm.calls[0][1]
    assert (options["dtype"], options["gpu_memory_utilization"], options["max_num_seqs"]) == ("float32", 0.25, 12)
    assert engine.checksum() == weights_checksum(sent_form(model, torch.float32))
    assert said == ["vLLM stand-in (float32 weights, started in 0.0 s)"]
    folder = Path(options["model"])
    close_rollout(engine)
    assert not folder.exists()


def test_rollout_mode_vllm_without_vllm_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError, installed or not
    with pytest.raises(
        ImportError, match=r"needs vLLM, which is not installed.*CUDA GPU.*pip install 'titanpod-rl\[vllm\]'"
    ):
        open_rollout(RolloutConfig(mode="vllm"), tiny_model(), 4, print, family="llama3")


def test_rollout_config_names_bad_vllm_settings():
    with pytest.raises(ValueError, match=r"rollout\.vllm_dtype must be one of bfloat16, float16, float32"):
        RolloutConfig(mode="vllm", vllm_dtype="int8")
    with pytest.raises(ValueError, match=r"vllm_gpu_memory_utilization must lie in \(0, 1\], got 1.5"):
        RolloutConfig(mode="vllm", vllm_gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match=r"rollout\.vllm_enforce_eager applies to rollout\.mode 'vllm'.*'local'"):
        RolloutConfig(vllm_enforce_eager=True)
    with pytest.raises(ValueError, match=r"rollout\.mode is 'vllm' \(one engine\)"):
        RolloutConfig(mode="vllm", workers=2)
    with pytest.raises(ValueError, match=r"rollout\.vllm_kv_cache_mib must be at least 1 \(MiB\), got 0"):
        RolloutConfig(mode="vllm", vllm_kv_cache_mib=0)


def test_a_set_kv_cache_size_replaces_the_gpu_share(vllm):
    engine = open_rollout(RolloutConfig(mode="vllm", vllm_kv_cache_mib=8), tiny_model(DENSE), 4, print, family="llama3")
    options = engine.llm.calls[0][1]
    assert options["kv_cache_memory_bytes"] == 8 * 2**20 and "gpu_memory_utilization" not in options
    close_rollout(engine)


def test_a_sync_never_splits_a_layer_between_two_calls():
    named = [(name, torch.zeros(4)) for name in ["model.embed_tokens.weight", "model.layers.0.a", "model.layers.0.b"]]
    named += [
        ("model.layers.1.a", torch.zeros(4)),
        ("model.layers.1.b", torch.zeros(4)),
        ("lm_head.weight", torch.zeros(4)),
    ]
    runs = [[name for name, _ in run] for run in chunks(named, max_bytes=20)]
    assert runs == [
        ["model.embed_tokens.weight"],
        ["model.layers.0.a", "model.layers.0.b"],
        ["model.layers.1.a", "model.layers.1.b"],
        ["lm_head.weight"],
    ]
    assert [len(run) for run in chunks(named, max_bytes=2**20)] == [6]


def test_weights_packed_for_vllms_cpu_kernels_are_checked_as_the_worker_received_them(vllm, monkeypatch):
    """vLLM's CPU build leaves an empty parameter where it packed a linear weight; the checksum then takes the
    tensors the worker received, and still fails when those are not the trainer's."""
    model = tiny_model(DENSE)
    engine = VLLMEngine(model, "llama3")
    worker = engine.llm.worker
    reload = type(worker).reload_weights
    fused = {
        name: (param, param.shape)
        for name, param in worker.model_runner.model.named_parameters()
        if name.endswith(("qkv_proj.weight", "gate_up_proj.weight"))
    }

    def reload_then_pack(self, weights_iterator):  # as vLLM does: the layout back, load, then pack
        for param, shape in fused.values():
            param.data = torch.zeros(shape, dtype=param.dtype)
        reload(self, weights_iterator)
        for param, _ in fused.values():
            param.data = torch.empty(0, dtype=param.dtype)

    monkeypatch.setattr(type(worker), "reload_weights", reload_then_pack)
    train_a_little(model)
    report = sync_weights(model, engine, version=1)
    assert report.checksum == weights_checksum(sent_form(model)) == engine.checksum()
    assert "model.layers.0.self_attn.q_proj.weight" in worker._titanpod_received
    assert "model.layers.0.self_attn.o_proj.weight" not in worker._titanpod_received  # readable: read back

    monkeypatch.setattr("titanpod.rl.rollout.vllm_engine.tensor_to_bytes", lambda t: tensor_to_bytes(t * 2))
    train_a_little(model)
    with pytest.raises(RuntimeError, match="do not hold the trainer's weights at version 2"):
        sync_weights(model, engine, version=2)
    engine.close()


def test_the_vllm_form_of_each_family_is_its_specs():
    assert [vllm_adapter(family).form.architecture for family in ("llama3", "qwen3", "qwen3_moe")] == [
        "LlamaForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
    ]
    assert all(vllm_adapter(family) is hf_adapter(family) for family in ("llama3", "qwen3", "qwen3_moe"))
    with pytest.raises(ValueError, match=r"vLLM does not serve model family 'flux'"):
        vllm_adapter("flux")


def test_a_vllm_without_in_place_reloading_is_named(vllm, monkeypatch):
    build = StandInLLM.__init__

    def older_runner(self, model, **kwargs):  # an older vLLM: reload_weights() only reads the folder again
        build(self, model, **kwargs)
        self.worker.model_runner.reload_weights = lambda: None

    monkeypatch.setattr(StandInLLM, "__init__", older_runner)
    with pytest.raises(RuntimeError, match=r"cannot load weights in place.*upgrade vLLM"):
        VLLMEngine(tiny_model(DENSE), "llama3")


def test_vllms_tpu_build_is_refused_before_vllm_starts(vllm, monkeypatch):
    built = []
    monkeypatch.setattr(StandInLLM, "__init__", lambda self, *args, **kwargs: built.append(kwargs))
    tpu = SimpleNamespace(is_tpu=lambda: True, is_cpu=lambda: False)  # what vllm-tpu's current_platform answers
    monkeypatch.setitem(sys.modules, "vllm.platforms", SimpleNamespace(current_platform=tpu))
    with pytest.raises(RuntimeError, match=r"TPU build.*no reload_weights.*rollout\.mode 'local' \(or 'ray'\)"):
        VLLMEngine(tiny_model(DENSE), "llama3")
    assert built == []
