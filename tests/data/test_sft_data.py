"""SFT data: response-only labels worked by hand, packing that keeps examples whole and aligned, exact resume
of the loader, local JSON lines records and bad records named by index."""

import json

import pytest
import torch

from titanpod.data import DataError
from titanpod.data.sft.batches import SFTBatches, build_sft_data, pack_examples
from titanpod.data.sft.config import SFTDataConfig
from titanpod.data.sft.records import BadExample, SFTExample, encode_record, example_from_segments
from titanpod.data.sft.tokenizer import CHARS, load_sft_tokenizer
from titanpod.models import IGNORE_INDEX

X = IGNORE_INDEX


@pytest.fixture(scope="module")
def tokenizer():
    return load_sft_tokenizer(CHARS)


def test_labels_cover_only_the_response_and_the_end_token():
    example = example_from_segments([([11, 12, 13], False), ([21, 22], True), ([1], True)])
    assert example.inputs == [11, 12, 13, 21, 22]
    assert example.labels == [X, X, 21, 22, 1]


def test_a_plain_record_by_hand(tokenizer):
    example = encode_record(tokenizer, {"prompt": "ab\n", "response": "c"}, "plain")
    a, b, newline, c = tokenizer.encode("ab\nc")
    assert example.inputs == [a, b, newline, c]
    assert example.labels == [X, X, c, tokenizer.end_id]


def test_a_chat_record_trains_on_the_assistant_turn_only(tokenizer):
    example = encode_record(tokenizer, {"prompt": "x", "response": "y"}, "chat")
    prompt = tokenizer.encode("<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n")
    answer = [*tokenizer.encode("y<|im_end|>\n"), tokenizer.end_id]
    assert example.inputs == (prompt + answer)[:-1]
    assert example.labels == [X] * (len(prompt) - 1) + answer


def test_messages_train_on_every_assistant_turn(tokenizer):
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "a2"},
    ]
    example = encode_record(tokenizer, {"messages": messages}, "plain")
    trained = tokenizer.decode([label for label in example.labels if label != X])
    assert trained == "a1\na2\n"  # each turn's text, <|im_end|> and newline (special tokens are not decoded)
    turn_end = tokenizer.encode("<|im_end|>")[0]
    assert sum(label == turn_end for label in example.labels) == 2 and example.labels[-1] == tokenizer.end_id
    assert tokenizer.decode(example.inputs) == tokenizer.render_chat(messages).replace("<|im_start|>", "").replace(
        "<|im_end|>", ""
    )


def _examples(lengths, first_label=100):
    return [
        SFTExample(list(range(first_label + 10 * i, first_label + 10 * i + n)), [X] + [7 + i] * (n - 1))
        for i, n in enumerate(lengths)
    ]


def test_packing_keeps_examples_whole_and_labels_and_documents_aligned():
    lengths = [5, 3, 7, 2, 8, 1, 4, 6]
    examples = _examples(lengths)
    order = [3, 0, 7, 1, 2, 6, 4, 5]
    rows = pack_examples(examples, order, seq_len=10, pad_id=0)
    seen = []
    for tokens, labels, documents in zip(*(rows_RS.tolist() for rows_RS in rows), strict=True):
        assert len(tokens) == 10 and documents == sorted(documents) and documents[0] == 0
        for document in sorted(set(documents)):
            positions = [i for i, d in enumerate(documents) if d == document]
            assert positions == list(range(positions[0], positions[-1] + 1))  # contiguous
            piece = [tokens[i] for i in positions]
            piece_labels = [labels[i] for i in positions]
            match = [index for index, ex in enumerate(examples) if ex.inputs == piece]
            if match:
                assert piece_labels == examples[match[0]].labels
                seen.append(match[0])
            else:  # the padding: last in its row, pad tokens, ignored labels
                assert positions[-1] == 9 and set(piece) == {0} and set(piece_labels) == {X}
    assert seen == order  # every example once, whole, in the packing order
    assert rows.tokens_RS.shape == (5, 10)  # 2+5 | 6+3 | 7 | 4+1+... greedy in order: [2,5],[6,3],[7],[4],[8,1]


def test_an_example_longer_than_a_row_is_refused():
    with pytest.raises(ValueError, match="Example 0 takes 11 positions"):
        pack_examples(_examples([11]), [0], seq_len=10, pad_id=0)


def _batches(**kwargs):
    examples = _examples([3, 5, 2, 7, 4, 6, 1, 8, 3, 2, 5, 4] * 3)
    return SFTBatches(examples, seq_len=12, batch_size=2, pad_id=0, seed=3, **kwargs)


def test_resume_gives_exactly_the_batches_an_uninterrupted_loader_gives():
    reference = _batches()
    per_epoch = reference.batches_per_epoch
    total = 3 * per_epoch + 2  # crosses epoch boundaries
    expected = [next(reference) for _ in range(total)]
    for stop in (1, per_epoch, per_epoch + 1, 2 * per_epoch + 1):
        first = _batches()
        for _ in range(stop):
            next(first)
        state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
        resumed = _batches()
        resumed.load_state_dict(state)
        for index in range(stop, total):
            assert all(torch.equal(a, b) for a, b in zip(next(resumed), expected[index], strict=True)), (stop, index)
    assert not all(torch.equal(a, b) for a, b in zip(expected[0], expected[per_epoch], strict=True))  # reshuffled


