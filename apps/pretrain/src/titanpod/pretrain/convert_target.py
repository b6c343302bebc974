"""Where ``titanpod-convert`` may write: a new or empty folder, or (``--overwrite``) one whose other files it keeps,
never a folder inside its source or holding it."""

from __future__ import annotations

from pathlib import Path

from titanpod.checkpoint.atomic import check_target

SHOWN_ENTRIES = 3
"""Entries of a non-empty output folder named in the refusal."""


def check_not_nested(out: Path, source: Path) -> None:
    """Refuse an output folder that is, or lies inside, ``source``, or that holds ``source``."""
    out_path, source_path = Path(out).resolve(), Path(source).resolve()
    if out_path == source_path or out_path.is_relative_to(source_path):
        raise ValueError(
            f"The output folder {out} is inside the source {source}; writing there would mix the two. "
            f"Choose an output folder outside {source}."
        )
    if source_path.is_relative_to(out_path):
        raise ValueError(
            f"The source {source} is inside the output folder {out}; writing there could replace the files being "
            f"read. Choose an output folder that does not hold {source}."
        )


def check_output_folder(out: Path, command: str, overwrite: bool) -> None:
    """Refuse, before any work, an output that is a file or a non-empty folder without ``--overwrite``."""
    out = Path(out)
    if overwrite or not out.is_dir():
        check_target(out, overwrite=True)  # a file is refused either way
        return
    entries = sorted(path.name for path in out.iterdir())
    if entries:
        shown = ", ".join(entries[:SHOWN_ENTRIES]) + (", ..." if len(entries) > SHOWN_ENTRIES else "")
        raise FileExistsError(
            f"The output folder {out} is not empty ({len(entries)} entries: {shown}); titanpod-convert {command} "
            "writes into a new or empty folder. Choose another folder, or pass --overwrite to replace only the "
            "files it writes (other files in the folder are kept)."
        )
