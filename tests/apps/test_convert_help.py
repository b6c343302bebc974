"""``titanpod-convert``'s command line: help lists the subcommands and their options, choices are checked."""

from __future__ import annotations

import pytest

from titanpod.pretrain.convert import ExportCommand, PushCommand, parse_command


def test_help_lists_subcommands_and_export_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as top:
        parse_command(["--help"])
    assert top.value.code == 0
    text = capsys.readouterr().out
    assert all(name in text for name in ("import", "export", "push"))
    with pytest.raises(SystemExit) as export:
        parse_command(["export", "--help"])
    assert export.value.code == 0
    text = capsys.readouterr().out
    for option in ("--max-shard-size", "--dtype", "--overwrite", "float32", "bfloat16", "float16", "CHECKPOINT"):
        assert option in text
    assert "``" not in text


def test_bad_dtype_fails_at_parse_time_naming_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as error:
        parse_command(["export", "a", "b", "--dtype", "fp8"])
    assert error.value.code == 2
    message = capsys.readouterr().err
    assert "fp8" in message and "bfloat16" in message


def test_old_forms_still_parse() -> None:
    push = parse_command(["push", "f", "acme/x", "--branch", "dev", "--public", "--create-pr", "True"])
    assert isinstance(push, PushCommand)
    assert (push.revision, push.private, push.create_pr) == ("dev", False, True)
    export = parse_command(["export", "ckpt", "out", "--dtype", "bfloat16", "--overwrite"])
    assert isinstance(export, ExportCommand)
    assert (export.dtype, export.overwrite, str(export.out)) == ("bfloat16", True, "out")
