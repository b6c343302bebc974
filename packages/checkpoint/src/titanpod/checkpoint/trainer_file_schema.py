"""What a checkpoint's ``trainer.json`` may hold, checked field by field before any of it is used.

``trainer.json`` is read with ``json.loads`` alone, so it can only hold objects, lists, strings, numbers,
booleans and null: nothing in it is imported, called or unpickled. ``check_trainer_file`` then refuses
a value of the wrong type or out of range with a ``CheckpointError`` that names the file, the field and
what to do:

- ``format``: one of the formats this version reads (a newer one asks for a newer titanpod);
- ``step``: a non-negative integer that fits in 64 bits, the N of the folder's ``step-NNNNNN`` name;
- ``data``: an object, the data loader's position: its position fields (``POSITION_FIELDS``), wherever
  they sit, are non-negative integers that fit in 64 bits (or, for ``images``, the nested position of an image
  loader), ``kind`` is a string, ``seed`` an integer a recipe's ``train.seed`` may be, ``per_rank`` a list of
  objects; ``dataset`` (a stream's own state, as the datasets library gave it) is not looked into;
- ``recipe``: an object (compared field by field with the run's recipe on resume);
- ``files``: an object of path inside the folder (``/``-separated, no ``..``) -> ``{"size": n, "xxh3_128":
  hex}`` (or ``"sha256"``), or the size alone (manifests from before hashes);
- ``data_files`` (when the run recorded them): an object of data file name -> ``{"size": n, "head_bytes": n,
  "head_sha256": hex}`` (``titanpod.data.fingerprint``).

A field it does not name is left as it is: nothing reads it. Whether a data position is one this run's data can
reach (a batch index within an epoch) is the data loader's to say, once the data is built; a resume asks it
before any tensor loads (``titanpod.checkpoint.trainer_load``).
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Sequence
from typing import Any

from titanpod.checkpoint.errors import CheckpointError, DamagedCheckpointError
from titanpod.checkpoint.locations import Location, base_name, join
from titanpod.checkpoint.step_folders import STEP_FOLDER, TRAINER_FILE, any_earlier_checkpoint
from titanpod.graph.config import SEED_MAX
from titanpod.models.field_checks import INT64_MAX

POSITION_FIELDS = frozenset(
    {
        "index", "epoch", "position", "skip_tokens", "grpo_steps_done",
        "images", "examples", "seq_len", "batch_size", "rank", "world_size",
    }
)  # fmt: skip
"""Fields of a data position that count something (batches, epochs, tokens, ranks): non-negative integers."""
OPAQUE_DATA_FIELDS = frozenset({"dataset"})
"""Fields of a data position kept as another library wrote them: not looked into."""
HEX_DIGITS = {"xxh3_128": 32, "sha256": 64}
"""The hashes a manifest entry may record, and the length of each as lowercase hex."""

_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict = 40, 40, 3, 3


def check_trainer_file(trainer: Any, folder: Location, formats: Sequence[int]) -> None:
    """Refuse, with a ``CheckpointError`` naming the field, a ``trainer.json`` (``trainer``, as ``json.loads`` read it
    from ``folder``) that holds a value of the wrong type or out of range; ``formats`` are the readable formats."""
    check = _Checker(folder)
    if not isinstance(trainer, dict):
        check.fail("the whole file", trainer, "a JSON object with format, step, data, recipe and files")
    found = trainer.get("format")
    if isinstance(found, bool) or not isinstance(found, int) or found not in formats:
        raise CheckpointError(
            f"{check.path} has format {_SHORT.repr(found)}; this version reads {tuple(formats)} "
            "(a newer titanpod wrote it: update titanpod)."
        )
    for field in ("step", "data", "recipe", "files"):
        if field not in trainer:
            check.fail(field, "missing", "present", shown="missing")
    check.step(trainer["step"])
    check.data("data", trainer["data"])
    if not isinstance(trainer["recipe"], dict):
        check.fail("recipe", trainer["recipe"], "an object (the recipe the checkpoint was written with)")
    check.files(trainer["files"])
    if "data_files" in trainer:
        check.data_files(trainer["data_files"])


class _Checker:
    """The checks of one ``trainer.json``, each raising ``CheckpointError`` that names the file and the field."""

    def __init__(self, folder: Location) -> None:
        self.folder = folder
        self.path = join(folder, TRAINER_FILE)

    def fail(self, field: str, value: Any, expected: str, shown: str | None = None) -> None:
        """Raise the error of ``field`` holding ``value`` where ``expected`` belongs."""
        problem = (
            f"{self.path}: {field} is {shown or _SHORT.repr(value)}; it must be {expected}. The file was altered "
            "or damaged after the save."
        )
        raise DamagedCheckpointError(problem, any_earlier_checkpoint(self.folder))

    def count(self, field: str, value: Any, what: str = "a non-negative integer") -> None:
        """``value`` is a non-negative integer (not a boolean) that fits in 64 bits."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.fail(field, value, what)
        if value > INT64_MAX:
            self.fail(field, value, f"at most {INT64_MAX} (64 bits)")

    def step(self, value: Any) -> None:
        """The step is a count, and the N of a ``step-NNNNNN`` folder's name."""
        self.count("step", value, "a non-negative integer (the optimizer steps done)")
        named = STEP_FOLDER.match(base_name(self.folder))
        if named and int(named.group(1)) != value:
            self.fail("step", value, f"{int(named.group(1))}, the step of its folder {base_name(self.folder)}")

    def data(self, field: str, value: Any) -> None:
        """A data position: an object whose counts are non-negative integers, wherever they sit."""
        if not isinstance(value, dict):
            self.fail(field, value, "an object (the data loader's position)")
        for key, item in value.items():
            name = f"{field}.{key}"
            if key in OPAQUE_DATA_FIELDS:
                continue
            if key == "images" and isinstance(item, dict):  # an image loader's position inside another's
                self.data(name, item)
            elif key in POSITION_FIELDS:
                self.count(name, item)
            elif key == "kind" and not isinstance(item, str):
                self.fail(name, item, "a string (the kind of data loader)")
            elif key == "seed" and (isinstance(item, bool) or not isinstance(item, int)):
                self.fail(name, item, "an integer")
            elif key == "seed" and not 0 <= item <= SEED_MAX:
                self.fail(name, item, f"0 to {SEED_MAX}, as train.seed is")
            elif key == "per_rank":
                if not isinstance(item, list):
                    self.fail(name, item, "a list (one position for each data rank)")
                for rank, position in enumerate(item):
                    self.data(f"{name}[{rank}]", position)
            elif isinstance(item, dict):
                self.data(name, item)

    def files(self, value: Any) -> None:
        """The manifest: path inside the folder -> its size and hash (or its size alone)."""
        if not isinstance(value, dict):
            self.fail("files", value, 'an object of file path -> {"size": n, "xxh3_128": hex}')
        for name, entry in value.items():
            field = f"files[{name!r}]"
            parts = name.split("/")
            if not name or name.startswith("/") or any(part in ("", ".", "..") for part in parts):
                self.fail(field, name, "a /-separated path inside the checkpoint folder (no '..')", shown=repr(name))
            if not isinstance(entry, dict):
                self.count(field, entry, 'a size (a non-negative integer) or {"size": n, "xxh3_128": hex}')
                continue
            unknown = sorted(set(entry) - {"size", *HEX_DIGITS})
            if unknown:
                self.fail(field, entry, f"size and hash only (it also has {', '.join(unknown)})")
            self.count(f"{field}.size", entry.get("size"))
            for hash_name, digits in HEX_DIGITS.items():
                found = entry.get(hash_name)
                if found is not None and not (isinstance(found, str) and re.fullmatch(f"[0-9a-f]{{{digits}}}", found)):
                    self.fail(f"{field}.{hash_name}", found, f"{digits} lowercase hex digits")

    def data_files(self, value: Any) -> None:
        """The data files' fingerprint: file name -> its size, how much of it was hashed, and that hash."""
        if not isinstance(value, dict):
            self.fail("data_files", value, 'an object of file name -> {"size": n, "head_bytes": n, "head_sha256": hex}')
        for name, entry in value.items():
            field = f"data_files[{name!r}]"
            if not isinstance(entry, dict):
                self.fail(field, entry, 'an object {"size": n, "head_bytes": n, "head_sha256": hex}')
            self.count(f"{field}.size", entry.get("size"))
            self.count(f"{field}.head_bytes", entry.get("head_bytes"))
            found = entry.get("head_sha256")
            if not (isinstance(found, str) and re.fullmatch("[0-9a-f]{64}", found)):
                self.fail(f"{field}.head_sha256", found, "64 lowercase hex digits")
