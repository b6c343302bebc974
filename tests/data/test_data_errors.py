"""Bad data settings and bad data fail at build time with a message that names the thing and the fix."""

import dataclasses

import pytest

from tests.data.data_helpers import documents, private_datasets_cache, write  # noqa: F401 (autouse fixture)
from titanpod.data import DataConfig, DataError, build_data, builtin_tokenizer_path


def build(**fields):
    return build_data(DataConfig(**fields), vocab_size=2048, seed=0, rank=0, world_size=1)


@pytest.mark.parametrize("streaming", [False, True])
def test_a_glob_that_matches_nothing_names_the_pattern(tmp_path, streaming):
    pattern = str(tmp_path / "nothing-*.jsonl")
    with pytest.raises(DataError, match="matches no files") as error:
        build(source="jsonl", path=pattern, streaming=streaming)
    assert pattern in str(error.value)


def test_a_missing_path_and_an_empty_directory_are_named(tmp_path):
    with pytest.raises(DataError, match="does not exist") as error:
        build(source="parquet", path=str(tmp_path / "missing.parquet"))
    assert "missing.parquet" in str(error.value)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.md").write_text("no data here")
    with pytest.raises(DataError, match=r"no \.parquet files") as error:
        build(source="parquet", path=str(tmp_path / "empty"))
    assert str(tmp_path / "empty") in str(error.value)


@pytest.mark.parametrize(
    ("kind", "content"),
    [("jsonl", b'{"text": "fine"}\n{broken json\n'), ("parquet", b"not a parquet file"), ("text", b"\xff\xfe bad")],
)
@pytest.mark.parametrize("streaming", [False, True])
def test_a_file_that_does_not_parse_is_named_in_one_line(tmp_path, kind, content, streaming):
    good = write(documents(5), tmp_path, kind, "good")
    bad = good.with_name(f"bad{good.suffix}")
    bad.write_bytes(content)
    with pytest.raises(DataError, match="Cannot read") as error:
        build(source=kind, path=str(bad), streaming=streaming)
    message = str(error.value)
    assert str(bad) in message and "\n" not in message
    with pytest.raises(DataError, match="Cannot read") as error:  # among several files, the bad one is named
        build(source=kind, path=str(tmp_path / f"*{good.suffix}"), streaming=streaming)
    assert str(bad) in str(error.value) and "one of" not in str(error.value)


def test_a_bad_file_met_while_streaming_is_named_then(tmp_path):
    write(documents(30), tmp_path, "jsonl", "a")
    (tmp_path / "z.jsonl").write_text('{"text": "fine"}\n{broken json\n', encoding="utf-8")
    data = build(source="jsonl", path=str(tmp_path / "*.jsonl"), streaming=True, seq_len=16, batch_size=2)
    with pytest.raises(DataError, match="Cannot read") as error:
        for _ in range(100):
            next(data.train)
    assert str(tmp_path / "z.jsonl") in str(error.value)


@pytest.mark.parametrize("streaming", [False, True])
def test_a_text_field_that_is_not_a_column_lists_the_columns_and_the_closest(tmp_path, streaming):
    path = write(documents(5), tmp_path, "jsonl")
    with pytest.raises(DataError, match="'txet' is not a column") as error:
        build(source="jsonl", path=str(path), text_field="txet", streaming=streaming)
    assert "id, text" in str(error.value) and "Did you mean 'text'?" in str(error.value)


def test_a_text_field_that_holds_no_strings_is_named(tmp_path):
    path = write(documents(5), tmp_path, "jsonl")
    with pytest.raises(DataError, match="'id' holds int values"):
        build(source="jsonl", path=str(path), text_field="id")


def test_an_unknown_source_suggests_the_closest():
    with pytest.raises(ValueError, match=r"Unknown data.source 'jsonlines'.*Did you mean 'jsonl'"):
        DataConfig(source="jsonlines", path="x.jsonl")


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"source": "jsonl"}, "needs data.path"),
        ({"source": "hub"}, "needs data.path: a Hub dataset id"),
        ({"path": "x.jsonl"}, "data.path is not read for data.source 'builtin'"),
        ({"name": "en"}, "data.name"),
        ({"streaming": True}, "data.streaming applies to the local file sources"),
        ({"source": "jsonl", "path": "x", "shuffle_buffer": 100}, "shuffle_buffer applies only to streamed"),
        ({"validation_fraction": 1.0}, "data.validation_fraction must be"),
        ({"validation_split": "validation"}, "hold out documents with data.validation_fraction"),
        ({"source": "hub", "path": "a/b", "validation_fraction": 0.1}, "data.validation_split"),
        ({"validation_batches": 0}, "data.validation_batches"),
        ({"seq_len": 1}, "data.seq_len"),
        ({"text_field": ""}, "data.text_field"),
    ],
)
def test_inconsistent_settings_are_refused_naming_the_field(fields, expected):
    with pytest.raises(ValueError, match=expected):
        DataConfig(**fields)


def test_a_tokenizer_larger_than_the_model_vocabulary_gives_both_sizes():
    with pytest.raises(ValueError, match=r"has 1,152 tokens but the model's vocabulary has 1,000 rows") as error:
        build_data(DataConfig(), vocab_size=1000, seed=0, rank=0, world_size=1)
    assert "--data.tokenizer" in str(error.value)


def test_too_little_data_for_one_global_batch(tmp_path):
    path = write(documents(3), tmp_path, "jsonl")
    with pytest.raises(ValueError, match="fewer than one global batch of 16"):
        build_data(DataConfig(source="jsonl", path=str(path), seq_len=64, batch_size=8), 2048, 0, 0, 2)
    with pytest.raises(DataError, match=r"held-out validation data .* too small"):
        build(seq_len=256, validation_fraction=0.001)


def test_a_tokenizer_path_or_directory_loads_and_a_missing_one_is_named(tmp_path):
    folder = builtin_tokenizer_path().parent
    data = build(tokenizer=str(folder), seq_len=32)
    assert next(data.train)[0].shape == (8, 32)
    with pytest.raises(FileNotFoundError, match=r"nowhere/tokenizer\.json"):
        build(tokenizer=str(tmp_path / "nowhere" / "tokenizer.json"))


def offline(monkeypatch):
    import datasets
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read at import time
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)


def test_a_hub_tokenizer_offline_names_the_id_and_suggests_a_local_path(monkeypatch):
    offline(monkeypatch)
    with pytest.raises(ValueError, match=r"'meta-llama/Llama-3\.1-8B'") as error:
        build(tokenizer="meta-llama/Llama-3.1-8B")
    assert "--data.tokenizer path/to/tokenizer.json" in str(error.value)


def test_a_hub_dataset_offline_names_the_dataset_and_suggests_local_files(monkeypatch):
    offline(monkeypatch)
    config = dataclasses.replace(DataConfig(source="hub", path="allenai/c4", name="en"))
    with pytest.raises(DataError, match="Cannot stream the Hub dataset 'allenai/c4' \\(config 'en'") as error:
        build_data(config, 2048, 0, 0, 1)
    assert "--data.source jsonl|parquet|text --data.path" in str(error.value)
