"""``tools/bench/tpu_aot_vs_maxtext.py``'s parts that need no compile: MaxText's figures extrapolated by depth, its
memory taken from a scanned full-depth compile, and the table built from reports already on disk."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "tools" / "bench" / "tpu_aot_vs_maxtext.py"
GiB = 1024**3


def _bench():
    spec = importlib.util.spec_from_file_location("tpu_aot_vs_maxtext", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _maxtext(layers: int, temporaries: int, flops: float, seconds: float, compile_seconds: float) -> dict:
    return {
        "layers": layers,
        "memory_per_chip": {
            "argument_bytes": 4 * GiB,
            "output_bytes": 4 * GiB,
            "alias_bytes": 4 * GiB,
            "temporary_bytes": temporaries,
            "generated_code_bytes": 0,
        },
        "cost_per_chip": {"flops": flops, "bytes_accessed": 0.0, "optimal_seconds": seconds},
        "compile_seconds": compile_seconds,
    }


def test_maxtext_figures_extrapolate_on_the_line_through_two_depths():
    bench = _bench()
    low = _maxtext(2, 10 * GiB, 100e12, 0.2, 30.0)
    high = _maxtext(4, 14 * GiB, 160e12, 0.3, 50.0)
    whole = bench.extrapolated(low, high, 80)
    # 2 -> 4 layers adds 2 GiB, 30 TFLOP and 0.05 s a layer; 78 layers more than 2.
    assert whole["memory_per_chip"]["temporary_bytes"] == 10 * GiB + 78 * 2 * GiB
    assert whole["cost_per_chip"]["flops"] == pytest.approx(100e12 + 78 * 30e12)
    assert whole["cost_per_chip"]["optimal_seconds"] == pytest.approx(0.2 + 78 * 0.05)
    assert whole["compile_seconds"] == 80.0
    assert whole["layers"] == 80 and whole["extrapolated_from"] == [2, 4]
    with pytest.raises(ValueError, match="rising depths"):
        bench.extrapolated(high, low, 80)


def test_scanned_memory_replaces_only_the_memory():
    bench = _bench()
    costed = bench.extrapolated(_maxtext(2, 10 * GiB, 100e12, 0.2, 30.0), _maxtext(4, 14 * GiB, 160e12, 0.3, 50.0), 80)
    scanned = _maxtext(80, 21 * GiB, 5e12, 0.01, 200.0)  # a loop's body counted once: costs far too low
    merged = bench.with_memory_from(costed, scanned)
    assert merged["memory_per_chip"]["temporary_bytes"] == 21 * GiB
    assert merged["cost_per_chip"]["flops"] == pytest.approx(100e12 + 78 * 30e12)
    assert merged["compile_seconds"] == 200.0 and merged["cost_compile_seconds"] == 80.0
    with pytest.raises(ValueError, match="has 40 layers"):
        bench.with_memory_from(costed, _maxtext(40, 21 * GiB, 5e12, 0.01, 200.0))


def _write_reports(folder: Path, maxtext_seconds: tuple[float, float] = (0.2, 0.3)) -> None:
    """A titanpod report (80 layers, 45 GiB, 5 s) and MaxText's unrolled 2- and 4-layer compiles (taking
    ``maxtext_seconds``) and scanned whole one, as the bench keeps them in ``folder``."""
    (folder / "titanpod").mkdir(parents=True)
    titanpod = {
        "layers": 80,
        "model_layers": 80,
        "extrapolated_from": None,
        "model_flops_per_chip": 2000e12,
        "chip_peak_flops": 459e12,
        "estimated_step_seconds": 5.0,
        "compile_seconds": 40.0,
        "cost_compile_seconds": 60.0,
        "program": {"flops": 2300e12, "memory": {"total": 45 * GiB, "temporaries": 18 * GiB}},
    }
    (folder / "titanpod" / "report.json").write_text(json.dumps(titanpod))
    low, high = maxtext_seconds
    for name, figures in {
        "maxtext-2.json": _maxtext(2, 10 * GiB, 100e12, low, 30.0),
        "maxtext-4.json": _maxtext(4, 14 * GiB, 160e12, high, 50.0),
        "maxtext-all-scanned.json": _maxtext(80, 20 * GiB, 5e12, 0.01, 200.0),
    }.items():
        (folder / name).write_text(json.dumps(figures))


def test_the_table_takes_each_sides_memory_from_its_scanned_compile(tmp_path):
    bench = _bench()
    folder = tmp_path / "llama3_70b-pallas"
    _write_reports(folder)
    summary: dict = {}
    lines = bench.compare(
        bench.CASES["llama3_70b"], "pallas", [], folder, reuse=True, scanned_memory=True, summary=summary
    )
    assert summary == {"slice": "v5p-64", "batch": 1, "seq_len": 8192, "attention": "pallas", "maxtext_hbm_gib": 24.0,
                       "maxtext_estimated_seconds": pytest.approx(4.1), "titanpod_hbm_gib": 45.0,
                       "titanpod_estimated_seconds": 5.0, "maxtext_refused": None}  # fmt: skip
    maxtext_row, titanpod_row, ratios = lines[4:7]
    # MaxText: 4 + 4 - 4 GiB of arguments, outputs and aliases plus the scanned compile's 20 GiB of temporaries;
    # flops 100 + 78 x 30 TFLOP and 0.2 + 78 x 0.05 s from the unrolled pair; MFU 2000 / 4.1 / 459.
    assert maxtext_row == "| MaxText | 24.00 | 20.00 | 2,440.0 | 4.100 | 106.3% | 200 + 80 |"
    assert titanpod_row == "| titanpod | 45.00 | 18.00 | 2,300.0 | 5.000 | 87.1% | 40 + 60 |"
    assert ratios == "| titanpod / MaxText | 1.88 | 0.90 | 0.94 | 1.22 | 0.82 | 0.20 |"
    assert "memory: one compile of all layers as a loop" in lines[0]


def test_a_model_maxtext_lacks_is_another_models_config_resized_at_every_depth(tmp_path, monkeypatch):
    """Llama 3.2 1B has no MaxText config: each compile takes Llama 3 8B's with the 1B's shapes set, and the full
    depth is the 1B's 16 blocks, not the 8B's 32."""
    bench = _bench()
    commands = []

    def compile_step(command, **_):
        commands.append(command)
        out = Path(command[command.index("--out") + 1])
        out.write_text(json.dumps(_maxtext(int(command[command.index("--layers") + 1]), GiB, 1e12, 0.1, 1.0)))
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(bench.subprocess, "run", compile_step)
    case = bench.CASES["llama32_1b"]
    for depth, scanned in ((2, False), (None, True)):
        bench.maxtext_compile(case, "pallas", depth, tmp_path, scanned=scanned)
    (unrolled, whole) = commands
    assert unrolled[unrolled.index("--layers") + 1] == "2" and whole[whole.index("--layers") + 1] == "16"
    for command in commands:
        sets = [command[i + 1] for i, arg in enumerate(command) if arg == "--set"]
        assert sets == list(case.maxtext_sets)
        assert "optimizer_memory_host_offload=true" in sets and command[command.index("--model") + 1] == "llama3-8b"
    assert "--scan-layers" in whole and "--scan-layers" not in unrolled


def test_a_maxtext_estimate_that_is_not_positive_is_shown_as_none_not_as_a_time(tmp_path):
    """libtpu 0.0.52 estimates MaxText's v5e steps at minus seconds: no time, MFU or time ratio is made of it."""
    bench = _bench()
    folder = tmp_path / "llama3_70b-pallas"
    _write_reports(folder, maxtext_seconds=(-98.8, -89.8))
    lines = bench.compare(bench.CASES["llama3_70b"], "pallas", [], folder, reuse=True, scanned_memory=True)
    maxtext_row, titanpod_row, ratios = lines[4:7]
    assert maxtext_row == "| MaxText | 24.00 | 20.00 | 2,440.0 | - | - | 200 + 80 |"
    assert titanpod_row == "| titanpod | 45.00 | 18.00 | 2,300.0 | 5.000 | 87.1% | 40 + 60 |"
    assert ratios == "| titanpod / MaxText | 1.88 | 0.90 | 0.94 | - | - | 0.20 |"


