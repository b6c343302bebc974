"""Lanes as plug-ins: a backend class registered under a name is resolved, constructed and asked what it can do."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_python
from titanpod.device import LANE_REGISTRY, HostLaunch, LaneUnavailableError, get_backend, resolve_lane
from titanpod.device.backends.cpu import CpuBackend


class ToyBackend(CpuBackend):
    """A lane defined by a test: the host CPU under another name, with its own capabilities."""

    lane = "toy"
    supports_pipeline = False
    traces_with_jax = True
    launch = HostLaunch(processes_per_host=2)

    @classmethod
    def profiler_config(cls, folder: Path, rank: int) -> str:
        return f"{folder}/toy-rank{rank}"


class MissingBackend(CpuBackend):
    """A lane that never runs here, with the fix in its reason."""

    lane = "missing"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return "lane 'missing' needs a toy accelerator: plug one in."


TOY_REGISTRY = LANE_REGISTRY.with_lane(ToyBackend, auto_first=True).with_lane(MissingBackend)


def test_a_registered_lane_is_resolved_by_name_and_answers_its_capabilities(tmp_path):
    backend = get_backend("toy", registry=TOY_REGISTRY)
    assert isinstance(backend, ToyBackend) and backend.lane == "toy"
    assert not backend.supports_pipeline and backend.traces_with_jax and not backend.single_controller
    assert backend.launch == HostLaunch(processes_per_host=2)
    assert backend.profiler_config(tmp_path, 3) == f"{tmp_path}/toy-rank3"
    assert backend.device_memory_is_host  # inherited from the cpu lane
    assert resolve_lane("auto", environ={"TITANPOD_LANE": "Toy"}, registry=TOY_REGISTRY) == "toy"


def test_the_automatic_choice_tries_a_lane_registered_first_and_skips_one_that_cannot_run():
    assert resolve_lane("auto", environ={}, registry=TOY_REGISTRY) == "toy"
    with pytest.raises(LaneUnavailableError, match="plug one in"):
        get_backend("missing", registry=TOY_REGISTRY)
    skips = LANE_REGISTRY.with_lane(MissingBackend, auto_first=True)
    assert resolve_lane("auto", environ={}, registry=skips) == "cpu"


def test_registering_a_lane_leaves_the_shipped_registry_as_it_was():
    assert "toy" in TOY_REGISTRY.names and "toy" not in LANE_REGISTRY.names
    assert LANE_REGISTRY.auto_order == ("tpu", "torch_xla", "cuda", "cpu")
    with pytest.raises(ValueError, match="Unknown lane 'toy'"):
        resolve_lane("toy", environ={})
    with pytest.raises(KeyError, match="Unknown lane 'toy'"):
        LANE_REGISTRY.backend_class("toy")


def test_looking_a_lane_up_imports_only_its_backend_module():
    result = run_python(
        "import sys\n"
        "from titanpod.device import backend_class, get_backend\n"
        "get_backend('cpu'); backend_class('xla').single_controller\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('titanpod.device.backends.'))))\n"
        "print(','.join(m for m in ('jax', 'torchax', 'torch_tpu', 'torch_xla') if m in sys.modules) or 'none')\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["titanpod.device.backends.cpu", "titanpod.device.backends.xla", "none"]
