"""``tools/bench/pallas_on_tpu.py`` in interpret mode at tiny shapes: every kernel within its bound of the
float32 reference, forward and gradients, and the kernels' modules importable without PyTorch (as on a bare
TPU machine)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from titanpod.models import IGNORE_INDEX

BENCH = Path(__file__).resolve().parents[2] / "tools" / "bench" / "pallas_on_tpu.py"
CASES = {"splash_causal", "splash_full", "splash_full_ragged", "pallas_loss", "pallas_loss_kept", "gmm"}


def _bench():
    spec = importlib.util.spec_from_file_location("pallas_on_tpu", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_every_kernel_matches_its_reference_in_interpret_mode(tmp_path):
    bench = _bench()
    results = bench.main(["--interpret", "--tiny", "--reps", "1", "--out", str(tmp_path / "table.txt")])
    assert {r.name for r in results} == CASES
    for result in results:
        assert result.failure is None, result.failure
        assert len(result.errors) >= 3, result.name  # the output and at least two gradients compared
        assert result.passed, result.errors
        assert set(result.times) == {"kernel_fwd", "kernel_fwd_bwd", "xla_fwd", "xla_fwd_bwd"}
    assert (tmp_path / "table.txt").read_text().count("PASS") == len(CASES)


def test_the_bench_and_the_loss_kernel_leave_out_the_models_ignored_label():
    from titanpod.kernels.pallas.loss_kernel import DEFAULT_IGNORE_INDEX

    assert _bench().IGNORE_INDEX == DEFAULT_IGNORE_INDEX == IGNORE_INDEX


@pytest.mark.slow  # starts a process
def test_the_kernels_build_where_pytorch_is_not_installed():
    script = (
        "import sys; sys.modules['torch'] = None\n"  # any import of torch now fails, as on a bare TPU machine
        f"import importlib.util; spec = importlib.util.spec_from_file_location('b', {str(BENCH)!r})\n"
        "b = importlib.util.module_from_spec(spec); sys.modules['b'] = b; spec.loader.exec_module(b)\n"
        "mods = b.torch_free_modules()\n"
        "cases = b.build_cases(mods, tiny=True, interpret=True, dtype_name='bfloat16')\n"
        "assert 'torch' not in {m.split('.')[0] for m in sys.modules if sys.modules[m] is not None}\n"
        "print(len(cases))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(len(CASES))
