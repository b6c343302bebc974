"""Named device meshes for the torch lanes and the xla lane."""

import pytest
import torch.distributed as dist

from tests.conftest import run_python
from titanpod.device import MeshError, check_mesh_axes, get_backend


def test_mesh_sizes_must_multiply_to_the_world_size():
    assert check_mesh_axes({"dp_replicate": 2, "fsdp": 4}, 8) == (("dp_replicate", "fsdp"), (2, 4))
    with pytest.raises(MeshError, match=r"fsdp=3 spans 3 devices but the job has 4"):
        check_mesh_axes({"fsdp": 3}, 4)
    with pytest.raises(MeshError, match="at least 1"):
        check_mesh_axes({"fsdp": 0, "tp": 4}, 4)
    with pytest.raises(MeshError, match="at least one axis"):
        check_mesh_axes({}, 1)


def test_single_process_torch_mesh_has_named_axes():
    try:
        mesh = get_backend("cpu").build_mesh({"dp_replicate": 1, "fsdp": 1})
        assert mesh.mesh_dim_names == ("dp_replicate", "fsdp")
        assert mesh.device_type == "cpu"
        assert mesh["fsdp"].size() == 1
        assert dist.get_backend() == "gloo"
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_xla_mesh_over_eight_host_devices():
    result = run_python(
        "from titanpod.device import get_backend\n"
        "mesh = get_backend('xla').build_mesh({'fsdp': 4, 'tp': 2})\n"
        "print(dict(mesh.shape), mesh.devices.size)\n",
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "{'fsdp': 4, 'tp': 2} 8"


def test_xla_mesh_that_does_not_cover_the_devices_is_rejected():
    result = run_python(
        "from titanpod.device import get_backend, MeshError\n"
        "try:\n    get_backend('xla').build_mesh({'fsdp': 3})\n"
        "except MeshError as error:\n    print(error)\n",
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"},
    )
    assert result.returncode == 0, result.stderr
    assert "job has 8" in result.stdout