def test_a_maxtext_step_the_compiler_refuses_for_the_chips_memory_is_a_row_that_says_so(tmp_path, monkeypatch):
    """MaxText's own Llama 3.2 1B step at 2 x 4,096 with its moments in host memory: libtpu 0.0.52 refused the
    scanned whole-depth program for a v5e (17.07 GiB of temporaries); the unrolled shallow ones compiled."""
    bench = _bench()
    oom = "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total memory required for HLO "
    oom += "temporaries (17.07G) exceeds available HBM (15.75G). HLO module: jit_train_step."

    def compile_step(command, **_):
        if "--scan-layers" in command:
            return subprocess.CompletedProcess(command, 1, "", f"Traceback ...\njax.errors.JaxRuntimeError: {oom}\n")
        depth = int(command[command.index("--layers") + 1])
        figures = _maxtext(depth, depth * GiB, depth * 10e12, 0.1 * depth, 1.0)
        Path(command[command.index("--out") + 1]).write_text(json.dumps(figures))
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(bench.subprocess, "run", compile_step)
    case = bench.CASES["llama32_1b"]
    figures = bench.maxtext_figures(case, "pallas", [2, 4], tmp_path, 16, scanned_memory=True)
    assert figures["refused"] == "17.07 GiB of temporaries, over the chip's 15.75"
    assert json.loads((tmp_path / "maxtext-all-scanned.json").read_text())["refused"] == figures["refused"]
    assert figures["cost_per_chip"]["flops"] == pytest.approx(160e12)  # the line through 2 and 4 layers, to 16


