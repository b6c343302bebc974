"""A decoder-only transformer in plain single-device PyTorch: Llama 3, Qwen 3, Qwen 3 MoE.

Legend: B batch, S sequence, M model dim, D head dim, V vocabulary, N tokens (B x S),
E experts.

Build on the meta device, move with ``to_empty``, then ``init_weights``. Parallelism,
kernels and compilation are applied from outside; the swappable ops arrive as ``ModelOps``.
Incremental decoding (``forward_with_cache``) keeps keys and values in a ``KVCache``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from titanpod.models.common.args import DecoderArgs
from titanpod.models.common.attention import Attention
from titanpod.models.common.counting import decoder_flops_per_token, parameter_count
from titanpod.models.common.feed_forward import FeedForward
from titanpod.models.common.init import ParamInit, init_parameters_
from titanpod.models.common.kv_cache import KVCache, cache_positions
from titanpod.models.common.moe import MoE, load_balancing_loss
from titanpod.models.common.norms import RMSNorm
from titanpod.models.common.ops import ModelOps
from titanpod.models.common.rope import inverse_frequencies, rotary_cos_sin


class TransformerBlock(nn.Module):
    """Pre-norm block: attention then a dense or mixture-of-experts feed-forward, each residual."""

    def __init__(self, args: DecoderArgs, ops: ModelOps) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args, ops.attention)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward: nn.Module = (
            MoE(args.dim, args.moe, ops.expert_matmul) if args.moe else FeedForward(args.dim, args.ffn_dim)
        )

    def forward(
        self,
        x_BSM: torch.Tensor,
        cos_SD: torch.Tensor,
        sin_SD: torch.Tensor,
        document_ids_BS: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """The block's output and, for an MoE block, its router logits [N, E] and dropped-choice count (0-d).

        ``document_ids_BS`` (optional) keeps attention within each packed document.
        """
        normed_BSM = self.attention_norm(x_BSM)
        if document_ids_BS is None:
            h_BSM = x_BSM + self.attention(normed_BSM, cos_SD, sin_SD)
        else:
            h_BSM = x_BSM + self.attention(normed_BSM, cos_SD, sin_SD, document_ids_BS)
        ffn_out = self.feed_forward(self.ffn_norm(h_BSM))
        if isinstance(ffn_out, tuple):
            return h_BSM + ffn_out[0], (ffn_out[1], ffn_out[2])
        return h_BSM + ffn_out, None

    def forward_with_cache(
        self,
        x_BSM: torch.Tensor,
        cos_B1SD: torch.Tensor,
        sin_B1SD: torch.Tensor,
        cache: KVCache,
        layer: int,
        positions_BS: torch.Tensor,
        end: int,
    ) -> torch.Tensor:
        """The block's output for new tokens at ``positions_BS``, attending over (and filling) ``cache``."""
        attended_BSM = self.attention.forward_with_cache(
            self.attention_norm(x_BSM), cos_B1SD, sin_B1SD, cache, layer, positions_BS, end
        )
        h_BSM = x_BSM + attended_BSM
        ffn_out = self.feed_forward(self.ffn_norm(h_BSM))
        return h_BSM + (ffn_out[0] if isinstance(ffn_out, tuple) else ffn_out)


def _decoder_block_call(
    block: nn.Module, carry: tuple[torch.Tensor, ...], inputs: tuple[torch.Tensor, ...]
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, torch.Tensor] | None]:
    """A ``TransformerBlock`` as its runner calls it: hidden states carried, rotary tables (and document ids) shared;
    an MoE block gives out its router logits and dropped count."""
    h_BSM, routing = block(*carry, *inputs)
    return (h_BSM,), routing


