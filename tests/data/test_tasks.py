"""Built-in tasks: examples, the fixed train/test partition, rewards and accuracy worked by hand; the tokenizer."""

import json

import pytest

from titanpod.data.sft.tokenizer import (
    CHARS,
    END_OF_TEXT,
    TURN_END,
    character_tokenizer,
    load_sft_tokenizer,
)
from titanpod.data.tasks import TASKS, AddTask, Example, ReverseTask, Task, get_task, split_of


def test_reverse_examples_are_what_they_say():
    task = get_task("reverse")
    assert isinstance(task, Task) and task.name == "reverse"
    for example in task.examples("train", 50, seed=0):
        word = example.prompt.removeprefix("reverse: ").removesuffix("\n")
        assert example.prompt == f"reverse: {word}\n" and example.answer == word[::-1]
        assert 3 <= len(word) <= 7 and word.isalpha() and word.islower()


def test_add_examples_are_what_they_say():
    for example in AddTask().examples("test", 30, seed=1):
        a, b = example.prompt.removeprefix("add: ").removesuffix("\n").split("+")
        assert example.answer == str(int(a) + int(b))


@pytest.mark.parametrize("name", sorted(TASKS))
def test_train_and_test_are_disjoint_distinct_and_reproducible(name):
    task = get_task(name)
    train = task.examples("train", 2000, seed=0) + task.examples("train", 500, seed=7)
    test = task.examples("test", 200, seed=0) + task.examples("test", 100, seed=3)
    assert not {ex.prompt for ex in train} & {ex.prompt for ex in test}
    assert all(split_of(ex.prompt) == "train" for ex in train) and all(split_of(ex.prompt) == "test" for ex in test)
    assert len({ex.prompt for ex in task.examples("train", 500, seed=0)}) == 500  # distinct within a call
    assert task.examples("test", 20, seed=5) == task.examples("test", 20, seed=5)
    assert task.examples("test", 20, seed=5) != task.examples("test", 20, seed=6)
    assert all(char in task.characters for ex in train[:100] for char in ex.prompt + ex.answer)


def test_reward_is_exact_match_before_the_end_marker():
    task = ReverseTask()
    prompt, answer = "reverse: abc\n", "cba"
    assert task.reward(prompt, "cba", answer) == 1.0
    assert task.reward(prompt, "cba<|endoftext|>junk", answer) == 1.0
    assert task.reward(prompt, " cba\n", answer) == 1.0  # surrounding whitespace does not count
    assert task.reward(prompt, "cb", answer) == 0.0
    assert task.reward(prompt, "cbaa", answer) == 0.0
    assert task.reward(prompt, "abc", answer) == 0.0
    assert task.reward(prompt, "", answer) == 0.0
    assert task.reward(prompt, "<|endoftext|>cba", answer) == 0.0


def test_partial_reward_credits_characters_in_place_and_keeps_full_credit_for_the_answer():
    task = get_task("reverse")
    prompt, answer = "reverse: abcd\n", "dcba"
    assert task.partial_reward(prompt, "dcba<|endoftext|>", answer) == 1.0
    assert task.partial_reward(prompt, "dcbx", answer) == 0.5 * 3 / 4
    assert task.partial_reward(prompt, "dc", answer) == 0.5 * 2 / 4  # missing characters are wrong
    assert task.partial_reward(prompt, "dcbaaa", answer) == 0.5 * 4 / 6  # so are extra ones
    assert task.partial_reward(prompt, "abcd", answer) == 0.0
    assert task.partial_reward(prompt, "", answer) == 0.0


def test_accuracy_counts_full_rewards():
    task = AddTask()
    examples = [Example("add: 1+2\n", "3"), Example("add: 10+5\n", "15"), Example("add: 0+0\n", "0")]
    assert task.accuracy(examples, ["3", "16", "0<|endoftext|>"]) == pytest.approx(2 / 3)
    assert task.accuracy([], []) == 0.0
    with pytest.raises(ValueError, match="3 examples but 2 completions"):
        task.accuracy(examples, ["3", "15"])


def test_unknown_task_and_bad_requests_say_what_to_do():
    with pytest.raises(KeyError, match="Did you mean 'reverse'"):
        get_task("revrese")
    with pytest.raises(ValueError, match="Unknown split 'valid'"):
        ReverseTask().examples("valid", 3, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="distinct test examples"):
        AddTask(limit=5).examples("test", 100, 0)  # 25 sums in all


def test_character_tokenizer_round_trips_every_task_and_saves_for_transformers(tmp_path):
    tokenizer = load_sft_tokenizer(CHARS)
    assert tokenizer.vocab_size == 101 <= 2048
    text = "reverse: abcde\nadd: 23+45\n"
    ids = tokenizer.encode(text)
    assert len(ids) == len(text) and tokenizer.decode(ids) == text
    assert tokenizer.encode(END_OF_TEXT) == [tokenizer.end_id] and tokenizer.end_id == 1 and tokenizer.pad_id == 0
    assert tokenizer.stop_ids == (1, character_tokenizer().token_to_id(TURN_END))
    assert tokenizer.render_chat([{"role": "user", "content": "hi"}], add_generation_prompt=True) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    tokenizer.save(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["eos_token"] == END_OF_TEXT
    reloaded = load_sft_tokenizer(str(tmp_path))
    assert reloaded.encode(text) == ids and reloaded.chat_template == tokenizer.chat_template

    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tmp_path)
    assert hf.encode(text, add_special_tokens=False) == ids and hf.eos_token_id == tokenizer.end_id
    chat = [{"role": "user", "content": "reverse: ab\n"}]
    assert hf.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == tokenizer.render_chat(
        chat, add_generation_prompt=True
    )
