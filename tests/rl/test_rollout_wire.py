"""Tensors as plain data for another process: every dtype the engines take survives bit for bit."""

import pytest
import torch

from titanpod.rl.rollout.wire import tensor_from_bytes, tensor_to_bytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_tensor_as_bytes_comes_back_bit_for_bit_and_writable(dtype):
    tensor = torch.randn(3, 5, generator=torch.Generator().manual_seed(0)).to(dtype)
    tensor[0, 0] = float("nan")
    dtype_name, shape, raw = tensor_to_bytes(tensor.t())  # a non-contiguous view is sent as its values
    assert (dtype_name, shape, len(raw)) == (str(dtype).removeprefix("torch."), [5, 3], 15 * tensor.element_size())
    back = tensor_from_bytes((dtype_name, shape, raw))
    assert back.dtype == dtype and torch.equal(back.view(torch.uint8), tensor.t().contiguous().view(torch.uint8))
    back.add_(1)  # its own memory: writing it leaves the bytes alone
    assert torch.equal(
        tensor_from_bytes((dtype_name, shape, raw)).view(torch.uint8), tensor.t().contiguous().view(torch.uint8)
    )


def test_an_unknown_dtype_name_is_refused():
    with pytest.raises(ValueError, match="Unknown tensor dtype 'float99'"):
        tensor_from_bytes(("float99", [1], b"\0\0\0\0"))