def test_an_unknown_case_or_a_json_path_in_no_folder_stops_before_any_compile(tmp_path, capsys, monkeypatch):
    bench = _bench()
    monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: pytest.fail("compiled"))
    with pytest.raises(SystemExit):
        bench.main(["--cases", "qwen3_6b"])
    assert "unknown case 'qwen3_6b'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--cases", "qwen3_06b", "--json", str(tmp_path / "no" / "x.json")])
    assert "does not exist" in capsys.readouterr().err


def test_maxtexts_uv_run_alone_is_given_a_python_3_12_found_on_the_host(tmp_path, monkeypatch):
    """Not the whole bench: UV_PYTHON for it would rebuild the root environment with 3.12."""
    bench = _bench()
    interpreter = tmp_path / "pyenv" / "versions" / "3.12.1" / "bin" / "python3.12"
    interpreter.parent.mkdir(parents=True)
    interpreter.write_text("#!/bin/sh\n")
    interpreter.chmod(0o755)
    host = {"PYENV_ROOT": str(tmp_path / "pyenv"), "PATH": str(tmp_path / "empty")}
    assert bench.maxtext_python(host) == str(interpreter)
    assert bench.maxtext_python({**host, "UV_PYTHON": "/opt/py312"}) == "/opt/py312"
    seen = {}

    def compile_step(command, env, **_):
        seen.update(env)
        Path(command[command.index("--out") + 1]).write_text(json.dumps(_maxtext(2, GiB, 1e12, 0.1, 1.0)))
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(bench.subprocess, "run", compile_step)
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    monkeypatch.delenv("UV_PYTHON", raising=False)
    bench.maxtext_compile(bench.CASES["qwen3_06b"], "pallas", 2, tmp_path)
    assert seen["UV_PYTHON"] == str(interpreter) and "UV_PYTHON" not in os.environ
