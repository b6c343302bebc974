"""Shared test helpers. Tests run on the CPU; nothing here touches the network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

XLA_ENV = {
    # 8 devices on a few shared cores: collectives wait for the slowest (XLA's CPU default aborts after 40 s).
    "XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_cpu_collective_call_terminate_timeout_seconds=600",
    "JAX_PLATFORMS": "cpu",
    "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
}
"""The xla lane on 8 host CPU devices (in a subprocess: torchax must not load in the test process)."""


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter of this environment and capture its output."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=timeout, check=False
    )


def run_json_script(code: str, env: dict[str, str] | None = None, timeout: float = 600) -> dict:
    """Run ``code`` in a fresh interpreter; it must succeed and print a JSON object on its last line."""
    result = run_python(code, env=env, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session", autouse=True)
def private_cache_home(tmp_path_factory: pytest.TempPathFactory):
    """Caches under the user's home (``XDG_CACHE_HOME``: titanpod's compiled steps among them) go to a folder of
    this test session, for the tests and the processes they start: nothing read from or left in ``~/.cache``."""
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache-home"))
    yield
    if before is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = before


@pytest.fixture
def repo_root() -> Path:
    """The repository root."""
    return REPO_ROOT


MOST_WORKERS = 8
"""``-n auto`` (the default run) starts one worker a core, at most this many: each holds torch and a model."""


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook; the chip tier runs without xdist
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Workers for ``-n auto``: one a core, at most ``MOST_WORKERS``."""
    return max(1, min(os.cpu_count() or 1, MOST_WORKERS))


def pytest_configure(config: pytest.Config) -> None:
    """The fast tier on several workers runs with one OpenMP thread a worker (and a process it starts), unless
    ``OMP_NUM_THREADS`` is set: workers with a thread a core each stall one another at OpenMP's barriers. The
    slow tier keeps the default, since its processes wait on each other and leave the cores gaps."""
    workers = getattr(config.option, "numprocesses", None)
    fast_tier = config.option.markexpr.startswith("not slow")
    if workers and fast_tier and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = "1"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--rehearse-all",
        action="store_true",
        help="also run the pod-recipe rehearsals marked rehearsal_full (about 40 minutes on 2 cores)",
    )
    parser.addoption(
        "--long-runs",
        action="store_true",
        help="also run the tests marked long_run: a default run whole, as a user starts it (minutes each)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave the tests marked ``rehearsal_full`` (unless --rehearse-all) and ``long_run`` (unless --long-runs) out
    of the run, listed as deselected."""
    markers = [name for name, option in (("rehearsal_full", "--rehearse-all"), ("long_run", "--long-runs"))
               if not config.getoption(option)]  # fmt: skip
    left_out = [item for item in items if any(item.get_closest_marker(name) for name in markers)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if item not in left_out]
