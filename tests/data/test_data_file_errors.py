"""Empty data files and bytes that are not UTF-8 are named: the file, and for bad bytes the line."""

from __future__ import annotations

import gzip

import pytest

from tests.data.data_helpers import documents, private_datasets_cache, write  # noqa: F401 (autouse fixture)
from titanpod.data import DataConfig, DataError, build_data
from titanpod.data.file_checks import first_undecodable
from titanpod.data.sft.config import SFTDataConfig
from titanpod.data.sft.records import read_jsonl_records


def build(**fields):
    return build_data(DataConfig(**fields), vocab_size=2048, seed=0, rank=0, world_size=1)


@pytest.mark.parametrize("kind", ["jsonl", "text", "parquet"])
def test_an_empty_file_among_good_ones_is_named(tmp_path, kind):
    good = write(documents(5), tmp_path, kind, "a")
    empty = good.with_name(f"b{good.suffix}")
    empty.write_bytes(b"")
    with pytest.raises(DataError, match=r"is empty \(0 bytes\)") as error:
        build(source=kind, path=str(tmp_path / f"*{good.suffix}"))
    assert str(empty) in str(error.value) and str(good) not in str(error.value)


@pytest.mark.parametrize(("kind", "streaming"), [("jsonl", False), ("jsonl", True), ("text", False)])
def test_bytes_that_are_not_utf8_are_named_by_file_and_line(tmp_path, kind, streaming):
    write(documents(5), tmp_path, kind, "a")
    bad = tmp_path / ("z.jsonl" if kind == "jsonl" else "z.txt")
    line = b'{"text": "caf\xe9"}\n' if kind == "jsonl" else b"caf\xe9\n"
    bad.write_bytes((b'{"text": "fine"}\n' if kind == "jsonl" else b"fine\n") * 2 + line)
    suffix = bad.suffix
    with pytest.raises(DataError) as error:
        data = build(source=kind, path=str(tmp_path / f"*{suffix}"), streaming=streaming, seq_len=16, batch_size=2)
        for _ in range(50):
            next(data.train)
    message = str(error.value)
    assert f"Cannot read {bad} as {kind}: line 3" in message and "0xe9 is not UTF-8" in message
    assert "iconv" in message and "\n" not in message


def test_sft_records_with_bad_bytes_are_named(tmp_path):
    bad = tmp_path / "chat.jsonl"
    bad.write_bytes(b'{"prompt": "2+2", "response": "4"}\n{"prompt": "caf\xe9", "response": "x"}\n')
    with pytest.raises(DataError, match=r"line 2, byte \d+: 0xe9 is not UTF-8") as error:
        read_jsonl_records(SFTDataConfig(source="jsonl", path=str(bad)))
    assert str(bad) in str(error.value)


def test_compressed_text_is_checked_after_decompression(tmp_path):
    path = tmp_path / "docs.jsonl.gz"
    with gzip.open(path, "wb") as handle:
        handle.write(b'{"text": "ok"}\n{"text": "\xff"}\n')
    found = first_undecodable(str(path))
    assert found is not None and (found.line, found.byte) == (2, 0xFF)
    assert first_undecodable(str(write(documents(3), tmp_path, "jsonl"))) is None


@pytest.mark.parametrize("cut", ["truncated", "not_an_object"])
def test_a_line_that_is_not_json_is_named_shown_and_given_a_way_on(tmp_path, cut, capsys):
    path = write(documents(60), tmp_path, "jsonl")
    lines = path.read_text().splitlines()
    lines[57] = lines[57][:12] if cut == "truncated" else "[1, 2]"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as error:
        build(source="jsonl", path=str(path))
    message = str(error.value)
    assert f"Cannot read {path} as jsonl: line 58 is not a JSON record" in message
    assert repr(lines[57]) in message and f"sed -i '58d' {path}" in message
    with pytest.raises(DataError, match="line 58 is not a JSON record"):
        read_jsonl_records(SFTDataConfig(source="jsonl", path=str(path)))
    assert "Failed to load JSON" not in capsys.readouterr().err  # the library's own line is not printed too


def test_a_record_without_the_text_field_is_named_and_shown(tmp_path):
    path = write(documents(30), tmp_path, "jsonl")
    lines = path.read_text().splitlines()
    lines[20] = '{"body": "no text here"}'
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as error:
        build(source="jsonl", path=str(path))
    message = str(error.value)
    assert f"Record 21 of {path} has no 'text' field" in message and "no text here" in message
    assert "--data.text-field" in message
