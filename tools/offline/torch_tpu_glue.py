"""torch_tpu's wheel with the glue of one torch release only, for a wheelhouse that must stay small.

torch_tpu 0.2.0's wheel (96 MB) carries compiled glue for each torch release from 2.11 to 2.15
(``glue_2_NN_0/`` folders and ``tpu_torch_compile_2_NN_0.so`` libraries). A VM runs one torch release, so
the others are dropped; the files left are compressed with LZMA (which pip's installer reads) and the
wheel's RECORD lists exactly them. Name and version stay those of the wheel it came from.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

GLUE = re.compile(r"(?:^|/)(?:glue|tpu_torch_compile)_2_(\d+)_0(?:/|\.so$)")
"""A path inside one torch release's glue; group 1 is the release's minor number."""


def other_release(path: str, torch_minor: int) -> bool:
    """Whether ``path`` belongs to the glue of a torch release other than ``2.<torch_minor>``."""
    match = GLUE.search(path)
    return match is not None and int(match.group(1)) != torch_minor


def keep_one_release(wheel: Path, out: Path, torch_minor: int) -> tuple[int, int]:
    """Write ``wheel`` to ``out`` with only torch ``2.<torch_minor>``'s glue; returns (files kept, dropped)."""
    with zipfile.ZipFile(wheel) as source:
        names = source.namelist()
        kept = [name for name in names if not other_release(name, torch_minor)]
        if not any(GLUE.search(name) for name in kept):
            raise SystemExit(f"error: {wheel.name} holds no glue for torch 2.{torch_minor}; it cannot run with it")
        records = [name for name in kept if name.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            raise SystemExit(f"error: {wheel.name} has {len(records)} RECORD files, not one: not a wheel")
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_LZMA) as target:
            for name in kept:
                data = source.read(name)
                if name == records[0]:
                    lines = data.decode().splitlines()
                    data = "".join(f"{line}\n" for line in lines if not other_release(line.split(",")[0], torch_minor))
                    data = data.encode()
                target.writestr(source.getinfo(name), data, compress_type=zipfile.ZIP_LZMA)
    return len(kept), len(names) - len(kept)
