"""Shared set-up of the vLLM environment's tests: tiny models that vLLM's CPU build serves, and scripts run as
their own processes.

vLLM starts its engine core in a separate process; a script that starts it needs a main guard, so every test
that starts an engine runs a script (or titanpod's CLI) in a fresh process and reads what it wrote.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from titanpod.models import DecoderArgs

TINY = DecoderArgs(dim=64, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=128, ffn_dim=96, max_seq_len=128)
"""A Llama vLLM's CPU build serves: its CPU attention takes head sizes 32, 64, 80, ... (not 16)."""

TINY_TIED = dataclasses.replace(TINY, qk_norm=True, tie_embeddings=True)
"""A Qwen 3 of the same size whose output head is its embedding (vLLM packs a copy of it for the head's GEMM)."""

MODELS = {"llama3": TINY, "qwen3": TINY_TIED}
"""The models the parity test runs, by family."""

HERE = Path(__file__).parent

ENGINE_ENV = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "COLUMNS": "200"}
"""Set for every process a test starts (no backend autoload, as in CI; console lines unwrapped)."""


def run_python(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """``python *args`` in a fresh process in ``cwd``; fails the test, with the output's tail, on a non-zero exit."""
    done = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **ENGINE_ENV},
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    return done


def read_json(path: Path) -> Any:
    """The JSON in ``path``."""
    return json.loads(path.read_text(encoding="utf-8"))
