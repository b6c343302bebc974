"""Regenerate the built-in corpus and tokenizer shipped in titanpod.recipes.

    uv run python tools/make_builtin_data.py            # rewrite the shipped files
    uv run python tools/make_builtin_data.py --out DIR  # write them somewhere else

The corpus is English-like text made from a fixed grammar with a seeded random number
generator: short stories about people, animals and places, plus counting and
arithmetic sentences. It has enough structure for a small model to learn visibly within
a hundred steps. The tokenizer is a byte-level BPE trained on it with the `tokenizers`
library. Same seed, same bytes.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SHIPPED = Path(__file__).resolve().parents[1] / "packages/data/src/titanpod/data/builtin"
SEED = 20261129
TARGET_CHARS = 900_000
VOCAB_SIZE = 2048
SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>"]

# fmt: off
NAMES = [
    "Ada", "Ben", "Cleo", "Dara", "Emil", "Fen", "Gus", "Hana", "Ivo", "Juno", "Kai", "Lena", "Milo", "Nora",
    "Otto", "Pia", "Quentin", "Rosa", "Sami", "Tova", "Ulla", "Viktor", "Wren", "Xavier", "Yara", "Zeno",
    "Agnes", "Bruno", "Celia", "Dmitri", "Elsa", "Felix", "Greta", "Hugo", "Ines", "Jonas", "Klara", "Leon"
]
ANIMALS = [
    "cat", "dog", "fox", "owl", "hare", "goat", "crow", "otter", "mole", "duck", "badger", "beaver", "sparrow",
    "heron", "lizard", "turtle", "donkey", "rabbit", "squirrel", "hedgehog", "pigeon", "salmon", "beetle",
    "spider", "falcon", "penguin", "camel", "zebra", "walrus", "moose"
]
COLOURS = [
    "red", "blue", "green", "yellow", "white", "black", "brown", "grey", "orange", "purple", "silver", "golden",
    "pale", "dark", "spotted", "striped"
]
SIZES = [
    "tiny", "small", "little", "large", "huge", "tall", "short", "round", "thin", "heavy"
]
PLACES = [
    "the river", "the market", "the old mill", "the forest", "the harbour", "the hill", "the garden",
    "the bakery", "the library", "the station", "the lighthouse", "the orchard", "the meadow",
    "the village square", "the bridge", "the school", "the museum", "the workshop", "the valley", "the castle",
    "the pond", "the farm", "the island", "the cave", "the tower"
]
OBJECTS = [
    "a basket", "a lamp", "a map", "a kite", "a drum", "a boat", "a key", "a book", "a bell", "a ladder",
    "a hammer", "a blanket", "a compass", "a violin", "a bucket", "a lantern", "a wheelbarrow", "a telescope",
    "a feather", "a candle", "a mirror", "a rope", "a shovel", "a clock", "a whistle", "an umbrella", "a puzzle",
    "a letter", "a parcel", "a scarf"
]
FOODS = [
    "bread", "apples", "soup", "cheese", "plums", "rice", "honey", "beans", "carrots", "pears", "porridge",
    "noodles", "cherries", "potatoes", "pancakes", "walnuts", "biscuits", "onions", "tomatoes", "cabbage",
    "lemons", "strawberries", "mushrooms", "peaches"
]
WEATHER = [
    "rain", "sun", "wind", "snow", "fog", "storm", "drizzle", "heat", "frost", "thunder"
]
FEELINGS = [
    "happy", "tired", "curious", "proud", "worried", "calm", "hungry", "sleepy", "excited", "grumpy", "shy",
    "brave", "nervous", "cheerful", "lonely", "surprised"
]
JOBS = [
    "baker", "teacher", "sailor", "farmer", "painter", "doctor", "carpenter", "gardener", "musician", "fisher",
    "librarian", "engineer", "tailor", "shepherd", "potter", "astronomer"
]
VERBS = [
    ("repaired", "repairing"), ("painted", "painting"), ("cleaned", "cleaning"), ("measured", "measuring"),
    ("polished", "polishing"), ("wrapped", "wrapping"), ("borrowed", "borrowing"), ("opened", "opening"),
    ("counted", "counting"), ("carried", "carrying"), ("studied", "studying"), ("tested", "testing")
]
NUMBERS = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"
]
DAYS = [
    "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"
]
MONTHS = [
    "January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November",
    "December"
]
# fmt: on


def _story(rng: random.Random) -> str:
    who, friend = rng.sample(NAMES, 2)
    animal, colour, place = rng.choice(ANIMALS), rng.choice(COLOURS), rng.choice(PLACES)
    thing, food, feeling = rng.choice(OBJECTS), rng.choice(FOODS), rng.choice(FEELINGS)
    day, weather, size, job = (rng.choice(DAYS), rng.choice(WEATHER), rng.choice(SIZES), rng.choice(JOBS))
    verb, _verbing = rng.choice(VERBS)
    count = rng.randint(2, 9)
    sentences = [
        f"On {day} {who} the {job} walked to {place} in the {weather}.",
        f"There {who} saw a {size} {colour} {animal} sitting next to {thing}.",
        f"The {animal} looked {feeling}, so {who} called {friend}.",
        f"{friend} came with {NUMBERS[count]} bags of {food}.",
        f"They gave the {colour} {animal} some {food}, and it was no longer {feeling}.",
        f"While the {animal} ate, {friend} {verb} {thing}.",
        f"Then {who} and {friend} carried {thing} home from {place}.",
    ]
    keep = sorted(rng.sample(range(len(sentences)), rng.randint(4, len(sentences))))
    return " ".join(sentences[i] for i in keep)


def _dialogue(rng: random.Random) -> str:
    who, friend = rng.sample(NAMES, 2)
    thing, place, verbing = (rng.choice(OBJECTS), rng.choice(PLACES), rng.choice(VERBS)[1])
    month = rng.choice(MONTHS)
    return (
        f'"Where is {thing}?" asked {who}. "I left it at {place}," said {friend}. '
        f'"I was {verbing} it there in {month}."'
    )


def _description(rng: random.Random) -> str:
    animal, colour, size, food = (rng.choice(ANIMALS), rng.choice(COLOURS), rng.choice(SIZES), rng.choice(FOODS))
    place, job = rng.choice(PLACES), rng.choice(JOBS)
    return (
        f"The {animal} is a {size} animal. Some are {colour}. It likes {food} and lives near {place}. "
        f"The {job} of the village knows the {animal} well."
    )


def _arithmetic(rng: random.Random) -> str:
    a, b = rng.randint(0, 10), rng.randint(0, 10)
    if rng.random() < 0.5:
        return f"{NUMBERS[a].capitalize()} plus {NUMBERS[b]} is {NUMBERS[a + b]}."
    big, small = max(a, b), min(a, b)
    return f"{NUMBERS[big].capitalize()} minus {NUMBERS[small]} is {NUMBERS[big - small]}."


def _counting(rng: random.Random) -> str:
    start = rng.randint(0, 14)
    run = " ".join(NUMBERS[start : start + rng.randint(3, 6)])
    return f"{rng.choice(NAMES)} counted {run}."


def make_corpus(seed: int = SEED, target_chars: int = TARGET_CHARS) -> str:
    """The built-in corpus: paragraphs separated by blank lines, about ``target_chars`` long."""
    rng = random.Random(seed)
    paragraphs: list[str] = []
    size = 0
    while size < target_chars:
        parts = [_story(rng)]
        for _ in range(rng.randint(1, 3)):
            parts.append(rng.choice((_arithmetic, _counting, _dialogue, _description))(rng))
        paragraph = " ".join(parts)
        paragraphs.append(paragraph)
        size += len(paragraph) + 2
    return "\n\n".join(paragraphs) + "\n"


def train_tokenizer(corpus_path: Path, vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """A byte-level BPE tokenizer trained on the corpus file."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train([str(corpus_path)], trainer)
    return tokenizer


def write_builtin_data(out_dir: Path) -> tuple[Path, Path]:
    """Write ``corpus.txt`` and ``tokenizer.json`` into ``out_dir``; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus_path = out_dir / "corpus.txt"
    corpus_path.write_text(make_corpus(), encoding="utf-8")
    tokenizer_path = out_dir / "tokenizer.json"
    train_tokenizer(corpus_path).save(str(tokenizer_path), pretty=True)
    return corpus_path, tokenizer_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=SHIPPED, help="folder to write into (default: the shipped one)")
    corpus_path, tokenizer_path = write_builtin_data(parser.parse_args().out)
    print(f"wrote {corpus_path} ({corpus_path.stat().st_size:,} bytes) and {tokenizer_path}")


if __name__ == "__main__":
    main()
