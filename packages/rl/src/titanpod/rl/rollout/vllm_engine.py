"""A rollout engine backed by vLLM's offline ``LLM`` (V1 engine): a CUDA build, or vLLM's CPU build (envs/vllm); vLLM's
TPU build is refused (``check_not_tpu_build``).

How the weights get in: titanpod exports the policy as a Hugging Face folder (config.json + safetensors, in the
engine's dtype) and vLLM starts from it with its own loader. titanpod's worker extension
(``titanpod.rl.rollout.vllm_worker.TitanpodWorkerExtension``, named by ``worker_extension_cls``) is mixed into
every vLLM worker. Each sync, version 0 included, sends the trainer's weights under their Hugging Face names as
raw bytes in the engine's dtype through ``LLM.collective_rpc("titanpod_load_weights", ...)`` (plain data:
vLLM's serializer passes bytes through, and no code is pickled); the worker loads them in place with vLLM's
``reload_weights``, which re-runs each layer's post-load processing (the CPU build repacks every linear weight
for its GEMM kernels). titanpod then asks every worker for ``titanpod_checksum``, computed inside the worker, and
fails unless each equals the checksum of what the trainer sent. vLLM's own weight-transfer backends (NCCL, CUDA
IPC) move tensors between CUDA devices; titanpod's trainer may run on any lane (TPU, CPU), so the weights travel
as CPU tensors instead. A sync groups the tensors by decoder layer: a layer never spans two calls, because
``reload_weights`` processes a layer once all of its weights have arrived in that call.

Differences from ``BuiltinEngine``, stated plainly:
- sampling follows vLLM's seeded sampler: each completion has its own seed from (seed, prompt, sample),
  so completions are reproducible, but they differ from BuiltinEngine's for the same seed;
- ``checksum()`` is ``weights_checksum`` of the Hugging Face-named weights in the engine's dtype (not of
  titanpod's names), computed in the workers (see ``vllm_worker`` for what a worker can read back);
- logprobs are vLLM's raw logprobs of the sampled tokens (``logprobs_mode="raw_logprobs"``: the model's
  log-softmax before temperature and top-p), in the engine's dtype. Unlike ``BuiltinEngine``'s they are not
  the sampling policy's (``logprobs_follow_temperature`` is False), and GRPO's trainer recomputes them at the
  rollout temperature;
- one vLLM engine with one worker (tensor parallel size 1): the checksum reads whole tensors from each worker.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from titanpod.checkpoint import save_hf_checkpoint
from titanpod.models import Transformer
from titanpod.models.adapters import DecoderAdapter
from titanpod.recipes.families import MODEL_SPECS, ModelSpec, model_spec
from titanpod.rl.rollout.builtin import validate_prompts
from titanpod.rl.rollout.sampling import completion_seed
from titanpod.rl.rollout.sync import check_state_matches, check_version, plain_tensor, trainer_state, weights_checksum
from titanpod.rl.rollout.types import Completion, SamplingParams, SyncReport
from titanpod.rl.rollout.wire import tensor_to_bytes

VLLM_MISSING = (
    "rollout.mode 'vllm' needs vLLM, which is not installed. On a machine with a CUDA GPU, install the extra: "
    "`pip install 'titanpod-rl[vllm]'` (or 'titanpod-posttrain[vllm]'); on a CPU machine, run from the "
    "environment in envs/vllm (vLLM's CPU build: `uv sync --locked --project envs/vllm`); elsewhere (a TPU VM "
    "included: vLLM's TPU build cannot take titanpod's weight sync) use rollout.mode 'local' or 'ray'."
)

VLLM_TPU_UNSUPPORTED = (
    "rollout.mode 'vllm' cannot run on vLLM's TPU build (vllm-tpu / tpu-inference): titanpod pushes the trainer's "
    "weights into vLLM's workers with the worker's reload_weights and reads them back from its torch parameters, "
    "and tpu-inference's TPU worker has no reload_weights (0.32.0: its model runner holds the weights as JAX "
    "arrays, updated out of band). On a TPU VM, sample GRPO's rollouts with rollout.mode 'local' (or 'ray'); "
    "rollout.mode 'vllm' runs on a CUDA GPU or on vLLM's CPU build (envs/vllm)."
)

WORKER_EXTENSION = "titanpod.rl.rollout.vllm_worker.TitanpodWorkerExtension"
"""The import path vLLM is given as ``worker_extension_cls``."""

VLLM_DTYPES: Mapping[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}
"""The dtypes a vLLM engine may hold its weights in, by the name vLLM takes."""

SEND_CHUNK_BYTES = 512 * 2**20
"""Most bytes of weights sent in one ``collective_rpc`` call."""


def vllm_adapter(family: str, specs: Mapping[str, ModelSpec] = MODEL_SPECS) -> DecoderAdapter:
    """The Hugging Face form vLLM is given ``family``'s model in, as the family's spec states it; ``ValueError``
    when the spec says vLLM does not serve the family."""
    spec = model_spec(family, specs)
    if not spec.vllm or not isinstance(spec.hf_adapter, DecoderAdapter):
        raise ValueError(f"vLLM does not serve model family {family!r}; use rollout.mode 'local' or 'ray'.")
    return spec.hf_adapter


_LAYER = re.compile(r"^(?P<layer>.*\.layers\.\d+)\.")


def layer_of(name: str) -> str:
    """The decoder layer a Hugging Face tensor name belongs to (``model.layers.3``), or the name itself."""
    match = _LAYER.match(name)
    return name if match is None else match["layer"]


def chunks(named: list[tuple[str, torch.Tensor]], max_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """``named`` in order, in runs of at most ``max_bytes`` that never split a layer's tensors (``layer_of``)
    between two runs; a layer larger than ``max_bytes`` travels alone."""
    groups: list[list[tuple[str, torch.Tensor]]] = []
    for name, tensor in named:
        if groups and layer_of(groups[-1][-1][0]) == layer_of(name):
            groups[-1].append((name, tensor))
        else:
            groups.append([(name, tensor)])
    run: list[tuple[str, torch.Tensor]] = []
    size = 0
    for group in groups:
        nbytes = sum(tensor.numel() * tensor.element_size() for _, tensor in group)
        if run and size + nbytes > max_bytes:
            yield run
            run, size = [], 0
        run.extend(group)
        size += nbytes
    if run:
        yield run


def check_cpu_head_size(head_dim: int) -> None:
    """Refuse, before vLLM starts, a head size that vLLM's CPU build's attention does not take (it takes 32, 64,
    80, 96, ... in 0.32; the llama3 debug flavor's is 16). Nothing is checked where vLLM is not its CPU build."""
    try:
        from vllm.platforms import current_platform
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:  # not vLLM's CPU build, or another layout of it: vLLM itself decides
        return
    supported = list(CPUAttentionBackend.get_supported_head_sizes())
    if current_platform.is_cpu() and head_dim not in supported:
        raise ValueError(
            f"vLLM's CPU build cannot run this model: its attention takes head sizes {supported}, and the model's "
            f"is {head_dim}. Use a flavor whose dim / n_heads (or head_dim) is one of them, or rollout.mode 'local'."
        )


def check_not_tpu_build() -> None:
    """Refuse, before vLLM starts, vLLM's TPU build (``VLLM_TPU_UNSUPPORTED`` says why and what to run instead).
    Nothing is refused where ``vllm.platforms`` cannot be imported (vLLM then decides for itself)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return
    if current_platform.is_tpu():
        raise RuntimeError(VLLM_TPU_UNSUPPORTED)


class VLLMEngine:
    """The ``RolloutEngine`` protocol over one ``vllm.LLM`` in this process, holding ``model``'s weights as version 0.

    ``dtype`` is the weights' dtype in vLLM (a ``VLLM_DTYPES`` name); ``gpu_memory_utilization`` the share of
    the GPU vLLM may take (weights, activations, KV cache); ``kv_cache_bytes`` the KV cache's size, set
    explicitly (vLLM then ignores ``gpu_memory_utilization``; on vLLM's CPU build it also skips the warm-up pass
    that sizes the cache from free memory); ``enforce_eager`` turns off CUDA graphs and compilation;
    ``max_batch`` bounds the sequences decoded together. ``close`` removes the exported folder.
    """

    logprobs_follow_temperature = False
    """Its completions' logprobs are vLLM's raw ones (temperature 1, in the engine's dtype), not those of the
    distribution it sampled from: a trainer recomputes them (an engine without this attribute records them)."""

    def __init__(
        self,
        model: Transformer,
        family: str,
        *,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.5,
        enforce_eager: bool = False,
        max_batch: int = 64,
        kv_cache_bytes: int | None = None,
    ) -> None:
        """Export ``model`` in ``family``'s Hugging Face form, in ``dtype``, start vLLM from that folder and sync
        ``model``'s weights into it as version 0, checked."""
        if dtype not in VLLM_DTYPES:
            raise ValueError(f"VLLMEngine dtype {dtype!r} is not one of {', '.join(VLLM_DTYPES)}.")
        try:
            import vllm
        except ImportError as error:
            raise ImportError(VLLM_MISSING) from error
        check_not_tpu_build()
        self._vllm = vllm
        self.args = model.args
        self.dtype = VLLM_DTYPES[dtype]
        self.weights_version = 0
        self._adapter = vllm_adapter(family)
        self._layout = {name: torch.empty_like(t, device="meta") for name, t in trainer_state(model).items()}
        self._specs = [[name, list(shape)] for name, shape in self._adapter.hf_shapes(self._layout, self.args).items()]
        check_cpu_head_size(self.args.resolved_head_dim)
        self._folder = tempfile.TemporaryDirectory(prefix="titanpod-vllm-")
        self.llm: Any = None
        self.start_seconds = 0.0
        """Wall time of vLLM's start from the exported folder (its engine process, model load, KV cache)."""
        try:
            folder = save_hf_checkpoint(model, self._adapter, Path(self._folder.name) / "hf", dtype=self.dtype)
            memory = {"gpu_memory_utilization": gpu_memory_utilization}
            if kv_cache_bytes is not None:
                memory = {"kv_cache_memory_bytes": kv_cache_bytes}
            start = time.perf_counter()
            self.llm = vllm.LLM(
                model=str(folder),
                skip_tokenizer_init=True,
                dtype=dtype,
                enforce_eager=enforce_eager,
                max_model_len=self.args.max_seq_len,
                max_num_seqs=max_batch,
                logprobs_mode="raw_logprobs",
                worker_extension_cls=WORKER_EXTENSION,
                **memory,
            )
            self.start_seconds = time.perf_counter() - start
            self._send_and_verify(trainer_state(model), version=0)
        except BaseException:
            self.close()
            raise

    def describe(self) -> str:
        """One line naming the engine."""
        return (
            f"vLLM {self._vllm.__version__} ({str(self.dtype).removeprefix('torch.')} weights, "
            f"started in {self.start_seconds:.1f} s)"
        )

    def checksum(self) -> str:
        """``weights_checksum`` of the Hugging Face-named weights the workers hold (``RuntimeError`` if they differ)."""
        checksums = self.llm.collective_rpc("titanpod_checksum", args=(self._specs,))
        if len(set(checksums)) != 1:
            raise RuntimeError(f"vLLM's workers hold different weights: checksums {checksums}.")
        return checksums[0]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """``len(prompts) * params.n`` completions grouped by prompt: one vLLM request per completion, on token ids,
        seeded from (``params.seed``, prompt index, sample index)."""
        validate_prompts(prompts, params, self.args.vocab_size, self.args.max_seq_len, self.args.max_seq_len)
        pairs = [(index, sample) for index in range(len(prompts)) for sample in range(params.n)]
        requests = [{"prompt_token_ids": list(prompts[index])} for index, _ in pairs]
        sampling = [
            self._vllm.SamplingParams(
                n=1,
                temperature=params.temperature,
                top_p=params.top_p,
                max_tokens=params.max_new_tokens,
                stop_token_ids=list(params.stop_token_ids),
                seed=completion_seed(params.seed, index, sample),
                logprobs=0,  # the sampled token's logprob only
                detokenize=False,
            )
            for index, sample in pairs
        ]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        completions = []
        for (index, sample), output in zip(pairs, outputs, strict=True):
            choice = output.outputs[0]
            token_ids = list(choice.token_ids)
            logprobs = [step[token].logprob for step, token in zip(choice.logprobs, token_ids, strict=True)]
            completions.append(
                Completion(
                    prompt_index=index,
                    prompt_ids=list(prompts[index]),
                    token_ids=token_ids,
                    logprobs=torch.tensor(logprobs, dtype=torch.float32),
                    finish_reason="stop" if choice.finish_reason == "stop" else "length",
                    sample_index=sample,
                    weights_version=self.weights_version,
                )
            )
        return completions

    def score(self, sequences: list[list[int]]) -> list[torch.Tensor]:
        """fp32 logprobs vLLM's model gives each token of each sequence after its first (its prompt logprobs at
        temperature 1, in the engine's dtype): a fixed completion scored by the weights the engine holds."""
        validate_prompts(
            sequences, SamplingParams(max_new_tokens=1), self.args.vocab_size, *[self.args.max_seq_len] * 2
        )
        params = self._vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        outputs = self.llm.generate([{"prompt_token_ids": list(s)} for s in sequences], params, use_tqdm=False)
        return [
            torch.tensor(
                [step[token].logprob for step, token in zip(output.prompt_logprobs[1:], sequence[1:], strict=True)],
                dtype=torch.float32,
            )
            for sequence, output in zip(sequences, outputs, strict=True)
        ]

    def load_weights(self, state: Mapping[str, torch.Tensor], version: int) -> SyncReport:
        """Send ``state`` (titanpod names) to every vLLM worker as ``version``; each reports the checksum of the
        weights it then holds, and the sync fails (``RuntimeError``) unless every one equals the sent weights'."""
        check_version(version, self.weights_version)
        check_state_matches(state, self._layout)
        return self._send_and_verify(state, version)

    def _send_and_verify(self, state: Mapping[str, torch.Tensor], version: int) -> SyncReport:
        start = time.perf_counter()
        named = [(name, plain_tensor(tensor).to(self.dtype)) for name, tensor in self._adapter.to_hf(state, self.args)]
        expected = weights_checksum(dict(named))
        for run in chunks(named, SEND_CHUNK_BYTES):
            names, sent = [name for name, _ in run], [tensor_to_bytes(tensor) for _, tensor in run]
            self.llm.collective_rpc("titanpod_load_weights", args=(names, sent))
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        checksums = self.llm.collective_rpc("titanpod_checksum", args=(self._specs,))
        wrong = [f"worker {i}: {c}" for i, c in enumerate(checksums) if c != expected]
        if wrong:
            raise RuntimeError(
                f"vLLM's workers do not hold the trainer's weights at version {version} (sent checksum {expected}): "
                + "; ".join(wrong)
                + ". The vLLM model's weight layout differs from what titanpod reads back; the engine is unusable."
            )
        self.weights_version = version
        return SyncReport(
            version=version,
            checksum=expected,
            bytes=sum(t.numel() * t.element_size() for _, t in named),
            seconds=time.perf_counter() - start,
            extra={
                "workers": len(checksums),
                "dtype": str(self.dtype).removeprefix("torch."),
                "verified": "checksum computed in each vLLM worker from its weights",
            },
        )

    def close(self) -> None:
        """Stop the vLLM engine (its engine-core process) and remove the exported folder."""
        engine_core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if engine_core is not None:  # stopped now, not whenever the LLM object is collected
            engine_core.shutdown()
        self.llm = None
        self._folder.cleanup()

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
