"""build_data on map-style data: local files through the datasets library, the built-in corpus, synthetic ids."""

import json

import pytest
import torch

from tests.data.data_helpers import (  # noqa: F401  (private_datasets_cache: an autouse fixture)
    EOT,
    TOKENIZER,
    documents,
    private_datasets_cache,
    same,
    token_stream,
    window_offsets,
    write,
)
from titanpod.data import (
    DataConfig,
    PackedBatches,
    build_data,
    builtin_corpus_path,
    builtin_tokenizer_path,
    pack_documents,
)
from titanpod.data.packing import is_held_out
from titanpod.models import IGNORE_INDEX


def take(iterator, count):
    return [next(iterator) for _ in range(count)]


@pytest.mark.parametrize("kind", ["json", "jsonl", "parquet", "text"])
def test_local_files_give_windows_of_the_hand_tokenized_stream(tmp_path, kind):
    docs = documents(40)
    path = write(docs, tmp_path, kind)
    data = build_data(DataConfig(source=kind, path=str(path), seq_len=16, batch_size=4), 2048, 0, 0, 1)
    stream = token_stream(docs)
    epoch = take(data.train, data.train.batches_per_epoch)
    offsets = window_offsets(epoch, stream, 16)
    assert len(set(offsets)) == len(offsets) == data.train.batches_per_epoch * 4
    assert data.train.windows_WS.shape[0] == (len(stream) - 1) // 16  # every window of the stream is in play
    assert all(b[0].dtype == b[1].dtype == torch.int64 and b[0].shape == (4, 16) for b in epoch)
    assert data.validation is None
    assert f"{kind} {path}" in data.describe() and "40 documents" in data.describe()


def test_a_directory_and_a_glob_read_every_matching_file_in_name_order(tmp_path):
    docs = documents(60)
    (tmp_path / "shards").mkdir()
    write(docs[:30], tmp_path / "shards", "jsonl", "part-0")
    write(docs[30:], tmp_path / "shards", "jsonl", "part-1")
    (tmp_path / "shards" / "README.md").write_text("not data")
    stream = token_stream(docs)
    for path in (tmp_path / "shards", tmp_path / "shards" / "*.jsonl"):
        data = build_data(DataConfig(source="jsonl", path=str(path), seq_len=16, batch_size=2), 2048, 0, 0, 1)
        window_offsets(take(data.train, 5), stream, 16)
        assert "(2 files)" in data.describe()


def test_builtin_default_gives_exactly_the_batches_of_packed_batches_over_the_corpus():
    data = build_data(DataConfig(), vocab_size=2048, seed=0, rank=0, world_size=1)
    tokenizer = TOKENIZER
    corpus = builtin_corpus_path().read_text(encoding="utf-8").split("\n\n")
    reference = PackedBatches(pack_documents(corpus, tokenizer, EOT), seq_len=256, batch_size=8, seed=0)
    count = reference.batches_per_epoch + 3  # into the second epoch
    assert same(take(data.train, count), take(reference, count))
    assert data.train.state_dict() | {"kind": "packed"} == reference.state_dict() | {"kind": "packed"}
    assert builtin_tokenizer_path().name == "tokenizer.json"


def test_map_style_resume_is_exact_across_an_epoch_boundary(tmp_path):
    path = write(documents(30), tmp_path, "jsonl")
    config = DataConfig(source="jsonl", path=str(path), seq_len=8, batch_size=3)
    reference = build_data(config, 2048, seed=5, rank=0, world_size=1).train
    per_epoch = reference.batches_per_epoch
    expected = take(reference, per_epoch + 6)
    first = build_data(config, 2048, seed=5, rank=0, world_size=1).train
    take(first, per_epoch - 2)
    state = json.loads(json.dumps(first.state_dict()))
    resumed = build_data(config, 2048, seed=99, rank=0, world_size=1).train  # the seed comes from the state
    resumed.load_state_dict(state)
    assert same(take(resumed, 8), expected[per_epoch - 2 :])


def test_two_ranks_take_disjoint_halves_of_each_global_batch(tmp_path):
    path = write(documents(60), tmp_path, "parquet")
    config = DataConfig(source="parquet", path=str(path), seq_len=16, batch_size=2)
    rank0 = build_data(config, 2048, 3, 0, 2).train
    rank1 = build_data(config, 2048, 3, 1, 2).train
    whole = build_data(DataConfig(source="parquet", path=str(path), seq_len=16, batch_size=4), 2048, 3, 0, 1).train
    for _ in range(rank0.batches_per_epoch):
        a, b, both = next(rank0), next(rank1), next(whole)
        assert torch.equal(torch.cat([a[0], b[0]]), both[0]) and torch.equal(torch.cat([a[1], b[1]]), both[1])
        starts = {tuple(row.tolist()) for row in a[0]}
        assert not starts & {tuple(row.tolist()) for row in b[0]}


