"""Packing documents into windows and serving reproducible, resumable batches."""

import pytest
import torch

from titanpod.data import PackedBatches, builtin_tokenizer_path, load_tokenizer, pack_documents


def test_documents_are_concatenated_with_a_separator():
    tokenizer = load_tokenizer(builtin_tokenizer_path())
    stream = pack_documents(["Ada walked.", "Ben ran."], tokenizer, separator_id=0)
    first = tokenizer.encode("Ada walked.", add_special_tokens=False).ids
    second = tokenizer.encode("Ben ran.", add_special_tokens=False).ids
    assert stream.tolist() == [*first, 0, *second, 0]


def test_labels_are_inputs_shifted_by_one_and_windows_do_not_overlap():
    stream = torch.arange(1000)
    batches = PackedBatches(stream, seq_len=10, batch_size=4, seed=0)
    seen = []
    for _ in range(batches.batches_per_epoch):
        inputs, labels = next(batches)
        assert inputs.shape == labels.shape == (4, 10)
        assert torch.equal(labels, inputs + 1)
        seen.extend(inputs[:, 0].tolist())
    assert len(seen) == len(set(seen))
    assert all(start % 10 == 0 for start in seen)


def test_resuming_from_state_dict_gives_the_same_batches():
    stream = torch.arange(500)
    reference = PackedBatches(stream, seq_len=8, batch_size=3, seed=7)
    expected = [next(reference) for _ in range(50)]  # crosses several epochs
    resumed = PackedBatches(stream, seq_len=8, batch_size=3, seed=7)
    for _ in range(23):
        next(resumed)
    state = resumed.state_dict()
    fresh = PackedBatches(stream, seq_len=8, batch_size=3, seed=0)
    fresh.load_state_dict(state)
    for inputs, labels in expected[23:]:
        got_inputs, got_labels = next(fresh)
        assert torch.equal(got_inputs, inputs) and torch.equal(got_labels, labels)


def test_ranks_take_disjoint_slices_of_each_global_batch():
    stream = torch.arange(2000)
    rank0 = PackedBatches(stream, seq_len=10, batch_size=2, seed=1, rank=0, world_size=2)
    rank1 = PackedBatches(stream, seq_len=10, batch_size=2, seed=1, rank=1, world_size=2)
    for _ in range(5):
        a, _ = next(rank0)
        b, _ = next(rank1)
        assert not set(a[:, 0].tolist()) & set(b[:, 0].tolist())


def test_too_little_data_is_a_clear_error():
    with pytest.raises(ValueError, match="fewer than one global batch"):
        PackedBatches(torch.arange(50), seq_len=10, batch_size=8)