class Transformer(nn.Module):
    """A decoder-only language model. ``forward`` gives logits; ``loss`` trains it."""

    def __init__(self, args: DecoderArgs, ops: ModelOps | None = None) -> None:
        super().__init__()
        self.args = args
        self.ops = ops or ModelOps()
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args, self.ops) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        # A tied model has no output layer of its own: the head reads the embedding table, so
        # no two parameters alias (aliases break under to_empty, sharding and safetensors).
        self.output = None if args.tie_embeddings else nn.Linear(args.dim, args.vocab_size, bias=False)

    @property
    def head_weight(self) -> torch.Tensor:
        """The output projection, [V, M]: the embedding table when embeddings are tied."""
        return self.tok_embeddings.weight if self.output is None else self.output.weight

    @staticmethod
    def rotary_tables(
        args: DecoderArgs, positions_S: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's cos and sin [S, D] at ``positions_S`` for a model of ``args``, as ``hidden_states`` makes them
        (pipeline stages, which run a slice of the layers, make them the same way)."""
        inv_freq = inverse_frequencies(
            args.resolved_head_dim, args.rope_theta, args.rope_scaling, device=positions_S.device
        )
        return rotary_cos_sin(positions_S, inv_freq, dtype)

    def hidden_states_and_router_logits(
        self, tokens_BS: torch.Tensor, document_ids_BS: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Final-norm hidden states [B, S, M], and every MoE layer's router logits [N, E].

        ``document_ids_BS``: see ``hidden_states_and_routing``.
        """
        h_BSM, router_logits, _ = self.hidden_states_and_routing(tokens_BS, document_ids_BS)
        return h_BSM, router_logits

    def hidden_states_and_routing(
        self, tokens_BS: torch.Tensor, document_ids_BS: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """Final-norm hidden states [B, S, M], every MoE layer's router logits [N, E], and every
        MoE layer's count of routed choices dropped for lack of expert capacity (0-d integers).

        ``document_ids_BS`` [B, S] (optional, integer) marks the documents packed into each
        row: equal within a document, increasing along the row. With it, a token attends only
        to earlier tokens of its own document; without it, to every earlier token. Rotary
        positions stay those of the row (RoPE is relative, so a document's attention scores
        do not depend on where in the row it starts). Under context parallelism
        (``ModelOps.sequence``) the outputs cover only this process's tokens of each row.
        """
        if document_ids_BS is not None and document_ids_BS.shape != tokens_BS.shape:
            raise ValueError(
                f"document_ids_BS has shape {list(document_ids_BS.shape)} but the tokens have "
                f"{list(tokens_BS.shape)}: give one document id per token."
            )
        # Context parallelism keeps some chunks of each row here (RoPE at their row positions); else all.
        positions_S = self.ops.sequence.positions(tokens_BS.shape[1], tokens_BS.device)
        tokens_BS = self.ops.sequence.local(tokens_BS)
        if document_ids_BS is not None:
            document_ids_BS = self.ops.sequence.local(document_ids_BS)
        h_BSM = self.tok_embeddings(tokens_BS)
        cos_SD, sin_SD = self.rotary_tables(self.args, positions_S, h_BSM.dtype)
        h_BSM, router_logits, dropped = self.run_layers(h_BSM, cos_SD, sin_SD, document_ids_BS)
        return self.norm(h_BSM), router_logits, dropped

    def run_layers(
        self,
        h_BSM: torch.Tensor,
        cos_SD: torch.Tensor,
        sin_SD: torch.Tensor,
        document_ids_BS: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """The transformer blocks in order over the embedded tokens, through the block runner slot
        (``ModelOps.block_runner``): the last block's output [B, S, M], and each MoE block's router logits [N, E]
        and dropped-choice count (0-d), one entry a block (empty lists for a dense model)."""
        inputs = (cos_SD, sin_SD) if document_ids_BS is None else (cos_SD, sin_SD, document_ids_BS)
        (h_BSM,), routings = self.ops.block_runner(self.layers, _decoder_block_call, (h_BSM,), inputs)
        kept = [routing for routing in routings if routing is not None]
        return h_BSM, [logits for logits, _ in kept], [dropped for _, dropped in kept]

    def hidden_states(self, tokens_BS: torch.Tensor, document_ids_BS: torch.Tensor | None = None) -> torch.Tensor:
        """Final-norm hidden states, shape [B, S, M] (``document_ids_BS``: see ``hidden_states_and_router_logits``)."""
        return self.hidden_states_and_router_logits(tokens_BS, document_ids_BS)[0]

    def forward(self, tokens_BS: torch.Tensor, document_ids_BS: torch.Tensor | None = None) -> torch.Tensor:
        """Next-token logits, shape [B, S, V] (``document_ids_BS``: see ``hidden_states_and_router_logits``)."""
        return F.linear(self.hidden_states(tokens_BS, document_ids_BS), self.head_weight)

    def hidden_states_with_cache(
        self, tokens_BS: torch.Tensor, cache: KVCache, start_position: int | torch.Tensor | None = None
    ) -> torch.Tensor:
        """Final-norm hidden states [B, S, M] of new tokens, reading and extending ``cache``.

        Row b's tokens sit at absolute positions ``start_position[b] + 0 .. S-1`` (an int
        means the same start for every row; ``None`` means ``cache.lengths_B``, i.e. continue
        each row). RoPE uses those positions; each token's keys and values are written into
        the cache there, and it attends causally to its row's cache positions ``0 ..`` its own.
        Afterwards ``cache.lengths_B`` is ``start_position + S``. For a right-padded batch of
        prompts, prefill from 0 and then ``cache.set_lengths(true_lengths)``: the padding's
        cache entries are never attended to and are overwritten by the next tokens.
        """
        B, S = tokens_BS.shape
        if cache.batch_size != B or cache.n_layers != len(self.layers):
            raise ValueError(
                f"The cache holds {cache.batch_size} rows for {cache.n_layers} layers, but the tokens have "
                f"{B} rows and the model {len(self.layers)} layers: allocate it with KVCache.for_model."
            )
        device = tokens_BS.device
        if start_position is None:
            start_B = cache.lengths_B.to(device)
        else:
            start_B = torch.as_tensor(start_position, dtype=torch.long, device=device).expand(B)
        end = int(start_B.max()) + S
        if int(start_B.min()) < 0 or end > cache.max_seq_len:
            raise ValueError(
                f"Tokens at positions {int(start_B.min())} .. {end - 1} do not fit a cache of "
                f"{cache.max_seq_len} positions: allocate a longer cache or generate fewer tokens."
            )
        positions_BS = cache_positions(start_B, S)
        h_BSM = self.tok_embeddings(tokens_BS)
        inv_freq = inverse_frequencies(
            self.args.resolved_head_dim, self.args.rope_theta, self.args.rope_scaling, device=device
        )
        cos_ND, sin_ND = rotary_cos_sin(positions_BS.flatten(), inv_freq, h_BSM.dtype)
        cos_B1SD, sin_B1SD = cos_ND.view(B, 1, S, -1), sin_ND.view(B, 1, S, -1)
        for index, layer in enumerate(self.layers):
            h_BSM = layer.forward_with_cache(h_BSM, cos_B1SD, sin_B1SD, cache, index, positions_BS, end)
        cache.lengths_B = (start_B + S).to(cache.lengths_B.device)
        return self.norm(h_BSM)

    def forward_with_cache(
        self, tokens_BS: torch.Tensor, cache: KVCache, start_position: int | torch.Tensor | None = None
    ) -> torch.Tensor:
        """Next-token logits [B, S, V] of new tokens, reading and extending ``cache``.

        Positions and padding: see ``hidden_states_with_cache``. Equal (to rounding) to the
        matching positions of ``forward`` over each row's whole sequence.
        """
        return F.linear(self.hidden_states_with_cache(tokens_BS, cache, start_position), self.head_weight)

    def loss_terms(
        self, tokens_BS: torch.Tensor, labels_BS: torch.Tensor, document_ids_BS: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """``cross_entropy`` (mean over labelled tokens) and, for MoE models, ``load_balancing``.

        ``document_ids_BS`` (optional) masks attention to each packed document; see
        ``hidden_states_and_router_logits``.
        """
        return self._terms_and_metrics(tokens_BS, labels_BS, document_ids_BS)[0]

    def _terms_and_metrics(
        self, tokens_BS: torch.Tensor, labels_BS: torch.Tensor, document_ids_BS: torch.Tensor | None
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        h_BSM, router_logits, dropped = self.hidden_states_and_routing(tokens_BS, document_ids_BS)
        terms = {"cross_entropy": self.ops.head_loss(h_BSM, self.head_weight, self.ops.sequence.local(labels_BS))}
        if self.args.moe is None:
            return terms, {}
        moe = self.args.moe
        terms["load_balancing"] = load_balancing_loss(router_logits, moe.n_experts, moe.top_k, self.ops.batch_mean)
        return terms, {"dropped_tokens": torch.stack(dropped).sum()}

    def loss_and_metrics(
        self, tokens_BS: torch.Tensor, labels_BS: torch.Tensor, document_ids_BS: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The training loss (see ``loss``) and the figures reported beside it, each 0-d on the device.

        Dense models report none. MoE models report ``dropped_tokens``: the routed choices
        (token, expert) dropped because the expert's buffer was full, summed over layers
        (always 0 with ``capacity_factor=None``).
        """
        terms, metrics = self._terms_and_metrics(tokens_BS, labels_BS, document_ids_BS)
        if self.args.moe is None:
            return terms["cross_entropy"], metrics
        return terms["cross_entropy"] + self.args.moe.aux_loss_coef * terms["load_balancing"], metrics

    def loss(
        self, tokens_BS: torch.Tensor, labels_BS: torch.Tensor, document_ids_BS: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The training loss: cross-entropy, plus ``aux_loss_coef`` x load balancing for MoE models.

        ``document_ids_BS`` (optional, [B, S] integer) keeps attention within each packed
        document; see ``hidden_states_and_router_logits``.
        """
        return self.loss_and_metrics(tokens_BS, labels_BS, document_ids_BS)[0]

    def parameter_init(self, name: str) -> ParamInit:
        """The law parameter ``name`` starts from (``titanpod.models.common.init``).

        Embeddings, projections, routers and experts: a normal of std 0.02 truncated at 3 std;
        the projections into the residual stream (``wo``, ``w2``) shrunk by ``1/sqrt(2 x n_layers)``;
        norm scales: one.
        """
        if name.endswith("norm.weight"):
            return ParamInit("ones")
        if name.endswith(("wo.weight", "w2.weight", "experts.w2")):
            return ParamInit("normal", std=0.02 / math.sqrt(2 * self.args.n_layers))
        return ParamInit("normal", std=0.02)

    def init_weights(self, seed: int = 0) -> None:
        """Initialise every parameter in place from ``seed``, on whatever device it lives.

        Each parameter's law is ``parameter_init``'s; values are drawn tile by tile on the CPU
        (``titanpod.models.common.init``), so the same seed gives the same weights on every
        device type, and ranks that initialise only their own shards get the same values too.
        """
        init_parameters_(self, seed)

    def active_parameter_count(self) -> int:
        """Parameters one token uses: all of them, less the experts its router does not choose."""
        total = parameter_count(self)
        moe = self.args.moe
        if moe is None:
            return total
        per_expert = 3 * self.args.dim * moe.expert_ffn_dim
        return total - self.args.n_layers * (moe.n_experts - moe.top_k) * per_expert

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 x (active parameters but the input embedding) + attention.

        See ``titanpod.models.common.counting.decoder_flops_per_token`` for the convention.
        """
        input_table = 0 if self.args.tie_embeddings else self.tok_embeddings.weight.numel()
        return decoder_flops_per_token(
            matmul_params=self.active_parameter_count() - input_table,
            n_layers=self.args.n_layers,
            n_heads=self.args.n_heads,
            head_dim=self.args.resolved_head_dim,
            seq_len=seq_len,
        )
