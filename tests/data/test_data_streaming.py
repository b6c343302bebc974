"""build_data on streamed data: local files read with streaming=True stand in for a Hub dataset (offline)."""

import json

import pytest
import torch

from tests.data.data_helpers import (  # noqa: F401  (private_datasets_cache: an autouse fixture)
    EOT,
    documents,
    private_datasets_cache,
    same,
    token_stream,
    write,
)
from tests.data.test_data_pipeline import check_document_masking, take
from titanpod.data import DataConfig, DataError, build_data, gather_data_state
from titanpod.data.packing import is_held_out


def flatten(batches, seq_len):
    """The token stream a list of sequential batches was cut from (windows share one token)."""
    stream: list[int] = []
    for batch in batches:
        for row in range(batch[0].shape[0]):
            window = torch.cat([batch[0][row], batch[1][row, -1:]]).tolist()
            assert not stream or stream[-1] == window[0]
            stream.extend(window[1:] if stream else window)
    return stream


def streamed(path, **overrides):
    return DataConfig(source="jsonl", path=str(path), streaming=True, **{"seq_len": 8, "batch_size": 2, **overrides})


def test_a_stream_packs_documents_in_order_and_cycles_epochs(tmp_path):
    docs = documents(12)
    data = build_data(streamed(write(docs, tmp_path, "jsonl")), 2048, 0, 0, 1)
    stream = token_stream(docs)
    batches = take(data.train, 3 * len(stream) // 16)  # about three passes
    got = flatten(batches, 8)
    assert got == (stream * 4)[: len(got)]
    assert data.train.epoch >= 2 and data.validation is None
    assert "streamed in order" in data.describe()


@pytest.mark.parametrize("masking", [False, True])
def test_streaming_resume_is_exact_mid_document_and_across_epochs(tmp_path, masking):
    path = write(documents(10), tmp_path, "jsonl")
    config = streamed(path, seq_len=7, batch_size=3, document_masking=masking)
    expected = take(build_data(config, 2048, 0, 0, 1).train, 40)  # ~3 epochs
    for k in (0, 1, 5, 13, 27):
        first = build_data(config, 2048, 0, 0, 1).train
        take(first, k)
        state = json.loads(json.dumps(first.state_dict()))
        assert state["kind"] == "streaming" and "dataset" in state
        resumed = build_data(config, 2048, 0, 0, 1).train
        resumed.load_state_dict(state)
        assert same(take(resumed, 8), expected[k : k + 8]), f"resumed after {k} batches"
    if masking:
        for batch in expected:
            if (batch[0] == EOT).any():
                check_document_masking(batch)


@pytest.mark.parametrize("files", [1, 2])
def test_each_rank_reads_its_own_shard_of_documents(tmp_path, files):
    docs = documents(24)
    if files == 1:  # one shard: ranks take every other document
        path = write(docs, tmp_path, "jsonl")
        shards = [docs[0::2], docs[1::2]]
    else:  # two shards: one file each
        (tmp_path / "d").mkdir()
        write(docs[:12], tmp_path / "d", "jsonl", "a")
        write(docs[12:], tmp_path / "d", "jsonl", "b")
        path, shards = tmp_path / "d", [docs[:12], docs[12:]]
    config = streamed(path)
    for rank in (0, 1):
        train = build_data(config, 2048, 0, rank, 2).train
        got = flatten(take(train, 10), 8)
        assert got == (token_stream(shards[rank]) * 2)[: len(got)]
        take(train, 3)
        state = json.loads(json.dumps(train.state_dict()))
        expected = take(train, 6)
        resumed = build_data(config, 2048, 0, rank, 2).train
        resumed.load_state_dict(state)
        assert same(take(resumed, 6), expected)


def test_streamed_validation_holds_out_documents_and_resume_stays_exact(tmp_path):
    docs = documents(40)
    path = write(docs, tmp_path, "jsonl")
    config = streamed(path, validation_fraction=0.25, validation_batches=2)
    data = build_data(config, 2048, 0, 0, 1)
    held = [doc for i, doc in enumerate(docs) if is_held_out(i, 0.25)]
    kept = [doc for i, doc in enumerate(docs) if not is_held_out(i, 0.25)]
    batches = take(data.train, 60)  # beyond one epoch
    got = flatten(batches, 8)
    assert got == (token_stream(kept) * 3)[: len(got)]
    validation = flatten(list(data.validation), 8)
    assert validation == token_stream(held)[: len(validation)] and same(data.validation(), list(data.validation))
    resumed = build_data(config, 2048, 0, 0, 1).train
    middle = build_data(config, 2048, 0, 0, 1).train
    take(middle, 33)
    resumed.load_state_dict(json.loads(json.dumps(middle.state_dict())))
    assert same(take(resumed, 10), batches[33:43])


def test_too_little_validation_data_names_the_rank_and_the_fix(tmp_path):
    path = write(documents(20), tmp_path, "jsonl")
    with pytest.raises(DataError, match=r"rank 0 of 1 only \d+ batches.*lower data.validation_batches"):
        build_data(streamed(path, validation_fraction=0.1, validation_batches=50), 2048, 0, 0, 1)


def test_a_single_rank_position_cannot_resume_another_rank_and_per_rank_positions_can(tmp_path):
    path = write(documents(20), tmp_path, "jsonl")
    config = streamed(path)
    ranks = [build_data(config, 2048, 0, rank, 2).train for rank in (0, 1)]
    for train in ranks:
        take(train, 3)
    states = [train.state_dict() for train in ranks]
    expected = [take(train, 4) for train in ranks]
    wrong = build_data(config, 2048, 0, 1, 2).train
    with pytest.raises(ValueError, match="rank 0's of 2"):
        wrong.load_state_dict(states[0])
    both = json.loads(json.dumps({"per_rank": states}))
    for rank in (0, 1):
        resumed = build_data(config, 2048, 0, rank, 2).train
        resumed.load_state_dict(both)
        assert same(take(resumed, 4), expected[rank])
    single = build_data(config, 2048, 0, 0, 1).train
    assert gather_data_state(single) == single.state_dict()  # one rank: no collective
