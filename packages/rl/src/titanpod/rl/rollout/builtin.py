"""The built-in rollout engine: batched sampling with titanpod's own ``Transformer`` and its KV cache.

Legend: B rows (completions in one batch), S prompt positions (padded), V vocabulary, M model dim.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

import torch
import torch.nn.functional as F

from titanpod.models import DecoderArgs, ModelOps, Transformer
from titanpod.models.common.kv_cache import KVCache
from titanpod.rl.rollout.sampling import choose_tokens, completion_generator, sampled_logprobs
from titanpod.rl.rollout.sync import (
    ChecksumStream,
    check_state_matches,
    check_version,
    differing_elements,
    state_bytes,
    weights_checksum,
)
from titanpod.rl.rollout.types import Completion, FinishReason, SamplingParams, SyncReport


def validate_prompts(
    prompts: list[list[int]], params: SamplingParams, vocab_size: int, max_context: int, max_seq_len: int
) -> None:
    """Raise ``ValueError`` for an empty list, an empty prompt, a token outside the vocabulary, or a prompt
    too long for the model's context or for ``max_seq_len - params.max_new_tokens``; the prompt is named."""
    if not prompts:
        raise ValueError("generate() got no prompts: pass a non-empty list of token-id lists.")
    budget = max_seq_len - params.max_new_tokens
    for index, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"Prompt {index} is empty: every prompt needs at least one token (e.g. BOS).")
        bad = [t for t in prompt if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"Prompt {index} holds token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}.")
        if len(prompt) > max_context:
            raise ValueError(
                f"Prompt {index} has {len(prompt)} tokens, more than the model's max context of {max_context}."
            )
        if len(prompt) > budget:
            raise ValueError(
                f"Prompt {index} has {len(prompt)} tokens, but with max_new_tokens={params.max_new_tokens} "
                f"at most {max_seq_len} - {params.max_new_tokens} = {budget} fit the engine's max_seq_len of "
                f"{max_seq_len}: shorten the prompt or lower max_new_tokens."
            )


