"""Loads crafted Orbax trainer checkpoints through ``Checkpointer.load`` and reports what each did.

Run as ``python crafted_orbax_worker.py ROOT`` (with the repository on ``PYTHONPATH``; jax on the host CPU).
It saves a real Orbax checkpoint of a small state, then for each attack copies it, puts a pickle that creates
a marker file if unpickled where Orbax might read it, recomputes the manifest and commit marker
(``crafted_checkpoints.recommit``) and loads it. Attacks: ``_METADATA`` made a pickle; ``_METADATA``
emptied so Orbax falls back to its msgpack aggregate file ``checkpoint``, made a pickle
(``aggregate_pickled``) or a msgpack array of Python objects holding one (``aggregate_object_array``);
and every file of the folder, in turn, made the pickle (``file <path>``). ``untouched`` is the saved
checkpoint itself. Prints one JSON object: attack -> {"error": "Type: message" or null, "marker": bool}.
"""

from __future__ import annotations

import json
import pickle
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from tests.faults.crafted_checkpoints import CreatesMarker, recommit
from titanpod.checkpoint import CheckpointConfig
from titanpod.checkpoint.trainer_state import Checkpointer

RECIPE = {"name": "orbax-faults"}
NDARRAY = 1
"""Orbax's msgpack extension code for an array: msgpack of (shape, dtype name, bytes)."""


class OrbaxStep:
    """A step whose state Orbax saves (``state_format`` jax), holding numpy arrays."""

    state_format = "jax"

    def __init__(self) -> None:
        self.tree: dict[str, Any] = {
            "model": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)},
            "optim": {"step": np.array(3)},
        }

    def state_dict(self) -> dict[str, Any]:
        return self.tree

    def state_like(self) -> dict[str, Any]:
        return self.tree

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tree = state


def metadata_pickled(orbax: Path, payload: bytes) -> None:
    (orbax / "_METADATA").write_bytes(payload)


def aggregate_pickled(orbax: Path, payload: bytes) -> None:
    (orbax / "_METADATA").write_text("{}")
    (orbax / "checkpoint").write_bytes(payload)


def aggregate_object_array(orbax: Path, payload: bytes) -> None:
    (orbax / "_METADATA").write_text("{}")
    array = msgpack.ExtType(NDARRAY, msgpack.packb(((1,), "O", payload), use_bin_type=True))
    tree = {"model": {"w": array}, "optim": {"step": array}}
    (orbax / "checkpoint").write_bytes(msgpack.packb(tree, use_bin_type=True))


def main() -> None:
    root = Path(sys.argv[1])
    saver = Checkpointer(root / "saved", CheckpointConfig(), json.dumps(RECIPE), say=lambda _: None)
    saver.save(1, None, OrbaxStep(), {"index": 1})  # type: ignore[arg-type]
    saved = root / "saved" / "checkpoints" / "step-000001"

    def attempt(name: str, craft: Callable[[Path, bytes], None] | None) -> dict[str, Any]:
        folder = root / name.replace("/", "_").replace(" ", "_") / "step-000001"
        shutil.copytree(saved, folder)
        marker = folder.parent / "ran"
        if craft is not None:
            craft(folder / "orbax", pickle.dumps(CreatesMarker(marker)))
            recommit(folder)
        try:
            saver.load(folder, None, OrbaxStep(), RECIPE)  # type: ignore[arg-type]
            error = None
        except Exception as caught:  # reported, whatever it is
            error = f"{type(caught).__name__}: {caught}"
        return {"error": error, "marker": marker.exists()}

    outcomes = {"untouched": attempt("untouched", None)}
    for craft in (metadata_pickled, aggregate_pickled, aggregate_object_array):
        outcomes[craft.__name__] = attempt(craft.__name__, craft)
    for path in sorted(path for path in (saved / "orbax").rglob("*") if path.is_file()):
        relative = path.relative_to(saved / "orbax")

        def replace(orbax: Path, payload: bytes, relative: Path = relative) -> None:
            (orbax / relative).write_bytes(payload)

        outcomes[f"file {relative.as_posix()}"] = attempt(f"file {relative.as_posix()}", replace)
    print(json.dumps(outcomes), flush=True)


if __name__ == "__main__":
    main()
