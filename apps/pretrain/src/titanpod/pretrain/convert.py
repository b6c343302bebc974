"""``titanpod-convert``: Hugging Face checkpoints in and out.

    titanpod-convert import SOURCE OUT      # HF folder or Hub id -> titanpod checkpoint
    titanpod-convert export CKPT OUT        # titanpod checkpoint -> HF folder (sharded safetensors)
    titanpod-convert push FOLDER REPO_ID    # upload an exported folder to the Hub

A titanpod checkpoint is a folder with ``model.safetensors`` (titanpod tensor names) and
``model.json`` (family and shape); ``titanpod-pretrain`` writes one to ``<run>/model``.

OUT must be a new or empty folder, outside the source (and not holding it). With ``--overwrite`` an
existing folder is written into: the files the command writes replace their namesakes, weight files
an earlier export left (the single file, the index and the shards it lists) are removed, and every
other file stays.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console

from titanpod.checkpoint import load_hf_checkpoint, load_model, push, resolve_source, save_hf_checkpoint, save_model
from titanpod.checkpoint.hf_files import DEFAULT_MAX_SHARD_BYTES
from titanpod.checkpoint.model_files import read_model_description
from titanpod.checkpoint.safetensors_io import dtype_from_name
from titanpod.models import parameter_count
from titanpod.pretrain.convert_target import check_not_nested, check_output_folder
from titanpod.recipes.errors import print_error

OVERWRITE_HELP = "write into a non-empty OUT: replace only the files this writes, keep every other file"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="titanpod-convert", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    to_titanpod = commands.add_parser(
        "import", help="Hugging Face checkpoint (folder or Hub id) -> titanpod checkpoint"
    )
    to_titanpod.add_argument("source", help="a folder with config.json and safetensors, or a Hub id like org/name")
    to_titanpod.add_argument("out", type=Path, help="titanpod checkpoint folder to write")
    to_titanpod.add_argument("--revision", help="Hub revision (branch, tag or commit)")
    to_titanpod.add_argument("--dtype", help="convert weights to float32, bfloat16 or float16 (default: as stored)")
    to_titanpod.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    to_hf = commands.add_parser("export", help="titanpod checkpoint -> Hugging Face folder")
    to_hf.add_argument("checkpoint", type=Path, help="titanpod checkpoint folder (model.safetensors + model.json)")
    to_hf.add_argument("out", type=Path, help="Hugging Face folder to write")
    to_hf.add_argument("--max-shard-size", default=f"{DEFAULT_MAX_SHARD_BYTES // 1000**3}GB", help="e.g. 5GB, 500MB")
    to_hf.add_argument("--dtype", help="write float32, bfloat16 or float16 (default: as stored)")
    to_hf.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    upload = commands.add_parser("push", help="upload an exported Hugging Face folder to the Hub")
    upload.add_argument("folder", type=Path)
    upload.add_argument("repo_id", help="org/name")
    upload.add_argument("--public", action="store_true", help="create the repository public (default private)")
    return parser


def run(args: argparse.Namespace, console: Console) -> None:
    """Carry out one parsed command, printing progress to ``console``."""
    start = time.perf_counter()
    say = console.print
    if args.command == "import":
        check_output_folder(args.out, "import", args.overwrite)
        source = resolve_source(args.source, args.revision)
        check_not_nested(args.out, source)
        dtype = dtype_from_name(args.dtype) if args.dtype else None
        loaded = load_hf_checkpoint(source, dtype=dtype, progress=say)
        save_model(loaded.model, loaded.family, args.out, {"source": str(args.source)}, overwrite=args.overwrite)
        say(f"imported {loaded.family} ({parameter_count(loaded.model):,} parameters) from {source} into {args.out}")
    elif args.command == "export":
        read_model_description(args.checkpoint)  # not a checkpoint: say so first
        check_output_folder(args.out, "export", args.overwrite)
        check_not_nested(args.out, args.checkpoint)
        family, model = load_model(args.checkpoint)
        dtype = dtype_from_name(args.dtype) if args.dtype else None
        save_hf_checkpoint(
            model, family, args.out, args.max_shard_size, dtype=dtype, progress=say, overwrite=args.overwrite
        )
        say(f"exported {family} ({parameter_count(model):,} parameters) to {args.out}")
    else:
        files = push(args.folder, args.repo_id, private=not args.public)
        say(f"pushed {len(files)} files from {args.folder} to {args.repo_id}")
    say(f"done in {time.perf_counter() - start:.1f} s")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``titanpod-convert``; returns the process exit code."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    console = Console()
    try:
        run(args, console)
    except (OSError, ValueError, KeyError) as error:
        print_error(error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