def test_ranks_take_disjoint_slices_and_resume_refuses_other_data():
    ranks = [_batches(rank=rank, world_size=2) for rank in range(2)]
    first = [next(batches)[0] for batches in ranks]
    assert not torch.equal(first[0], first[1])
    other = SFTBatches(_examples([3, 4] * 10), seq_len=12, batch_size=2, pad_id=0)
    with pytest.raises(ValueError, match="examples 36, this run's has 20"):
        other.load_state_dict(ranks[0].state_dict())
    with pytest.raises(ValueError, match="not SFT examples"):
        other.load_state_dict({"kind": "packed", "epoch": 0, "index": 0, "seed": 0})


def test_task_data_describes_itself_and_batches_are_aligned(tokenizer):
    config = SFTDataConfig(task="reverse", train_examples=300, seq_len=64, batch_size=4)
    data = build_sft_data(config, tokenizer, seed=0)
    tokens, labels, documents = next(data.train)
    assert tokens.shape == labels.shape == documents.shape == (4, 64)
    assert "300 examples" in data.describe() and "response tokens only" in data.describe()
    row_tokens, row_labels, row_documents = tokens[0].tolist(), labels[0].tolist(), documents[0].tolist()
    first = [t for t, d in zip(row_tokens, row_documents, strict=True) if d == 0]
    first_labels = [t for t, d in zip(row_labels, row_documents, strict=True) if d == 0]
    text = tokenizer.decode(first)
    word = text.removeprefix("reverse: ").split("\n")[0]
    assert text == f"reverse: {word}\n{word[::-1]}"
    assert tokenizer.decode([t for t in first_labels if t != X]) == word[::-1]
    assert first_labels[-1] == tokenizer.end_id and first_labels.count(X) == len(f"reverse: {word}")


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return str(path)


def test_jsonl_records_of_both_kinds_are_read(tmp_path, tokenizer):
    records = [{"prompt": "reverse: ab\n", "response": "ba"}] * 30 + [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    ] * 30
    path = _write_jsonl(tmp_path / "data.jsonl", records)
    data = build_sft_data(SFTDataConfig(source="jsonl", path=path, seq_len=64, batch_size=2), tokenizer, seed=0)
    assert "60 examples" in data.describe() and data.task is None and not data.skipped


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"prompt": "reverse: ab\n"}, "example 2 of .*: it has no 'response'"),
        ({"prompt": "a", "response": "b" * 80}, r"example 2 of .*: it is 82 tokens .* data.seq_len 64.*--data.seq-len"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "example 2 of .*: its messages hold no assistant"),
        ({"prompt": "a", "response": ""}, "example 2 of .*: its response is empty"),
    ],
)
def test_a_bad_record_is_named_by_index(tmp_path, tokenizer, record, message):
    good = {"prompt": "reverse: ab\n", "response": "ba"}
    path = _write_jsonl(tmp_path / "data.jsonl", [good, good, record, *[good] * 20])
    with pytest.raises(BadExample, match=message):
        build_sft_data(SFTDataConfig(source="jsonl", path=path, seq_len=64, batch_size=2), tokenizer, seed=0)


def test_bad_records_can_be_skipped_and_are_reported(tmp_path, tokenizer):
    good = {"prompt": "reverse: ab\n", "response": "ba"}
    records = [good, {"prompt": "x"}, good, {"prompt": "a", "response": "b" * 80}, *[good] * 20]
    path = _write_jsonl(tmp_path / "data.jsonl", records)
    config = SFTDataConfig(source="jsonl", path=path, seq_len=64, batch_size=2, bad_examples="skip")
    data = build_sft_data(config, tokenizer, seed=0)
    assert len(data.skipped) == 2 and "example 1 of" in data.skipped[0] and "example 3 of" in data.skipped[1]
    assert "skipped 2 bad records" in data.describe() and "22 examples" in data.describe()


def test_too_little_data_and_wrong_fields_are_errors(tmp_path, tokenizer):
    with pytest.raises(DataError, match="fewer than one global batch of 64"):
        build_sft_data(SFTDataConfig(train_examples=10, seq_len=64, batch_size=64), tokenizer, seed=0)
    path = _write_jsonl(tmp_path / "data.jsonl", [{"text": "hello"}] * 5)
    with pytest.raises(DataError, match="has the fields text; SFT records need 'prompt' and 'response'"):
        build_sft_data(SFTDataConfig(source="jsonl", path=path), tokenizer, seed=0)
    with pytest.raises(DataError, match="does not exist"):
        build_sft_data(SFTDataConfig(source="jsonl", path=str(tmp_path / "missing.jsonl")), tokenizer, seed=0)
    with pytest.raises(ValueError, match=r"data.format must be one of plain, chat, got 'chta'. Did you mean 'chat'"):
        SFTDataConfig(format="chta")
