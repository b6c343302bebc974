"""``titanpod-convert``: Hugging Face checkpoints in and out.

    titanpod-convert import SOURCE OUT      # HF folder or Hub id -> titanpod checkpoint
    titanpod-convert export CKPT OUT        # titanpod checkpoint, trainer checkpoint or run -> HF folder
    titanpod-convert push FOLDER REPO_ID    # upload an exported folder to the Hub
    titanpod-convert gguf FILE.gguf OUT     # GGUF file (llama.cpp's format) -> HF folder

A titanpod checkpoint is a folder with ``model.safetensors`` (titanpod tensor names) and
``model.json`` (family, shape, special token ids); ``titanpod-pretrain`` writes one to ``<run>/model``.
``import`` copies the source's tokenizer and generation files into it; ``export`` writes config.json, the
safetensors, the tokenizer files, generation_config.json and a README.md model card (``convert_source``
says what it reads from each kind of CKPT). ``gguf`` dequantizes a Llama 3 or Qwen 3 GGUF file with transformers'
own GGUF loading and writes the Hugging Face folder a run starts from (``--model.init-from`` also takes the file
itself, converting it once into a cache).

OUT must be a new or empty folder, outside the source (and not holding it). With ``--overwrite`` an
existing folder is written into: the files the command writes replace their namesakes, weight files
an earlier export left (the single file, the index and the shards it lists) are removed, and every
other file stays.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Literal

import tyro
from rich.console import Console

from titanpod.checkpoint import load_hf_checkpoint, push, resolve_source, save_hf_checkpoint, save_model
from titanpod.checkpoint.companion_files import has_tokenizer, read_companions
from titanpod.checkpoint.gguf_files import find_gguf, write_gguf_as_hf
from titanpod.checkpoint.hf_files import DEFAULT_MAX_SHARD_BYTES
from titanpod.checkpoint.model_card import CARD_FILE
from titanpod.checkpoint.safetensors_io import dtype_from_name
from titanpod.models import parameter_count
from titanpod.pretrain.convert_source import open_export_source
from titanpod.pretrain.convert_target import check_not_nested, check_output_folder
from titanpod.recipes.command_line import PlainHelpRegistry, boolean_flags, flags_from_values, plain_help
from titanpod.recipes.errors import print_error
from titanpod.recipes.families import decoder_adapters, hf_adapter

DEFAULT_COMMIT_MESSAGE = "Upload from titanpod"
"""The commit message of a push that names none."""
PROG = "titanpod-convert"
"""The command's name in usage and help."""

Dtype = Literal["float32", "bfloat16", "float16"]
"""The weight types a conversion can write."""


@dataclasses.dataclass(frozen=True)
class ImportCommand:
    """Hugging Face checkpoint (folder or Hub id) -> titanpod checkpoint."""

    source: Annotated[tyro.conf.Positional[str], tyro.conf.arg(metavar="SOURCE")]
    """a folder with config.json and safetensors, or a Hub id like org/name"""
    out: Annotated[tyro.conf.Positional[Path], tyro.conf.arg(metavar="OUT")]
    """titanpod checkpoint folder to write"""
    revision: str | None = None
    """Hub revision (branch, tag or commit)"""
    dtype: Dtype | None = None
    """convert weights to this type (default: as stored)"""
    overwrite: tyro.conf.FlagCreatePairsOff[bool] = False
    """write into a non-empty OUT: replace only the files this writes, keep every other file"""


@dataclasses.dataclass(frozen=True)
class ExportCommand:
    """titanpod checkpoint -> Hugging Face folder."""

    checkpoint: Annotated[tyro.conf.Positional[Path], tyro.conf.arg(metavar="CHECKPOINT")]
    """titanpod model folder (<run>/model, an import), trainer checkpoint (<run>/checkpoints/step-NNNNNN) or run
    directory (its model/, else its newest checkpoint)"""
    out: Annotated[tyro.conf.Positional[Path], tyro.conf.arg(metavar="OUT")]
    """Hugging Face folder to write"""
    max_shard_size: str = f"{DEFAULT_MAX_SHARD_BYTES // 1000**3}GB"
    """largest safetensors shard, e.g. 5GB, 500MB"""
    dtype: Dtype | None = None
    """write weights of this type (default: as stored)"""
    overwrite: tyro.conf.FlagCreatePairsOff[bool] = False
    """write into a non-empty OUT: replace only the files this writes, keep every other file"""


@dataclasses.dataclass(frozen=True)
class PushCommand:
    """Upload an exported Hugging Face folder to the Hub."""

    folder: Annotated[tyro.conf.Positional[Path], tyro.conf.arg(metavar="FOLDER")]
    """an exported Hugging Face folder (titanpod-convert export OUT)"""
    repo_id: Annotated[tyro.conf.Positional[str], tyro.conf.arg(metavar="REPO_ID")]
    """org/name"""
    revision: Annotated[str | None, tyro.conf.arg(aliases=("--branch",))] = None
    """branch to push to (created if missing)"""
    create_pr: tyro.conf.FlagCreatePairsOff[bool] = False
    """open a pull request instead of committing"""
    commit_message: str = DEFAULT_COMMIT_MESSAGE
    """the commit's (or pull request's) title"""
    private: bool = True
    """create the repository private (--no-private, or --public, creates it public)"""


