"""Reading an offline W&B run's ``run-<id>.wandb`` file back: its records, as W&B wrote them.

The file is a 7-byte W&B header, then records in the LevelDB log layout: 32 KiB blocks, each record one or
more chunks with a 7-byte header (CRC-32 4, length 2, kind 1: whole, first, middle, last); a block's tail too
short for a chunk header is padding.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

from wandb.proto import wandb_internal_pb2

FILE_HEADER, CHUNK_HEADER, BLOCK = 7, 7, 32 * 1024
WHOLE, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path, timeout: float = 60.0) -> list[wandb_internal_pb2.Record]:
    """Every record in the finished offline run file ``path``: W&B's service process may still be writing it
    when ``finish()`` returns, so this waits (up to ``timeout`` seconds) for the run's exit record."""
    deadline = time.monotonic() + timeout
    while True:
        records = read_records(path)
        if any(record.HasField("exit") for record in records):
            return records
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} holds no exit record after {timeout} s: the W&B run never finished.")
        time.sleep(0.1)


def read_records(path: Path) -> list[wandb_internal_pb2.Record]:
    """The records written to the offline run file ``path`` so far."""
    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file.")
    records, pending, offset = [], b"", FILE_HEADER
    while offset + CHUNK_HEADER <= len(data):
        left_in_block = BLOCK - offset % BLOCK
        if left_in_block < CHUNK_HEADER:
            offset += left_in_block
            continue
        _, length, kind = struct.unpack("<IHB", data[offset : offset + CHUNK_HEADER])
        chunk = data[offset + CHUNK_HEADER : offset + CHUNK_HEADER + length]
        offset += CHUNK_HEADER + length
        if kind == 0:  # padding
            continue
        pending = chunk if kind in (WHOLE, FIRST) else pending + chunk
        if kind in (WHOLE, LAST):
            records.append(wandb_internal_pb2.Record.FromString(pending))
            pending = b""
    return records


def items(updates) -> dict[str, object]:
    """Key-value items of a history, summary or config record as ``{dotted key: value}``."""
    return {item.key or ".".join(item.nested_key): json.loads(item.value_json) for item in updates}


def history(records: list[wandb_internal_pb2.Record]) -> dict[int, dict[str, object]]:
    """Each logged step's figures, by step."""
    return {record.history.step.num: items(record.history.item) for record in records if record.HasField("history")}


def summary(records: list[wandb_internal_pb2.Record]) -> dict[str, object]:
    """The run's summary: every summary update in order."""
    found: dict[str, object] = {}
    for record in records:
        if record.HasField("summary"):
            found.update(items(record.summary.update))
    return found


def config(records: list[wandb_internal_pb2.Record]) -> dict[str, object]:
    """The run's config (from its run record and any later config updates)."""
    found: dict[str, object] = {}
    for record in records:
        if record.HasField("run"):
            found.update(items(record.run.config.update))
        if record.HasField("config"):
            found.update(items(record.config.update))
    return found


def offline_environment(folder: Path) -> dict[str, str]:
    """Environment variables that keep W&B off the network, quiet, and out of the home folder."""
    home = str(folder / "wandb-home")
    return {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_CONFIG_DIR": home,
        "WANDB_CACHE_DIR": home,
        "WANDB_DATA_DIR": home,
    }


def no_login_environment(folder: Path) -> dict[str, str]:
    """Environment variables for online W&B with no API key anywhere it looks (home, netrc, settings) and a
    server address nothing answers: a run started with them fails at once, as without ``wandb login``."""
    home = folder / "home"
    return {
        "HOME": str(home),
        "NETRC": str(home / ".netrc"),
        "WANDB_CONFIG_DIR": str(home / "config"),
        "WANDB_CACHE_DIR": str(home / "cache"),
        "WANDB_DATA_DIR": str(home / "data"),
        "WANDB_BASE_URL": "http://127.0.0.1:9",
        "WANDB_INIT_TIMEOUT": "2",
    }