class BuiltinEngine:
    """Samples completions with its own copy of a titanpod ``Transformer``, batched, with a KV cache.

    Prompts of different lengths share a batch right-padded: the batch is prefilled from
    position 0, then each row's cache length is set to its own prompt length, so row b's
    first generated token sits at position ``len(prompt_b)`` and nothing attends to the
    padding (see ``titanpod.models.common.kv_cache``). Rows are completions: prompt i's n
    completions are n rows, ``max_batch`` rows at a time.

    The engine holds its own weights, as a separate inference engine would: the trainer's
    model is copied at construction (version ``weights_version``) and changes reach the
    engine only through ``load_weights`` / ``sync_weights``.
    """

    def __init__(
        self,
        model: Transformer,
        device: torch.device | str | None = None,
        max_batch: int = 64,
        *,
        max_seq_len: int | None = None,
        weights_version: int = 0,
    ) -> None:
        """Copy ``model`` onto ``device`` (default: where its embeddings are).

        ``max_batch`` bounds the rows decoded together; ``max_seq_len`` (prompt + generated
        tokens, at most the model's ``args.max_seq_len``, which is the default) bounds the cache.
        """
        source = {name: t.detach() for name, t in model.state_dict().items()}
        where = torch.device(device) if device is not None else model.tok_embeddings.weight.device
        self._build(model.args, model.ops, source, where, max_batch, max_seq_len, weights_version)

    @classmethod
    def from_state(
        cls,
        args: DecoderArgs,
        state: Mapping[str, torch.Tensor],
        device: torch.device | str = "cpu",
        max_batch: int = 64,
        *,
        max_seq_len: int | None = None,
        weights_version: int = 0,
    ) -> BuiltinEngine:
        """An engine for a model of shape ``args`` holding ``state`` (titanpod names, each tensor's dtype kept),
        with the default slot ops: how a worker process that received only the weights builds its engine."""
        engine = cls.__new__(cls)
        engine._build(args, None, state, torch.device(device), max_batch, max_seq_len, weights_version)
        return engine

    @classmethod
    def empty(
        cls,
        args: DecoderArgs,
        dtype: torch.dtype,
        device: torch.device | str,
        max_batch: int = 64,
        *,
        ops: ModelOps | None = None,
        max_seq_len: int | None = None,
    ) -> BuiltinEngine:
        """An engine for a model of shape ``args`` whose weights (and KV cache) are ``dtype`` and not yet loaded:
        it refuses to generate until a sync (``load_stream``, as version 0 or later) fills it. How a trainer whose
        policy is sharded builds its engine without ever holding the policy whole in fp32."""
        engine = cls.__new__(cls)
        engine._build(args, ops, None, torch.device(device), max_batch, max_seq_len, -1, dtype)
        return engine

    def _build(
        self,
        args: DecoderArgs,
        ops: ModelOps | None,
        source: Mapping[str, torch.Tensor] | None,
        device: torch.device,
        max_batch: int,
        max_seq_len: int | None,
        weights_version: int,
        dtype: torch.dtype | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}.")
        self.max_seq_len = args.max_seq_len if max_seq_len is None else max_seq_len
        if not 1 <= self.max_seq_len <= args.max_seq_len:
            raise ValueError(
                f"max_seq_len must lie in [1, {args.max_seq_len}] (the model's max context), got {self.max_seq_len}."
            )
        self.device = device
        self.max_batch = max_batch
        self.weights_version = weights_version
        self._verified = True
        with torch.device("meta"):
            self.model = Transformer(args, ops)
        if dtype is not None:
            self.model.to(dtype)
        self.model.to_empty(device=self.device)
        for name, param in self.model.named_parameters():  # keep the source's dtype per tensor
            if source is not None and name in source and param.dtype != source[name].dtype:
                param.data = torch.empty_like(param, dtype=source[name].dtype)
        self.model.requires_grad_(False).eval()
        if source is None:
            self._verified = False
            return
        check_state_matches(source, self.model.state_dict())
        self._copy_in(source)

    # weights

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the engine holds its weights (and its KV cache) in: its embeddings'."""
        return self.model.tok_embeddings.weight.dtype

    def checksum(self) -> str:
        """``weights_checksum`` of the engine's own weights."""
        return weights_checksum(self.model.state_dict())

    @torch.no_grad()
    def _copy_in(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy every tensor of ``state`` into the engine's parameters (names already checked)."""
        params = dict(self.model.named_parameters())
        for name, tensor in state.items():
            params[name].copy_(tensor)

    def load_weights(
        self, state: Mapping[str, torch.Tensor], version: int, *, expected_checksum: str | None = None
    ) -> SyncReport:
        """Copy ``state`` in, check the engine's checksum equals ``state``'s, and take ``version``.

        ``expected_checksum``, when the sender already knows it (a remote trainer), replaces
        hashing ``state`` here. Refuses a version not newer than ``weights_version`` and a state
        whose names, shapes or dtypes differ from the model's (``ValueError`` naming them). If the
        checksums differ after the copy, raises ``RuntimeError``; the engine keeps its old version
        and refuses to generate until a load succeeds.
        """
        check_version(version, self.weights_version)
        check_state_matches(state, self.model.state_dict())
        start = time.perf_counter()
        expected = expected_checksum or weights_checksum(state)
        self._verified = False
        self._copy_in(state)
        actual = self.checksum()
        seconds = time.perf_counter() - start
        if actual != expected:
            raise RuntimeError(
                f"Weight sync to version {version} failed verification: the trainer's checksum is {expected} but "
                f"the engine's is {actual} after the copy. The engine stays at version {self.weights_version} and "
                "will not generate until a sync succeeds."
            )
        self._verified = True
        self.weights_version = version
        return SyncReport(version=version, checksum=actual, bytes=state_bytes(state), seconds=seconds)

    @torch.no_grad()
    def load_stream(self, tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> SyncReport:
        """Copy in ``(name, tensor)`` pairs one at a time, as a trainer gathers them, and take ``version``.

        The pairs must come in sorted name order, each in the engine's own dtype and shape, and must cover every
        weight (``ValueError`` naming the first that does not fit, or those missing). The trainer's checksum is
        built from the pairs as they arrive (``ChecksumStream``), so neither side holds the whole state at once.
        Each copy is compared with what was sent where both live, on the device, and the differing elements are
        read back once at the end (``RuntimeError`` if any): the engine's own weights are not read back to the
        host, only the trainer's, for the checksum. Until a load succeeds the engine refuses to generate.
        """
        check_version(version, self.weights_version)
        start = time.perf_counter()
        params = dict(self.model.named_parameters())
        expected = ChecksumStream()
        received: set[str] = set()
        copied, differing = 0, 0
        self._verified = False
        for name, tensor in tensors:
            param = params.get(name)
            if param is None:
                raise ValueError(f"The engine's model holds no weight {name!r}: sync from a model of the same shape.")
            if tensor.shape != param.shape or tensor.dtype != param.dtype:
                raise ValueError(
                    f"{name}: got {list(tensor.shape)} {tensor.dtype}, the engine holds {list(param.shape)} "
                    f"{param.dtype}: send each weight in the engine's dtype (rollout.dtype)."
                )
            expected.add(name, tensor)
            self._copy_weight(param, tensor)
            differing = differing_elements(param, tensor) + differing
            received.add(name)
            copied += tensor.numel() * tensor.element_size()
            del tensor  # let the gathered weight go before the next one is made
        missing = sorted(set(params) - received)
        if missing:
            raise ValueError(f"The sync to version {version} left out {', '.join(missing[:6])}: send every weight.")
        if int(differing):
            raise RuntimeError(
                f"Weight sync to version {version} failed verification: {int(differing):,} elements of the engine's "
                f"weights differ from the trainer's (checksum {expected.hexdigest()}) after the copy. The engine "
                f"stays at version {self.weights_version} and will not generate until a sync succeeds."
            )
        self._verified = True
        self.weights_version = version
        return SyncReport(
            version=version, checksum=expected.hexdigest(), bytes=copied, seconds=time.perf_counter() - start
        )

    def _copy_weight(self, param: torch.Tensor, tensor: torch.Tensor) -> None:
        """Copy one streamed weight into its parameter."""
        param.copy_(tensor)

    # generation

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, *, first_prompt_index: int = 0
    ) -> list[Completion]:
        """``len(prompts) * params.n`` completions, grouped by prompt (prompt 0's n first), in order.

        ``first_prompt_index`` is the index of ``prompts[0]`` in a caller's longer list: prompt indices
        and sampling seeds count from it, so a list split across engines samples as it would whole.
        """
        if not self._verified:
            raise RuntimeError(
                "The engine's weights failed their last sync verification: sync again before generating."
            )
        args = self.model.args
        validate_prompts(prompts, params, args.vocab_size, args.max_seq_len, self.max_seq_len)
        rows = [(i, j) for i in range(len(prompts)) for j in range(params.n)]
        completions: list[Completion] = []
        for first in range(0, len(rows), self.max_batch):
            batch = rows[first : first + self.max_batch]
            completions += self._generate_batch(prompts, batch, params, first_prompt_index)
        return completions

    def _generate_batch(
        self, prompts: list[list[int]], rows: list[tuple[int, int]], params: SamplingParams, first_prompt_index: int
    ) -> list[Completion]:
        B = len(rows)
        lengths = [len(prompts[i]) for i, _ in rows]
        S = max(lengths)
        tokens_BS = torch.zeros(B, S, dtype=torch.long)
        for b, (i, _) in enumerate(rows):
            tokens_BS[b, : lengths[b]] = torch.tensor(prompts[i], dtype=torch.long)
        tokens_BS = tokens_BS.to(self.device)
        lengths_B = torch.tensor(lengths, dtype=torch.long, device=self.device)
        generators = [completion_generator(params.seed, first_prompt_index + i, j) for i, j in rows]
        cache = KVCache.for_model(self.model, B, S + params.max_new_tokens)

        # Prefill the right-padded prompts, keep each row's last real position, then continue each row.
        h_BSM = self.model.hidden_states_with_cache(tokens_BS, cache, start_position=0)
        cache.set_lengths(lengths_B)
        last_BM = h_BSM[torch.arange(B, device=self.device), lengths_B - 1]
        logits_BV = F.linear(last_BM, self.model.head_weight).float()

        stop_ids = torch.tensor(params.stop_token_ids, dtype=torch.long, device=self.device)
        generated: list[torch.Tensor] = []
        logprobs: list[torch.Tensor] = []
        done_B = torch.zeros(B, dtype=torch.bool, device=self.device)
        stopped_B = torch.zeros(B, dtype=torch.bool, device=self.device)
        for step in range(params.max_new_tokens):
            next_B = choose_tokens(logits_BV, params.temperature, params.top_p, generators)
            logprobs.append(sampled_logprobs(logits_BV, next_B, params.temperature))
            generated.append(next_B)
            hit_B = torch.isin(next_B, stop_ids) & ~done_B
            stopped_B |= hit_B
            done_B |= hit_B
            if bool(done_B.all()) or step == params.max_new_tokens - 1:
                break
            # Finished rows keep decoding (their tokens are dropped below), so the batch keeps its shape.
            logits_BV = self.model.forward_with_cache(next_B[:, None], cache)[:, 0].float()

        tokens_BT = torch.stack(generated, dim=1).cpu()
        logprobs_BT = torch.stack(logprobs, dim=1).cpu()
        stop_set = set(params.stop_token_ids)
        completions = []
        for b, (i, j) in enumerate(rows):
            token_ids = tokens_BT[b].tolist()
            end = next((t + 1 for t, tok in enumerate(token_ids) if tok in stop_set), len(token_ids))
            reason: FinishReason = "stop" if bool(stopped_B[b]) else "length"
            completions.append(
                Completion(
                    prompt_index=first_prompt_index + i,
                    prompt_ids=list(prompts[i]),
                    token_ids=token_ids[:end],
                    logprobs=logprobs_BT[b, :end].clone(),
                    finish_reason=reason,
                    sample_index=j,
                    weights_version=self.weights_version,
                )
            )
        return completions