@dataclasses.dataclass(frozen=True)
class GgufCommand:
    """GGUF file (llama.cpp's format) -> Hugging Face folder."""

    source: Annotated[tyro.conf.Positional[Path], tyro.conf.arg(metavar="GGUF")]
    """a .gguf file of a Llama 3 or Qwen 3 model (or a folder holding one), its tokenizer inside"""
    out: Annotated[tyro.conf.Positional[Path], tyro.conf.arg(metavar="OUT")]
    """Hugging Face folder to write"""
    dtype: Dtype = "float32"
    """write weights of this type (float32 keeps the dequantized values exactly)"""
    overwrite: tyro.conf.FlagCreatePairsOff[bool] = False
    """write into a non-empty OUT: replace only the files this writes, keep every other file"""


Command = ImportCommand | ExportCommand | PushCommand | GgufCommand
"""One parsed subcommand."""
ConvertCommand = (
    Annotated[ImportCommand, tyro.conf.subcommand("import")]
    | Annotated[ExportCommand, tyro.conf.subcommand("export")]
    | Annotated[PushCommand, tyro.conf.subcommand("push")]
    | Annotated[GgufCommand, tyro.conf.subcommand("gguf")]
)
"""One of the four subcommands."""


def parse_command(argv: Sequence[str]) -> Command:
    """``argv`` parsed into its subcommand. A value tyro refuses (an unknown ``--dtype``) is reported on stderr
    with the usage and raises ``SystemExit(2)``; ``--help`` raises ``SystemExit(0)``."""
    flags = {
        **boolean_flags(ImportCommand),
        **boolean_flags(ExportCommand),
        **boolean_flags(PushCommand),
        **boolean_flags(GgufCommand),
    }
    args = ["--no-private" if arg == "--public" else arg for arg in flags_from_values(argv, flags)]
    return tyro.cli(
        ConvertCommand,  # type: ignore[arg-type]
        args=args,
        prog=PROG,
        description=plain_help(__doc__.splitlines()[0]),
        registry=PlainHelpRegistry(),
        config=(tyro.conf.OmitSubcommandPrefixes,),
    )


def _tokenizer_line(files: Mapping[str, object], source: Path) -> str:
    """Which tokenizer and generation files went along, in words."""
    if has_tokenizer(files):
        return f"with tokenizer files: {', '.join(sorted(files))}"
    return f"without a tokenizer: {source} has none (AutoTokenizer will not load the output)"


def run(args: Command, console: Console) -> None:
    """Carry out one parsed command, printing progress to ``console``."""
    start = time.perf_counter()
    say = console.print
    if isinstance(args, ImportCommand):
        check_output_folder(args.out, "import", args.overwrite)
        source = resolve_source(args.source, args.revision)
        check_not_nested(args.out, source)
        dtype = dtype_from_name(args.dtype) if args.dtype else None
        loaded = load_hf_checkpoint(source, dtype=dtype, progress=say, adapters=decoder_adapters())
        companions = read_companions(source)
        about = (
            {"source": str(args.source), "revision": args.revision} if args.revision else {"source": str(args.source)}
        )
        save_model(
            loaded.model,
            loaded.family,
            args.out,
            {"source": str(args.source)},
            extra_files=companions,
            overwrite=args.overwrite,
            special_tokens=loaded.special_tokens,
            about=about,
        )
        say(f"imported {loaded.family} ({parameter_count(loaded.model):,} parameters) from {source} into {args.out}")
        say(_tokenizer_line(companions, source))
    elif isinstance(args, ExportCommand):
        check_output_folder(args.out, "export", args.overwrite)
        found = open_export_source(args.checkpoint)  # not a checkpoint: said before anything is written
        check_not_nested(args.out, found.read_from)
        dtype = dtype_from_name(args.dtype) if args.dtype else None
        save_hf_checkpoint(
            found.model,
            hf_adapter(found.family),
            args.out,
            args.max_shard_size,
            dtype=dtype,
            progress=say,
            overwrite=args.overwrite,
            special_tokens=found.special_tokens,
            extra_files={**found.files, CARD_FILE: found.card.render()},
            attention_window=found.attention_window,
        )
        count = parameter_count(found.model)
        say(f"exported {found.family} ({count:,} parameters) from {found.read_from} to {args.out}")
        say(_tokenizer_line(found.files, found.read_from))
    elif isinstance(args, GgufCommand):
        check_output_folder(args.out, "gguf", args.overwrite)
        path = find_gguf(args.source)
        if path is None:
            raise FileNotFoundError(f"{args.source} is not a .gguf file, nor a folder holding one.")
        check_not_nested(args.out, path)
        read = write_gguf_as_hf(
            path, args.out, decoder_adapters(), dtype_from_name(args.dtype), progress=say, overwrite=args.overwrite
        )
        say(f"converted {read.family} ({parameter_count(read.model):,} parameters) from {path} into {args.out}")
        say(_tokenizer_line(read.files, path))
    else:
        files = push(
            args.folder,
            args.repo_id,
            private=args.private,
            revision=args.revision,
            create_pr=args.create_pr,
            commit_message=args.commit_message,
        )
        where = f"{args.repo_id}@{args.revision}" if args.revision else args.repo_id
        say(
            f"pushed {len(files)} files from {args.folder} to {where}"
            + (" as a pull request" if args.create_pr else "")
        )
    say(f"done in {time.perf_counter() - start:.1f} s")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``titanpod-convert``; returns the process exit code."""
    args = parse_command(sys.argv[1:] if argv is None else argv)
    console = Console()
    try:
        run(args, console)
    except (OSError, ValueError, KeyError) as error:
        print_error(error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
