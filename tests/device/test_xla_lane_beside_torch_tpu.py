"""The xla lane where torch_tpu has already claimed PyTorch's PrivateUse1 device (a TPU VM with autoload on)."""

from tests.conftest import run_python


def test_the_xla_lane_refuses_a_process_whose_privateuse1_device_is_taken_and_names_the_fix():
    result = run_python(
        "import torch\n"
        "torch.utils.rename_privateuse1_backend('tpu')  # what torch_tpu's loader does at import torch\n"
        "from titanpod.device.errors import LaneUnavailableError\n"
        "from titanpod.device.factory import get_backend\n"
        "try:\n"
        "    get_backend('xla')\n"
        "except LaneUnavailableError as error:\n"
        "    print(error)\n"
    )
    assert result.returncode == 0, result.stderr
    assert "already registered as 'tpu'" in result.stdout
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in result.stdout


def test_the_xla_lane_starts_where_torchax_already_named_the_device():
    result = run_python(
        "import torchax  # names the PrivateUse1 device 'jax'\n"
        "from titanpod.device.backends.xla import privateuse1_taken\n"
        "print(privateuse1_taken())\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "None"
