"""Importing the device shim must not load any accelerator stack or pick a device."""

from tests.conftest import run_python


def test_importing_titanpod_device_loads_no_accelerator_stack():
    result = run_python(
        "import sys, titanpod.device\n"
        "heavy = [m for m in ('jax', 'jaxlib', 'torchax', 'torch_tpu', 'torch_xla', 'libtpu') if m in sys.modules]\n"
        "print(','.join(heavy) or 'none')\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "none"


def test_importing_every_layer_loads_no_accelerator_stack_and_no_data_library():
    layers = [
        "device",
        "models",
        "parallel",
        "kernels",
        "graph",
        "checkpoint",
        "recipes",
        "pretrain",
        "diffusion",
        "posttrain",
    ]
    imports = "; ".join(f"import titanpod.{layer}" for layer in layers)
    result = run_python(
        f"import sys; {imports}\n"
        "heavy = ('jax', 'torchax', 'torch_tpu', 'torch_xla', 'datasets', 'pyarrow', 'pandas')\n"
        "print(','.join(m for m in heavy if m in sys.modules) or 'none')\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "none"
