"""A task from a user's own rows: JSON lines and Parquet files, named columns, the held-out split, and an error
naming the file, column or row and the fix for each way the rows can be wrong."""

import json

import datasets
import pytest

from titanpod.data.sources import DataError
from titanpod.data.task_files import TaskSource, load_file_task, read_rows
from titanpod.data.tasks import split_of

ROWS = [{"question": f"What is {a} plus {a + 1}?", "target": 2 * a + 1, "level": a % 3} for a in range(60)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def source(path, **columns):
    return TaskSource(str(path), **{"prompt_column": "question", "answer_column": "target", **columns})


def test_jsonl_rows_become_examples_with_their_whole_row(tmp_path):
    task = load_file_task(source(write_jsonl(tmp_path / "q.jsonl", ROWS)), None, numeric=False)
    train, test = task.examples("train", 10, seed=0), task.examples("test", 100, seed=0)
    by_prompt = {row["question"]: row for row in ROWS}
    for example in train + test:
        row = by_prompt[example.prompt]
        assert example.answer == str(row["target"]) and example.fields() == row
    assert task.name == "q.jsonl" and len(train) == 10


def test_parquet_reads_like_jsonl(tmp_path):
    datasets.Dataset.from_list(ROWS).to_parquet(str(tmp_path / "q.parquet"))
    write_jsonl(tmp_path / "q.jsonl", ROWS)
    assert read_rows(source(tmp_path / "q.parquet")) == read_rows(source(tmp_path / "q.jsonl"))


def test_without_a_held_out_file_the_rows_split_by_prompt_hash(tmp_path):
    task = load_file_task(source(write_jsonl(tmp_path / "q.jsonl", ROWS)), None, numeric=False)
    train = task.examples("train", len(task.rows["train"]), seed=0)
    test = task.examples("test", 1000, seed=0)  # fewer held-out rows than asked: all of them
    assert {e.prompt for e in train} | {e.prompt for e in test} == {row["question"] for row in ROWS}
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    assert {e.prompt for e in test} == {row["question"] for row in ROWS if split_of(row["question"]) == "test"}
    assert task.examples("train", 5, seed=3) == task.examples("train", 5, seed=3)


def test_a_held_out_file_gives_the_test_rows(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", ROWS[:40])
    test = write_jsonl(tmp_path / "test.jsonl", ROWS[40:])
    task = load_file_task(source(train), source(test), numeric=True)
    assert {e.prompt for e in task.examples("test", 100, seed=0)} == {row["question"] for row in ROWS[40:]}
    assert len(task.examples("train", 40, seed=0)) == 40
    assert task.reward("p", "the sum is 81", "81") == 1.0 and task.reward("p", "81 or 80", "81") == 0.0


def test_a_missing_file_is_named_with_the_fix(tmp_path):
    with pytest.raises(DataError, match=r"grpo.data_path '.*nothere.jsonl': no such file.*Check the path"):
        read_rows(source(tmp_path / "nothere.jsonl"))


def test_a_file_that_is_not_jsonl_or_parquet_is_refused(tmp_path):
    (tmp_path / "q.csv").write_text("question,target\n")
    with pytest.raises(DataError, match=r"neither a .jsonl, .json, .parquet file nor hub:owner/name"):
        read_rows(source(tmp_path / "q.csv"))


def test_a_missing_column_names_the_columns_there_and_the_flag(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", ROWS)
    columns = r"no column 'prompt' \(its columns: question, target, level\).*--grpo.prompt-column"
    with pytest.raises(DataError, match=columns):
        read_rows(TaskSource(str(path)))
    with pytest.raises(DataError, match=r"no column 'answer'.*--grpo.answer-column"):
        read_rows(TaskSource(str(path), prompt_column="question"))


def test_a_row_without_prompt_text_is_named(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", [*ROWS[:3], {"question": None, "target": 1, "level": 0}])
    with pytest.raises(DataError, match=r"Row 3 of .*q.jsonl has no prompt text in column 'question'"):
        load_file_task(source(path), None, numeric=False)


def test_too_few_training_rows_for_a_step_says_what_to_lower(tmp_path):
    task = load_file_task(source(write_jsonl(tmp_path / "q.jsonl", ROWS[:5])), None, numeric=False)
    with pytest.raises(DataError, match=r"fewer than the 64 prompts a step takes: lower --grpo.prompts-per-step"):
        task.examples("train", 64, seed=0)


def test_an_unreadable_hub_dataset_says_to_check_the_name_or_use_a_file(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match=r"cannot load the Hub dataset 'someone/none' \(split 'train'\).*local"):
        read_rows(TaskSource("hub:someone/none"))


def test_an_empty_prompts_file_says_so_as_pretraining_does(tmp_path):
    empty = tmp_path / "prompts.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match=r"is empty \(0 bytes\): no prompts to read"):
        read_rows(TaskSource(str(empty)))
