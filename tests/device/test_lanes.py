"""Lane resolution: config first, then TITANPOD_LANE, then the automatic order; clear errors."""

from pathlib import Path

import pytest
import torch

from tests.conftest import run_python
from titanpod.device import LaneUnavailableError, get_backend, resolve_lane
from titanpod.device.lanes import auto_lane, check_lane_name, tpu_attached, unavailable_reason


def test_cpu_machine_resolves_auto_to_cpu():
    assert not torch.cuda.is_available()  # this suite runs on CPU-only machines
    assert resolve_lane("auto", environ={}) == "cpu"
    assert auto_lane() == "cpu"


def test_environment_variable_overrides_auto():
    assert resolve_lane("auto", environ={"TITANPOD_LANE": "xla"}) == "xla"
    assert resolve_lane("auto", environ={"TITANPOD_LANE": " CPU "}) == "cpu"
    assert resolve_lane("auto", environ={"TITANPOD_LANE": "auto"}) == "cpu"
    assert resolve_lane("auto", environ={"TITANPOD_LANE": ""}) == "cpu"


def test_config_wins_over_environment_variable():
    assert resolve_lane("cpu", environ={"TITANPOD_LANE": "tpu"}) == "cpu"


def test_unknown_lane_names_the_choices_and_the_closest():
    with pytest.raises(ValueError, match=r"Unknown lane 'tpus'.*Did you mean 'tpu'"):
        resolve_lane("tpus", environ={})
    with pytest.raises(ValueError, match="Unknown lane 'gpu'"):
        resolve_lane("auto", environ={"TITANPOD_LANE": "gpu"})
    assert check_lane_name("torch-xla") == "torch_xla"


def test_tpu_lane_without_torch_tpu_says_how_to_install_it():
    with pytest.raises(LaneUnavailableError) as caught:
        resolve_lane("tpu", environ={})
    message = str(caught.value)
    assert "torch_tpu" in message
    assert "titanpod-device[tpu]" in message
    assert "run's config" in message


def test_error_names_the_environment_variable_when_it_chose_the_lane():
    with pytest.raises(LaneUnavailableError, match="TITANPOD_LANE"):
        resolve_lane("auto", environ={"TITANPOD_LANE": "cuda"})


def test_cuda_and_torch_xla_errors_name_the_fix():
    cuda = unavailable_reason("cuda")
    assert cuda is not None and "CUDA" in cuda and "TITANPOD_LANE=cpu" in cuda
    legacy = unavailable_reason("torch_xla")
    assert legacy is not None and "pip install torch_xla" in legacy


def test_tpu_probe_reads_device_nodes_and_pci_vendors(tmp_path: Path):
    assert not tpu_attached(tmp_path)
    pci = tmp_path / "sys/bus/pci/devices/0000:00:04.0"
    pci.mkdir(parents=True)
    (pci / "vendor").write_text("0x8086\n")
    assert not tpu_attached(tmp_path)
    (pci / "vendor").write_text("0x1ae0\n")
    assert tpu_attached(tmp_path)
    other = tmp_path / "other"
    (other / "dev").mkdir(parents=True)
    (other / "dev/accel0").touch()
    assert tpu_attached(other)


def test_cpu_backend_basics():
    backend = get_backend("cpu")
    assert backend.lane == "cpu"
    assert backend.device() == torch.device("cpu")
    assert backend.dist_backend == "gloo" and backend.compile_backend == "inductor"
    backend.synchronize()
    stats = backend.memory_stats()
    assert stats.kind == "host"
    assert 0 < stats.current_bytes <= stats.peak_bytes
    assert stats.limit_bytes is not None and stats.peak_bytes < stats.limit_bytes


def test_xla_backend_runs_torch_ops_on_jax_arrays():
    # In its own process: torchax registers the "jax" device with PyTorch for the rest of a process.
    result = run_python(
        "import torch\n"
        "from titanpod.device import get_backend\n"
        "backend = get_backend('xla')\n"
        "with backend.runtime():\n"
        "    x = torch.arange(6.0, device=backend.device()).reshape(2, 3)\n"
        "    total = (x * 2).sum()\n"
        "    print(backend.device().type, total.device.type, float(total.cpu()))\n"
        "backend.synchronize()\n"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["jax", "jax", "30.0"]


def test_torch_lanes_keep_parameters_on_their_device_and_count_one_device_per_process():
    from titanpod.device import get_backend

    backend = get_backend("cpu")
    assert not backend.single_controller
    assert backend.parameter_device() == backend.device()
    assert backend.devices_in_job(world_size=4) == 4


def test_the_xla_lane_is_one_controller_with_parameters_on_the_host():
    from tests.conftest import XLA_ENV, run_json_script

    out = run_json_script(
        "import json\n"
        "from titanpod.device import get_backend\n"
        "b = get_backend('xla')\n"
        "print(json.dumps([b.single_controller, str(b.parameter_device()), b.devices_in_job(world_size=1)]))\n",
        env=XLA_ENV,
    )
    assert out == [True, "cpu", 8]


def test_lane_traits_are_read_from_the_backend_classes_without_starting_them():
    from titanpod.device import LANES, backend_class

    traits = {lane: backend_class(lane) for lane in LANES}  # tpu and torch_xla are not installed here
    assert {lane: cls.lane for lane, cls in traits.items()} == {lane: lane for lane in LANES}
    assert [lane for lane, cls in traits.items() if cls.single_controller] == ["xla"]
    assert [lane for lane, cls in traits.items() if cls.device_memory_is_host] == ["cpu"]
    assert [lane for lane, cls in traits.items() if not cls.supports_pipeline] == ["xla", "torch_xla"]
    assert [lane for lane, cls in traits.items() if cls.launch is not None] == ["cpu", "cuda", "tpu"]
    assert traits["tpu"].stand_in_lanes == ("cpu", "xla")
