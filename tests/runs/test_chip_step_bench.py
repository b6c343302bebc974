"""``tools/bench/chip_step.py`` off the chip: which lane a configuration runs, what a failed run reports, and a
measured run of the debug recipe on this machine's xla lane (JAX's CPU; the figures are not a chip's)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tests.bench_tools import load_bench


def _bench():
    return load_bench("chip_step")


def test_a_configuration_runs_on_the_xla_lane_unless_its_flags_name_another():
    bench = _bench()
    table = bench.CONFIGURATIONS
    assert bench.lane_of(bench.flags_of("qwen3_0.6b", table)) == "xla"
    assert bench.lane_of(bench.flags_of("qwen3_0.6b_tpu_lane", table)) == "tpu"
    assert bench.lane_of(["--device.lane", "tpu", "--device.lane", "xla"]) == "xla"


def test_the_xla_ratio_is_given_only_beside_the_same_flags_on_the_xla_lane(capsys):
    bench = _bench()
    table = bench.CONFIGURATIONS

    def row(name: str, tokens: float) -> dict:
        flags = " ".join(bench.flags_of(name, table))
        return {"name": name, "flags": flags, "tokens_per_second": tokens, "tflops_per_second": 1.0, "mfu": 0.5}

    names = {"qwen3_0.6b": 1000.0, "qwen3_0.6b_tpu_lane": 950.0, "qwen3_0.6b_2x4096": 800.0,
             "qwen3_0.6b_2x4096_tpu_lane": 880.0, "llama3.2_1b_offload": 500.0}  # fmt: skip
    bench.show([row(name, tokens) for name, tokens in names.items()], None)
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert lines["qwen3_0.6b_tpu_lane"][-1] == "0.95"
    assert lines["qwen3_0.6b_2x4096_tpu_lane"][-1] == "1.10"  # beside the xla lane at 2 sequences, not at 4
    assert lines["qwen3_0.6b"][-1] == lines["qwen3_0.6b_2x4096"][-1] == "-"  # xla-lane runs: no ratio
    assert lines["llama3.2_1b_offload"][-1] == "-"  # no tpu-lane twin ran


def test_a_failed_runs_summary_leads_with_the_error_line_not_the_graph_dump_after_it():
    output = "\n".join(
        ["loading...", "torch._dynamo.exc.BackendCompilerFailed: backend='tpu' raised:",
         "RuntimeError: RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm",
         "While executing %call(" + ", ".join(f"%arg{i}_1" for i in range(900)) + ")"]
    )  # fmt: skip
    summary = _bench().error_summary(output)
    assert summary.startswith("torch._dynamo.exc.BackendCompilerFailed: backend='tpu' raised:")
    assert "RESOURCE_EXHAUSTED: Ran out of memory" in summary
    assert len(summary) < 1600


def test_a_run_is_measured_and_a_refused_one_keeps_its_whole_output(tmp_path):
    bench = _bench()
    flags = ["--recipe", "llama3_debug", "--data.batch-size", "2", "--data.seq-len", "64"]
    measured = bench.measure("debug", flags, 6, tmp_path / "runs", tmp_path / "logs")
    assert measured["exit"] == 0, measured.get("error")
    assert measured["tokens_per_second"] > 0 and len(measured["losses"]) >= 1
    refused = bench.measure("refused", ["--recipe", "llama3_debug", "--train.lr", "fast"], 2, tmp_path / "runs",
                            tmp_path / "logs")  # fmt: skip
    assert refused["exit"] == 2
    assert "train.lr" in Path(refused["log"]).read_text()
    assert "train.lr" in refused["error"]


def test_a_run_past_its_time_is_stopped_with_what_it_wrote(tmp_path):
    bench = _bench()
    flags = ["--recipe", "llama3_debug", "--data.batch-size", "2", "--data.seq-len", "64"]
    stopped = bench.measure("long", flags, 100_000, tmp_path / "runs", tmp_path / "logs", timeout=4)
    assert stopped["exit"] is None
    assert stopped["error"].startswith("stopped after 4 s")
    assert "stopped by chip_step after 4 s" in Path(stopped["log"]).read_text()


def test_maxtexts_columns_come_from_the_compare_bench_json_and_skip_an_estimate_that_is_not_positive(capsys):
    bench = _bench()
    maxtext = {
        "qwen3_06b": {"batch": 4, "seq_len": 4096, "maxtext_hbm_gib": 16.0, "maxtext_estimated_seconds": -98.8},
        "llama32_1b": {"batch": 2, "seq_len": 4096, "maxtext_hbm_gib": 10.0, "maxtext_estimated_seconds": 0.5},
    }
    qwen = {"name": "qwen3_0.6b_tpu_lane", "program_memory_gib": 12.0}
    assert bench.maxtext_columns(qwen, maxtext) == {
        "maxtext_hbm_gib": 16.0,
        "maxtext_refused": None,
        "hbm_of_maxtext": 0.75,
        "maxtext_estimated_tokens_per_second": None,
    }
    refused = {**maxtext["qwen3_06b"], "maxtext_hbm_gib": None, "maxtext_refused": "17.07 GiB of temporaries"}
    assert bench.maxtext_columns(qwen, {"qwen3_06b": refused})["hbm_of_maxtext"] is None
    llama = bench.maxtext_columns({"name": "llama3.2_1b_offload", "program_memory_gib": 14.0}, maxtext)
    assert llama["hbm_of_maxtext"] == 1.4 and llama["maxtext_estimated_tokens_per_second"] == 2 * 4096 / 0.5
    assert bench.maxtext_columns({"name": "qwen3_0.6b_sdpa"}, maxtext)["maxtext_hbm_gib"] is None

    flags = " ".join(bench.flags_of("llama3.2_1b_offload", bench.CONFIGURATIONS))
    row = {"name": "llama3.2_1b_offload", "flags": flags, "tokens_per_second": 4000.0, "tflops_per_second": 40.0,
           "mfu": 0.2, "program_memory_gib": 14.0}  # fmt: skip
    bench.show([row], None, maxtext)
    header, line = capsys.readouterr().out.splitlines()
    assert header.split()[-7:] == ["MaxText", "GiB", "of", "MaxText", "MaxText", "est.", "tok/s"]
    assert line.split()[-3:] == ["10.00", "1.40", "16,384"]


def test_a_step_of_several_micro_batches_counts_all_their_tokens():
    bench = _bench()
    table = bench.CONFIGURATIONS
    assert bench._tokens_per_step(bench.flags_of("llama3.2_1b_offload", table)) == 2 * 4096
    accumulated = [*bench.flags_of("llama3.2_1b_offload", table), "--train.grad-accum-steps", "16"]
    assert bench._tokens_per_step(accumulated) == 16 * 2 * 4096


def test_a_maxtext_step_refused_for_the_chips_memory_reads_refused(capsys):
    bench = _bench()
    maxtext = {"llama32_1b": {"batch": 2, "seq_len": 4096, "maxtext_hbm_gib": None, "maxtext_estimated_seconds": 0.0,
                              "maxtext_refused": "17.07 GiB of temporaries, over the chip's 15.75"}}  # fmt: skip
    flags = " ".join(bench.flags_of("llama3.2_1b_offload", bench.CONFIGURATIONS))
    row = {"name": "llama3.2_1b_offload", "flags": flags, "tokens_per_second": 4000.0, "tflops_per_second": 40.0,
           "mfu": 0.2, "program_memory_gib": 14.8}  # fmt: skip
    bench.show([row], None, maxtext)
    assert capsys.readouterr().out.splitlines()[1].split()[-3:] == ["refused", "-", "-"]


def test_a_missing_or_foreign_maxtext_file_is_refused_naming_it_and_how_to_make_it(tmp_path, capsys):
    bench = _bench()
    parser = argparse.ArgumentParser(prog="chip_step.py")
    foreign = tmp_path / "other.json"
    foreign.write_text('{"qwen3_06b": {"hbm": 1}}')
    for path in (tmp_path / "missing.json", foreign):
        with pytest.raises(SystemExit):
            bench.read_maxtext(path, parser)
        said = capsys.readouterr().err
        assert f"--maxtext {path}" in said and "tpu_aot_vs_maxtext.py" in said
    good = tmp_path / "maxtext.json"
    good.write_text('{"qwen3_06b": {"maxtext_hbm_gib": 15.0}}')
    assert bench.read_maxtext(good, parser) == {"qwen3_06b": {"maxtext_hbm_gib": 15.0}}


def test_an_interrupted_bench_stops_the_run_it_started(monkeypatch):
    """A run is in a session of its own (so that a timeout stops all it started), out of reach of the terminal's
    Ctrl-C: left running it would hold the chip after the bench has gone."""
    import signal
    import subprocess
    import sys

    bench = _bench()
    started = []
    communicate = subprocess.Popen.communicate

    def interrupted(self, *args, **kwargs):
        if not started:
            started.append(self)
            raise KeyboardInterrupt
        return communicate(self, *args, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "communicate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bench._run([sys.executable, "-c", "import time; time.sleep(60)"], {}, timeout=120)
    assert started[0].returncode == -signal.SIGKILL
