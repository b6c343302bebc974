"""The ``arith`` word problems: each answer is what its sentences say, draws repeat per seed, the held-out split
never meets the training split; and the last-number reward, worked by hand."""

import re

import pytest

from titanpod.data.answers import last_number, number_reward
from titanpod.data.tasks import get_task, split_of


def solve(prompt: str) -> int:
    """Read a problem sentence by sentence, independently of the generator, and count."""
    sentences = prompt.strip().split(". ")
    count = int(re.fullmatch(r"\w+ has (\d+) \w+", sentences[0]).group(1))
    for sentence in sentences[1:-1]:
        if match := re.fullmatch(r"\w+ gets (\d+) more", sentence):
            count += int(match.group(1))
        elif match := re.fullmatch(r"\w+ gives (\d+) away", sentence):
            count -= int(match.group(1))
        else:
            assert re.fullmatch(r"\w+ doubles them", sentence), sentence
            count *= 2
    assert re.fullmatch(r"How many \w+ does \w+ have\?", sentences[-1]), sentences[-1]
    return count


def test_every_answer_is_what_the_sentences_say_and_never_negative():
    task = get_task("arith")
    examples = task.examples("train", 300, seed=0) + task.examples("test", 100, seed=0)
    steps = set()
    for example in examples:
        assert example.answer == str(solve(example.prompt)) and int(example.answer) >= 0
        assert example.prompt.endswith("?\n")
        steps.add(example.prompt.count(". ") - 1)
    assert steps == {2, 3}  # two- and three-step problems both occur


def test_a_seed_gives_the_same_problems_and_another_seed_others():
    task = get_task("arith")
    first, again = task.examples("train", 50, seed=4), get_task("arith").examples("train", 50, seed=4)
    assert [(e.prompt, e.answer) for e in first] == [(e.prompt, e.answer) for e in again]
    assert {e.prompt for e in first} != {e.prompt for e in task.examples("train", 50, seed=5)}


def test_held_out_problems_are_never_training_problems():
    task = get_task("arith")
    train = {e.prompt for seed in range(3) for e in task.examples("train", 3000, seed)}
    test = {e.prompt for seed in range(3) for e in task.examples("test", 300, seed)}
    assert len(test) > 300 and not train & test
    assert all(split_of(prompt) == "test" for prompt in test)


@pytest.mark.parametrize(
    ("completion", "answer", "reward"),
    [
        ("9", "9", 1.0),
        ("She has 3 then 9<|endoftext|>", "9", 1.0),
        ("9 or maybe 8", "9", 0.0),
        ("nine", "9", 0.0),
        ("2.50", "2.5", 1.0),
        ("1,024 coins", "1024", 1.0),
        ("-3", "3", 0.0),
        ("the total is 72", "Natalia sold 48/2 = 24 clips... #### 72", 1.0),
        ("", "0", 0.0),
    ],
)
def test_the_number_reward_checks_the_last_number(completion, answer, reward):
    assert number_reward("prompt", completion, answer) == reward


def test_last_number_reads_signs_commas_and_decimals():
    assert str(last_number("a -12 and 3,000.5 b")) == "3000.5"
    assert last_number("no digits") is None
    assert get_task("arith").reward("p", "It is 7.", "7") == 1.0
