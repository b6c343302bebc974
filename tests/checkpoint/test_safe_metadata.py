"""DCP metadata is unpickled with an explicit allow-list: real checkpoints load, crafted ones run nothing."""

from __future__ import annotations

import os
import pickle
import sys
import uuid
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
from torch.distributed.checkpoint.metadata import Metadata

from titanpod.checkpoint.dcp_reader import (
    SafeFileSystemReader,
    SafeFsspecReader,
    UnsafeCheckpointError,
    load_metadata_bytes,
    quiet_single_process,
    safe_reader,
)


def state() -> dict[str, object]:
    generator = torch.Generator().manual_seed(0)
    return {
        "fp32": torch.randn(4, 6, generator=generator),
        "bf16": torch.randn(3, 5, generator=generator).to(torch.bfloat16),
        "int64": torch.arange(7),
        "nested": {"step": torch.tensor(3), "rng": torch.get_rng_state()},
    }


def zeros_like(tree: dict[str, object]) -> dict[str, object]:
    return {
        key: zeros_like(value) if isinstance(value, dict) else torch.zeros_like(value) for key, value in tree.items()
    }


def assert_same(loaded: dict[str, object], saved: dict[str, object]) -> None:
    for key, value in saved.items():
        if isinstance(value, dict):
            assert_same(loaded[key], value)
        else:
            assert torch.equal(loaded[key], value), key


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_real_checkpoints_load_through_the_local_reader(tmp_path, mode):
    saved = state()
    writer = dcp.FileSystemWriter(tmp_path, single_file_per_rank=True)
    with quiet_single_process():
        if mode == "sync":
            dcp.save(saved, storage_writer=writer)
        else:
            dcp.async_save(saved, storage_writer=writer).result()
        loaded = zeros_like(saved)
        dcp.load(loaded, storage_reader=SafeFileSystemReader(tmp_path))
    assert_same(loaded, saved)
    metadata = safe_reader(tmp_path).read_metadata()
    assert metadata.state_dict_metadata["bf16"].properties.dtype == torch.bfloat16
    assert metadata.state_dict_metadata["int64"].properties.layout == torch.strided


def test_real_checkpoints_load_through_the_fsspec_reader():
    url = f"memory://safe-metadata-{uuid.uuid4().hex}"
    saved = state()
    with quiet_single_process():
        dcp.save(saved, storage_writer=FsspecWriter(url, single_file_per_rank=True, sync_files=False))
        loaded = zeros_like(saved)
        dcp.load(loaded, storage_reader=SafeFsspecReader(url))
    assert_same(loaded, saved)
    assert isinstance(safe_reader(url), SafeFsspecReader)


def proto4(body: str) -> bytes:
    """A pickle in protocol 4 (so dotted names resolve, as an attacker would choose) from text opcodes."""
    return b"\x80\x04" + body.encode() + b"."


def call(module: str, name: str, *args: str) -> str:
    """Text opcodes that call ``module.name(*args)`` on load (``args`` are opcode texts)."""
    return f"c{module}\n{name}\n(" + "".join(args) + "tR"


def text(value: str) -> str:
    return f"S{value!r}\n"


class Nested:
    """Unpickles as ``Metadata(<what Inner unpickles as>)``: an allowed outer call wrapping a forbidden one."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (Metadata, (Inner(self.command),))


class Inner:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def payloads(marker: Path, variable: str, module_name: str) -> dict[str, bytes]:
    """Each would create ``marker`` or set ``os.environ[variable]`` (or import ``module_name``, which creates it)."""
    shell = text(f"touch {marker}")
    python = text(f"open({str(marker)!r}, 'w').close(); __import__('os').environ[{variable!r}] = '1'")
    getattr_system = call("builtins", "getattr", "ctorch.distributed.checkpoint.filesystem\nos\n", text("system"))
    return {
        "getattr os.system": proto4(f"{getattr_system}({shell}tR"),
        "subprocess.Popen": proto4(call("subprocess", "Popen", f"({text('sh')}{text('-c')}{shell}l")),
        "subprocess.check_output": proto4(call("subprocess", "check_output", f"({text('sh')}{text('-c')}{shell}l")),
        "builtins.exec": proto4(call("builtins", "exec", python)),
        "builtins.eval": proto4(call("builtins", "eval", text(f"exec({python.strip()[1:]})"))),
        "nested reduce": pickle.dumps(Nested(f"touch {marker}"), protocol=4),
        "dcp module attribute os.system": proto4(call("torch.distributed.checkpoint.filesystem", "os.system", shell)),
        "dotted name to module globals": proto4(
            "ctorch.distributed.checkpoint.metadata\nMetadata.__init__.__globals__\n"
        ),
        "posix.system": proto4(call("posix", "system", shell)),
        "os.system pickled": pickle.dumps(Inner(f"touch {marker}"), protocol=2),
        "importlib.import_module": proto4(call("importlib", "import_module", text(module_name))),
    }


@pytest.fixture
def traps(tmp_path, monkeypatch):
    """A marker file, an environment variable and an importable module, all untouched unless a payload runs."""
    marker = tmp_path / "ran"
    variable = f"TITANPOD_PAYLOAD_{uuid.uuid4().hex}"
    module_name = f"titanpod_payload_{uuid.uuid4().hex}"
    (tmp_path / f"{module_name}.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield marker, variable, module_name
    monkeypatch.delenv(variable, raising=False)


def test_every_classic_payload_is_refused_and_runs_nothing(tmp_path, traps):
    marker, variable, module_name = traps
    for name, data in payloads(marker, variable, module_name).items():
        with pytest.raises(UnsafeCheckpointError, match="DCP metadata never contains"):
            load_metadata_bytes(data)
        assert not marker.exists(), f"{name} ran"
        assert variable not in os.environ, f"{name} ran"
        assert module_name not in sys.modules, f"{name} imported its module"


def test_the_payload_proves_it_would_run_with_plain_pickle(tmp_path, traps):
    """The traps work: the same bytes do create the marker under ``pickle.loads`` (so the refusal above is real)."""
    marker, variable, module_name = traps
    pickle.loads(payloads(marker, variable, module_name)["builtins.exec"])
    assert marker.exists() and os.environ[variable] == "1"


def test_a_crafted_metadata_file_in_a_checkpoint_folder_is_refused(tmp_path, traps):
    marker, variable, module_name = traps
    folder = tmp_path / "state"
    with quiet_single_process():
        dcp.save(state(), storage_writer=dcp.FileSystemWriter(folder, single_file_per_rank=True))
    url = f"memory://crafted-{uuid.uuid4().hex}"
    import fsspec

    data = payloads(marker, variable, module_name)["getattr os.system"]
    (folder / ".metadata").write_bytes(data)
    fsspec.filesystem("memory").pipe_file(f"{url}/.metadata", data)
    for location in (folder, url):
        with pytest.raises(UnsafeCheckpointError, match=r"builtins\.getattr"):
            safe_reader(location).read_metadata()
    assert not marker.exists()


def test_metadata_must_be_dcp_metadata():
    with pytest.raises(UnsafeCheckpointError, match="holds a dict, not DCP Metadata"):
        load_metadata_bytes(pickle.dumps({"a": 1}))
