"""Greedy evaluation: left-padded batches give each prompt's own logits; accuracy of a model that knows the
answers is 1, and of one that gets them wrong by one letter is 0."""

import pytest
import torch
from torch import nn

from titanpod.data.sft.tokenizer import CHARS, load_sft_tokenizer
from titanpod.data.tasks import ReverseTask
from titanpod.models import DecoderArgs
from titanpod.recipes.families import build_model
from titanpod.runs.evaluation import evaluate, greedy_generate


@pytest.fixture(scope="module")
def tokenizer():
    return load_sft_tokenizer(CHARS)


def _tiny_model():
    args = DecoderArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128, ffn_dim=128, max_seq_len=64)
    model = build_model("llama3", args)
    model.to_empty(device="cpu")
    model.init_weights(0)
    return model


def test_left_padding_keeps_each_prompt_to_itself():
    model = _tiny_model()
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]
    batched = greedy_generate(model, prompts, max_new_tokens=6, stop_ids=[1], pad_id=0)
    alone = [greedy_generate(model, [prompt], max_new_tokens=6, stop_ids=[1], pad_id=0)[0] for prompt in prompts]
    assert batched == alone
    with torch.no_grad():  # and the logits themselves agree
        padded = torch.tensor([[0, 0, 0, 0, 11, 12]])
        documents = torch.tensor([[0, 0, 0, 0, 1, 1]])
        assert torch.allclose(model(padded, documents)[0, -1], model(torch.tensor([[11, 12]]))[0, -1], atol=1e-5)


class ReverseOracle(nn.Module):
    """Writes the reverse of the word in its prompt, then the end token; ``slip`` changes the first letter."""

    def __init__(self, tokenizer, slip=False):
        super().__init__()
        self.tokenizer, self.slip = tokenizer, slip
        self.tok_embeddings = nn.Embedding(tokenizer.vocab_size, 1)

    def forward(self, tokens_BL, document_ids_BL=None):
        logits = torch.zeros(*tokens_BL.shape, self.tokenizer.vocab_size)
        for row, ids in enumerate(tokens_BL.tolist()):
            text = self.tokenizer.decode(ids)  # the padding is a special token, left out
            prompt, _, written = text.partition("\n")
            answer = prompt.removeprefix("reverse: ")[::-1]
            if self.slip:
                answer = "z" + answer[1:] if answer[0] != "z" else "y" + answer[1:]
            following = answer[len(written)] if len(written) < len(answer) else None
            token = self.tokenizer.end_id if following is None else self.tokenizer.encode(following)[0]
            logits[row, -1, token] = 1.0
        return logits


def test_accuracy_is_one_for_the_right_answers_and_zero_for_near_misses(tokenizer):
    task = ReverseTask()
    examples = task.examples("test", 20, seed=0)
    right = evaluate(ReverseOracle(tokenizer), tokenizer, task, examples, max_new_tokens=10, batch_size=8)
    assert right.accuracy == 1.0 and right.completions == [example.answer for example in examples]
    assert evaluate(ReverseOracle(tokenizer, slip=True), tokenizer, task, examples, max_new_tokens=10).accuracy == 0.0
    cut_short = evaluate(ReverseOracle(tokenizer), tokenizer, task, examples, max_new_tokens=3)
    assert all(len(completion) == 3 for completion in cut_short.completions)
    assert cut_short.accuracy == pytest.approx(sum(len(ex.answer) == 3 for ex in examples) / len(examples))


def test_an_untrained_model_scores_zero_and_keeps_its_mode(tokenizer):
    model = _tiny_model()
    model.train()
    task = ReverseTask()
    examples = task.examples("test", 8, seed=0)
    assert evaluate(model, tokenizer.tokenizer, task, examples, max_new_tokens=4).accuracy == 0.0
    assert model.training