def check_document_masking(batch):
    """Ids are equal within a document and rise by one right after each separator; labels across are ignored."""
    tokens, labels, ids = batch
    assert ids.shape == tokens.shape and ids.dtype in (torch.int32, torch.int64)
    assert (ids[:, 0] == 0).all()
    is_separator = tokens == EOT
    steps = ids[:, 1:] - ids[:, :-1]
    assert torch.equal(steps, is_separator[:, :-1].to(steps.dtype))
    assert (labels[is_separator] == IGNORE_INDEX).all()
    assert (labels[~is_separator] != IGNORE_INDEX).all()
    assert is_separator.any()  # the test data has boundaries inside sequences


def test_document_masking_marks_documents_and_ignores_labels_across_boundaries(tmp_path):
    docs = documents(40)
    path = write(docs, tmp_path, "jsonl")
    config = DataConfig(source="jsonl", path=str(path), seq_len=32, batch_size=4, document_masking=True)
    data = build_data(config, 2048, 0, 0, 1)
    stream = token_stream(docs)
    for batch in take(data.train, data.train.batches_per_epoch):
        check_document_masking(batch)
        tokens, labels, _ = batch
        offsets = window_offsets([(tokens, torch.where(labels == IGNORE_INDEX, EOT, labels))], stream, 32)
        for row, offset in enumerate(offsets):
            kept = labels[row] != IGNORE_INDEX
            assert torch.equal(labels[row][kept], torch.tensor(stream[offset + 1 : offset + 33])[kept])
    assert "document masking" in data.describe()


def test_held_out_documents_never_reach_training_and_validation_is_fixed(tmp_path):
    docs = documents(80)
    path = write(docs, tmp_path, "jsonl")
    config = DataConfig(
        source="jsonl", path=str(path), seq_len=8, batch_size=2, validation_fraction=0.25, validation_batches=3
    )
    data = build_data(config, 2048, 0, 0, 1)
    held = [doc for i, doc in enumerate(docs) if is_held_out(i, 0.25)]
    kept = [doc for i, doc in enumerate(docs) if not is_held_out(i, 0.25)]
    assert len(held) == 20 and held[0].startswith("record 0003")  # evenly spread: every 4th document
    window_offsets(take(data.train, 2 * data.train.batches_per_epoch), token_stream(kept), 8)
    first, second = list(data.validation), data.validation()
    assert len(first) == 3 and same(first, second) and same(first, list(data.validation))
    window_offsets(first, token_stream(held), 8)
    assert "3 batches from 20 held-out documents" in data.describe()


def test_builtin_corpus_with_validation_and_masking(tmp_path):
    config = DataConfig(seq_len=64, batch_size=4, validation_fraction=0.05, document_masking=True)
    data = build_data(config, 2048, 0, 0, 1)
    assert len(data.validation) == 8
    check_document_masking(data.validation.batches[0])
    check_document_masking(next(data.train))


def test_synthetic_batches_are_random_ids_with_exact_resume():
    config = DataConfig(source="synthetic", seq_len=16, batch_size=4, validation_fraction=0.1, validation_batches=2)
    data = build_data(config, vocab_size=500, seed=1, rank=0, world_size=1)
    batches = take(data.train, 6)
    tokens, labels = batches[0]
    assert tokens.dtype == torch.int64 and tokens.shape == (4, 16) and int(tokens.max()) < 500
    assert torch.equal(tokens[:, 1:], labels[:, :-1])
    again = build_data(config, vocab_size=500, seed=1, rank=0, world_size=1).train
    take(again, 2)
    state = json.loads(json.dumps(again.state_dict()))
    resumed = build_data(config, vocab_size=500, seed=1, rank=0, world_size=1).train
    resumed.load_state_dict(state)
    assert same(take(resumed, 4), batches[2:])
    other_rank = build_data(config, vocab_size=500, seed=1, rank=1, world_size=2).train
    assert not torch.equal(next(other_rank)[0], tokens)
    assert same(list(data.validation), data.validation()) and len(data.validation) == 2
    masked = build_data(DataConfig(source="synthetic", document_masking=True), 500, 0, 0, 1)
    assert len(next(masked.train)) == 3 and masked.validation is None
    assert "synthetic" in data.describe()


def test_a_resumed_loader_refuses_a_position_from_another_kind_of_loader(tmp_path):
    synthetic = build_data(DataConfig(source="synthetic"), 2048, 0, 0, 1).train
    packed = build_data(DataConfig(seq_len=64), 2048, 0, 0, 1).train
    with pytest.raises(ValueError, match="synthetic loader"):
        packed.load_state_dict(synthetic.state_dict())
    with pytest.raises(ValueError, match="packed loader"):
        synthetic.load_state_dict(packed.state_dict())
