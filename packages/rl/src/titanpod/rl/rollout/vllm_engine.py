"""A rollout engine backed by vLLM's offline ``LLM`` API, for GPU machines that have vLLM installed.

NOT RUN in titanpod's tests or CI: vLLM is not a titanpod dependency and needs a CUDA GPU.
The adapter is written against vLLM's public offline API (``vllm.LLM``, ``vllm.SamplingParams``,
token-id prompts, ``LLM.apply_model``) and should be checked on a vLLM machine before use.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from titanpod.models import DecoderArgs, Transformer
from titanpod.models.hf import hf_name_to_slot, hf_tensors
from titanpod.rl.rollout.builtin import validate_prompts
from titanpod.rl.rollout.sync import check_state_matches, check_version, state_bytes, weights_checksum
from titanpod.rl.rollout.types import Completion, SamplingParams, SyncReport

VLLM_MISSING = (
    "VLLMEngine needs vLLM, which is not installed (titanpod does not depend on it). Install it on a CUDA "
    "machine (`uv pip install vllm`, matching your torch), or use BuiltinEngine, which needs nothing extra."
)


def hf_named(state: Mapping[str, torch.Tensor], args: DecoderArgs) -> Iterator[tuple[str, torch.Tensor]]:
    """``state`` (titanpod names) as Hugging Face-named tensors, experts one by one (views, no copies)."""
    with torch.device("meta"):
        layout = Transformer(args)
    for hf_name, _ in hf_tensors(layout):
        slot = hf_name_to_slot(hf_name)
        assert slot is not None, hf_name  # hf_tensors only yields names hf_name_to_slot knows
        tensor = state[slot.name]
        yield hf_name, tensor if slot.expert is None else tensor[slot.expert]


class VLLMEngine:
    """The ``RolloutEngine`` protocol over ``vllm.LLM`` (one engine in this process).

    ``model`` is what ``vllm.LLM`` loads first (a Hugging Face directory, e.g. one written by
    titanpod.checkpoint's export); ``args`` is the titanpod shape of that model, used to
    rename synced weights to Hugging Face names. Other keyword arguments go to ``vllm.LLM``.

    Differences from ``BuiltinEngine``, stated plainly:
    - not run here: no test or CI job in titanpod exercises it;
    - sampling follows vLLM's own seeded sampler, so completions differ from BuiltinEngine's
      for the same seed (each is reproducible on its own);
    - ``checksum()`` is the checksum of the weights last sent to vLLM, verified on this side
      only (the titanpod -> Hugging Face renaming covers every tensor exactly once); the
      weights are not read back from vLLM's workers, whose fused layout differs;
    - logprobs are what vLLM reports for the sampled token (raw model logprobs in current
      vLLM; check ``logprobs_mode`` on older versions).
    """

    def __init__(self, model: str, args: DecoderArgs, *, weights_version: int = 0, **llm_kwargs: Any) -> None:
        try:
            import vllm
        except ImportError as error:
            raise ImportError(VLLM_MISSING) from error
        self._vllm = vllm
        self.args = args
        self.weights_version = weights_version
        self._checksum: str | None = None
        self.llm = vllm.LLM(model=model, **llm_kwargs)

    def checksum(self) -> str:
        """Checksum of the weights last loaded through ``load_weights``."""
        if self._checksum is None:
            raise RuntimeError(
                "VLLMEngine has no checksum yet: it holds the weights vLLM loaded from disk; call load_weights first."
            )
        return self._checksum

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """``len(prompts) * params.n`` completions grouped by prompt, through ``LLM.generate`` on token ids."""
        validate_prompts(prompts, params, self.args.vocab_size, self.args.max_seq_len, self.args.max_seq_len)
        sampling = self._vllm.SamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            stop_token_ids=list(params.stop_token_ids),
            seed=params.seed,
            logprobs=0,  # the sampled token's logprob only
        )
        requests = [{"prompt_token_ids": list(prompt)} for prompt in prompts]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        completions = []
        for index, output in enumerate(outputs):
            for sample, choice in enumerate(output.outputs):
                token_ids = list(choice.token_ids)
                logprobs = [step[token].logprob for step, token in zip(choice.logprobs or [], token_ids, strict=True)]
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

    def load_weights(self, state: Mapping[str, torch.Tensor], version: int) -> SyncReport:
        """Rename ``state`` to Hugging Face names and hand it to the vLLM model's ``load_weights``.

        Checks the version and the key accounting first; drops vLLM's prefix cache afterwards
        (it holds keys computed with the old weights).
        """
        check_version(version, self.weights_version)
        with torch.device("meta"):
            expected_layout = Transformer(self.args).state_dict()
        check_state_matches(state, expected_layout)
        start = time.perf_counter()
        checksum = weights_checksum(state)
        weights = list(hf_named(state, self.args))
        covered = {hf_name_to_slot(name) for name, _ in weights}
        if len(covered) != len(weights):
            raise RuntimeError("Renaming to Hugging Face names produced duplicate tensors; nothing was sent.")

        def load(model: torch.nn.Module) -> None:
            model.load_weights(weights=weights)  # type: ignore[operator]

        if hasattr(self.llm, "apply_model"):
            self.llm.apply_model(load)
        else:  # older vLLM: the in-process worker's model runner
            load(self.llm.llm_engine.model_executor.driver_worker.model_runner.model)
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()
        self._checksum = checksum
        self.weights_version = version
        return SyncReport(
            version=version,
            checksum=checksum,
            bytes=state_bytes(state),
            seconds=time.perf_counter() - start,
            extra={"verified": "trainer-side only (weights are not read back from vLLM workers)"},
        )
