"""Held-out accuracy by plain greedy decoding: one full forward of the whole sequence per new token.

No KV cache, so it is simple and exact but quadratic in length: meant for short task completions.
Prompts of different lengths are batched by padding them on the left; the padding is given its own
document id, so document-masked attention keeps every prompt's tokens to themselves (rotary positions
are relative, so where a prompt starts in its row does not change its logits).
Legend: B batch, L length so far, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from rich.markup import escape
from tokenizers import Tokenizer

from titanpod.data.sft.records import prompt_text
from titanpod.data.sft.tokenizer import SFTTokenizer
from titanpod.data.tasks import Example, Task
from titanpod.models import Transformer


@torch.no_grad()
def greedy_generate(
    model: Transformer,
    prompts: Sequence[list[int]],
    max_new_tokens: int,
    stop_ids: Sequence[int],
    pad_id: int,
    batch_size: int = 64,
    progress: Callable[[str], None] | None = None,
) -> list[list[int]]:
    """The greedy continuation of each prompt (token ids), up to and without the first stop id, at most
    ``max_new_tokens`` long. The model stays in the mode and on the device it is in. ``progress`` hears of each
    batch done when there are several."""
    device = model.tok_embeddings.weight.device
    stops = torch.tensor(list(stop_ids), device=device)
    completions: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        longest = max(len(ids) for ids in chunk)
        if min(len(ids) for ids in chunk) == 0:
            raise ValueError("Cannot generate from an empty prompt.")
        tokens_BL = torch.tensor([[pad_id] * (longest - len(ids)) + list(ids) for ids in chunk], device=device)
        documents_BL = torch.tensor([[0] * (longest - len(ids)) + [1] * len(ids) for ids in chunk], device=device)
        padded = any(len(ids) < longest for ids in chunk)
        done_B = torch.zeros(len(chunk), dtype=torch.bool, device=device)
        new: list[torch.Tensor] = []
        for _ in range(max_new_tokens):
            logits_BLV = model(tokens_BL, documents_BL if padded else None)
            next_B = logits_BLV[:, -1].argmax(dim=-1)
            next_B = torch.where(done_B, torch.full_like(next_B, pad_id), next_B)
            done_B |= torch.isin(next_B, stops)
            new.append(next_B)
            tokens_BL = torch.cat([tokens_BL, next_B[:, None]], dim=1)
            documents_BL = torch.cat([documents_BL, documents_BL[:, -1:]], dim=1)
            if bool(done_B.all()):
                break
        generated_BN = torch.stack(new, dim=1).tolist()
        for row in generated_BN:
            cut = next((index for index, token in enumerate(row) if token in set(stop_ids)), len(row))
            completions.append(row[:cut])
        if progress is not None and len(prompts) > batch_size:
            progress(f"  greedy completions: {len(completions)}/{len(prompts)} prompts")
    return completions


@dataclass
class Evaluation:
    """Greedy completions of held-out examples and how many were right."""

    accuracy: float
    """Share of examples whose completion earns the full reward."""
    examples: list[Example]
    """The examples scored."""
    completions: list[str]
    """Each example's decoded completion (up to its stop token)."""

    def accuracy_line(self, step: int, when: str, task_name: str) -> str:
        """``step N: held-out accuracy <when> X% (right/total <task> test prompts, greedy)``."""
        right = round(self.accuracy * len(self.examples))
        return (
            f"step {step}: held-out accuracy {when} {self.accuracy:.1%} "
            f"({right}/{len(self.examples)} {task_name} test prompts, greedy)"
        )

    def shown(self, task: Task, count: int) -> list[str]:
        """The first ``count`` examples as console lines (rich markup): prompt -> completion (answer): right/wrong."""
        lines = []
        for example, completion in list(zip(self.examples, self.completions, strict=True))[:count]:
            right = task.reward(example.prompt, completion, example.answer) == 1.0
            mark = "[green]right[/]" if right else "[red]wrong[/]"
            answer = escape(repr(example.answer))
            lines.append(f"  {escape(repr(example.prompt))} -> {escape(repr(completion))} (answer {answer}): {mark}")
        return lines


def evaluate(
    model: Transformer,
    tokenizer: SFTTokenizer | Tokenizer,
    task: Task,
    examples: Sequence[Example],
    max_new_tokens: int,
    *,
    format: str = "plain",
    batch_size: int = 64,
    progress: Callable[[str], None] | None = None,
) -> Evaluation:
    """Greedy completions of ``examples``' prompts (laid out in ``format``, as in training), scored by ``task``;
    ``progress`` hears of the start and of each batch."""
    if isinstance(tokenizer, Tokenizer):
        tokenizer = SFTTokenizer(tokenizer, "given")
    prompts = tokenizer.encode_batch([prompt_text(tokenizer, example.prompt, format) for example in examples])
    was_training = model.training
    model.eval()
    if progress is not None:
        progress(f"scoring {len(examples)} held-out {task.name} prompts (greedy, up to {max_new_tokens} tokens)")
    try:
        generated = greedy_generate(
            model, prompts, max_new_tokens, tokenizer.stop_ids, tokenizer.pad_id, batch_size, progress
        )
    finally:
        model.train(was_training)
    completions = [tokenizer.decode(ids) for ids in generated]
    return Evaluation(task.accuracy(examples, completions), list(examples), completions)
