"""Parallel degrees above 1 in a job of one process are refused before any work, with the torchrun command."""

from __future__ import annotations

import sys

import pytest

from titanpod.device import get_backend
from titanpod.parallel import ParallelConfig, PlanError
from titanpod.pretrain.cli import main as pretrain_main
from titanpod.runs.process_count import check_process_count, required_processes


def test_fsdp_without_torchrun_is_refused_with_the_command_to_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["--parallel.fsdp", "4", "--device.lane", "cpu", "--train.steps", "5"]
    monkeypatch.setattr(sys, "argv", ["/venv/bin/titanpod-pretrain", *args])
    assert pretrain_main(args) == 1
    error = capsys.readouterr().err
    assert "parallel.fsdp=4 needs 4 processes; this is 1" in error
    assert "torchrun --nproc-per-node 4 -m titanpod.pretrain.cli --parallel.fsdp 4 --device.lane cpu" in error
    assert not (tmp_path / "runs").exists()  # refused before the run directory (or anything else) was made


def test_degrees_multiply_and_fsdp_minus_one_takes_what_is_left():
    assert required_processes(ParallelConfig()) == 1
    assert required_processes(ParallelConfig(dp_replicate=2, fsdp=-1, tp=2)) == 4
    cpu = get_backend("cpu")
    with pytest.raises(PlanError, match=r"parallel.dp_replicate=2, parallel.tp=2 needs 4 processes") as error:
        check_process_count(ParallelConfig(dp_replicate=2, tp=2), cpu, 1, "titanpod.pretrain.cli", ["pytest", "-x"])
    assert "-m titanpod.pretrain.cli <the same arguments>" in str(error.value)
    check_process_count(ParallelConfig(fsdp=4), cpu, 4, "titanpod.pretrain.cli")  # torchrun started them


def test_a_single_controller_lane_drives_every_device_from_one_process():
    class SingleController:
        single_controller = True

    check_process_count(ParallelConfig(fsdp=4, tp=2), SingleController(), 1, "titanpod.pretrain.cli")
