"""The typed recipe: one object that decides everything a run does."""

from __future__ import annotations

import dataclasses
import difflib
import json
import typing
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, Self

from titanpod.checkpoint.config import CheckpointConfig
from titanpod.data.config import DataConfig
from titanpod.device import DeviceConfig
from titanpod.graph import ProfileConfig, TrainConfig
from titanpod.kernels import KernelConfig
from titanpod.models.common.args import DecoderArgs
from titanpod.models.field_checks import check_field_types, check_value, expand_home, real_number, whole_number
from titanpod.parallel import ParallelConfig
from titanpod.recipes.model_shape import ModelShape

INIT_FROM_SHAPE_FIX = (
    "The folder gives the model's shape (its config.json or model.json): drop the --model.shape.<field> settings "
    "that differ (only --model.shape.max-seq-len may differ from the folder's)."
)
"""What to do when ``model.shape`` asks for sizes the ``init_from`` weights do not have."""


@dataclass(frozen=True)
class ModelConfig:
    """Which model to build."""

    family: str = "llama3"
    """Model family, e.g. ``llama3``. With ``init_from`` the folder's family is used (its config.json names it)."""
    flavor: str = "debug"
    """Named size within the family, e.g. ``debug`` or ``8B``; not read with ``init_from`` (the folder gives the
    shape)."""
    shape: ModelShape = field(default_factory=ModelShape)
    """Sizes that replace the flavor's (all ``None``: the flavor as published); rehearsals shrink models with it.
    With ``init_from`` a size given here must be the folder's, except ``max_seq_len``, which replaces it."""
    capacity_factor: float | None = None
    """Mixture-of-experts models: rows each expert takes per batch, as a multiple of its fair share
    (``MoEArgs.capacity_factor``: choices past it are dropped and reported as ``dropped_tokens``);
    ``None`` keeps the flavor's, which for every shipped flavor is no capacity limit (nothing drops)."""
    init_from: str | None = None
    """Start from these weights instead of the seed's: a titanpod model folder (model.json + model.safetensors,
    e.g. ``<run>/model``), a Hugging Face checkpoint folder (config.json + safetensors) or a Hub model id. The
    model's family and whole shape (sizes, head width, RoPE and its scaling, tied embeddings, norms, vocabulary)
    are the folder's; under torchrun each rank reads only the slices of the tensors it holds. ``None``:
    initialise from ``train.seed``."""

    def __post_init__(self) -> None:
        expand_home(self, "init_from")

    def args(self) -> DecoderArgs:
        """The decoder's shape: the flavor's with ``shape`` and ``capacity_factor`` applied; ``KeyError`` names an
        unknown family or flavor, ``ValueError`` a capacity factor given for a dense model."""
        # the specs list their recipes, which are made of this module's types: looked up when called
        from titanpod.recipes.families import get_flavor

        flavor = get_flavor(self.family, self.flavor)
        return self._with_capacity(self.shape.apply(flavor), f"{self.family} {self.flavor}")

    def checkpoint_args(self, found: DecoderArgs) -> DecoderArgs:
        """The model a run starting from ``init_from`` trains, given the shape ``found`` of the folder's weights:
        ``found`` itself, with what this config sets on purpose. ``shape.max_seq_len`` and ``capacity_factor``
        replace the folder's; every other size given in ``shape`` must be the folder's, compared by meaning (a
        ``head_dim`` of ``dim // n_heads`` is the same as none): ``ValueError`` names each that differs, with both
        values, since weights cannot change size. ``flavor`` is not read."""
        asked = self.shape.apply(found, "model.shape (with model.init_from)")
        from titanpod.checkpoint.pretrained import args_differences  # here: torch, read only when it is asked

        differences = args_differences(found, asked)
        if differences:
            listing = "\n  ".join(differences)
            raise ValueError(
                f"model.init_from {self.init_from!r} does not fit the recipe's model ({len(differences)} fields "
                f"differ):\n  {listing}\n{INIT_FROM_SHAPE_FIX}"
            )
        return self._with_capacity(asked, f"the model of model.init_from {self.init_from!r}")

    def _with_capacity(self, args: DecoderArgs, model: str) -> DecoderArgs:
        if self.capacity_factor is None:
            return args
        if args.moe is None:
            raise ValueError(
                f"model.capacity_factor applies to mixture-of-experts models only; {model} is dense: leave it unset."
            )
        return dataclasses.replace(args, moe=dataclasses.replace(args.moe, capacity_factor=self.capacity_factor))


@dataclass(frozen=True)
class OutputConfig:
    """Where a run writes, and what."""

    runs_dir: str = "runs"
    """Parent folder of run directories (relative paths are from the working directory)."""
    run_name: str | None = None
    """Run directory name, one folder name (no ``/``, ``\\``, leading ``.``); ``None`` (or ``""``, for recipe files,
    which have no null) means ``<recipe>-<YYYYmmdd-HHMMSS>``. One run writes into a run directory at a time."""
    start_over: bool = False
    """Start a new run in a run directory that holds an earlier run's files (``metrics.jsonl``, ``model/``,
    checkpoints) instead of refusing it: they are moved, not deleted, into ``<run>/previous-<UTC time>/`` (step
    folders of a ``checkpoint.dir`` elsewhere into ``previous-<UTC time>/`` there). Without it such a folder is
    refused unless the run resumes one of its checkpoints. The run's ``recipe.json`` records it as off."""
    save_weights: bool = True
    """Write the final weights as safetensors (with model.json and recipe.json) to ``<run>/model``."""
    tensorboard: bool = True
    """Also write every metrics report as TensorBoard scalars under ``tensorboard/`` in the run directory, with
    the recipe as text, its fields as hyper-parameters (the final loss as their metric) and diffusion samples."""
    wandb: str | None = None
    """Weights & Biases project to log the run to (metrics, the recipe as config, the final summary, diffusion
    samples); ``auto``: the project ``WANDB_PROJECT`` names, else ``titanpod``; ``None``: no W&B. Needs
    ``pip install 'titanpod-graph[wandb]'``. A resumed run continues the same W&B run (its id is kept in
    ``<run>/wandb-run-id``; ``WANDB_RUN_ID`` wins when set)."""
    wandb_mode: Literal["online", "offline"] | None = None
    """``online`` sends to the W&B server as the run goes (``wandb login`` first); ``offline`` needs no network
    and keeps the run under ``<run>/wandb/`` for a later ``wandb sync``; ``None``: what ``WANDB_MODE`` says
    (``disabled`` turns W&B off), else ``online``."""
    wandb_entity: str | None = None
    """W&B entity (user or team) the project belongs to; ``None``: ``WANDB_ENTITY``, else your default entity."""
    wandb_required: bool = False
    """Stop before any work when the W&B run cannot start (no login, no network), leaving no new run directory;
    off: say why and train without W&B."""
    license: str = "apache-2.0"
    """The license the exported model card declares, as a Hub license id (``apache-2.0``, ``mit``, ``llama3.1``,
    ``other``...). ``apache-2.0``, titanpod's own, by default: a fine-tune of another model should name that
    model's license."""

    def __post_init__(self) -> None:
        expand_home(self, "runs_dir")
        if self.run_name:  # None and "" take the recipe's name and the time
            check_folder_name("output.run_name", self.run_name, "Choose another with --output.run-name NAME.")


def check_folder_name(field: str, value: object, fix: str) -> None:
    """``ValueError`` naming ``field`` and ``fix`` unless ``value`` is one folder name: a non-empty string of at most
    ``FOLDER_NAME_BYTES`` bytes in UTF-8, without ``/``, ``\\``, control or format characters (NUL, newlines,
    terminal escapes, direction overrides) that does not start with ``.`` (so never ``..``), since run directories
    are named by it and printed."""
    if (
        isinstance(value, str)
        and value
        and not value.startswith(".")
        and len(value.encode("utf-8", errors="replace")) <= FOLDER_NAME_BYTES
        and not any(c in "/\\" or unicodedata.category(c) in HIDDEN_CATEGORIES for c in value)
    ):
        return
    raise ValueError(
        f"{field} {value!r} must be one folder name (not empty, at most {FOLDER_NAME_BYTES} bytes, no '/', '\\', "
        f"control characters such as newlines or terminal escapes, or leading '.'): it names the run directory "
        f"inside output.runs_dir. {fix}"
    )


FOLDER_NAME_BYTES = 200
"""The longest run or recipe name, in UTF-8 bytes: a folder name is at most 255, and ``<name>-<time>`` adds 16."""
HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Unicode categories a name may not hold: control and format characters, surrogates, line and paragraph
separators (they would move a terminal's cursor, or hide part of the name, when it is printed)."""


@dataclass(frozen=True)
class TargetConfig:
    """The hardware a recipe is sized for: what ``--dry-run`` plans for unless told otherwise."""

    chip: str = "cpu"
    """Chip kind (``v5p``, ``v6e``, ``h100`` ...; see titanpod.device.CHIPS), or ``cpu`` for this machine."""
    chips: int = 1
    """Chips in the slice (a TPU v7 chip is two devices)."""
    mfu: float = 0.4
    """Model FLOPs utilisation the dry run assumes to turn FLOPs per step into step time."""

    def __post_init__(self) -> None:
        whole_number("target.chips", self.chips, at_least=1)
        real_number("target.mfu", self.mfu, above=0, at_most=1)


class NamedRun(Protocol):
    """What preparing a run directory needs of any recipe kind (pretraining, diffusion, SFT, GRPO)."""

    name: str
    output: OutputConfig

    def to_json(self) -> str: ...


class RecipeFile:
    """JSON in and out for a recipe dataclass: what is saved beside every run and checkpoint."""

    def to_dict(self) -> dict[str, Any]:
        """The recipe as plain JSON-able data."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def to_json(self) -> str:
        """The recipe as indented JSON."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Rebuild a recipe from ``to_dict`` output; unknown fields are an error that names them."""
        return dataclass_from_dict(cls, data, "recipe")

    @classmethod
    def load(cls, path: Path) -> Self:
        """Read a recipe saved by ``to_json``."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


@dataclass(frozen=True)
class RunRecipe(RecipeFile):
    """The fields every recipe kind shares (pretraining, SFT, GRPO, diffusion): what the run session reads."""

    name: str = "custom"
    """Recipe name, used in run directory names."""
    device: DeviceConfig = field(default_factory=DeviceConfig)
    """Where it runs."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """How it trains: steps, optimizer, schedule, step mode, precision."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """When the trainer state is saved, whether the run resumes, and the Hugging Face export (``export_hf``)."""
    output: OutputConfig = field(default_factory=OutputConfig)
    """What it writes."""
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    """Which steps to trace with the lane's profiler (off by default), into ``<run>/profile/``."""

    def __post_init__(self) -> None:
        check_field_types(self, "")  # every section's numbers and booleans, those without checks of their own too
        self.profile.check_fits(self.train.steps)
        check_folder_name("name", self.name, "Give the recipe another name (--name NAME, or name = ... in its file).")


@dataclass(frozen=True)
class Recipe(RunRecipe):
    """A complete, reproducible description of a pretraining run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The model."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """How it splits over processes (under torchrun); one process ignores it."""
    kernels: KernelConfig = field(default_factory=KernelConfig)
    """Which implementation fills each of the model's op slots (references by default)."""
    data: DataConfig = field(default_factory=DataConfig)
    """What it trains on."""
    target: TargetConfig = field(default_factory=TargetConfig)
    """The slice the recipe is sized for; read by ``--dry-run`` only."""


def dataclass_from_dict(kind: type, data: dict[str, Any], where: str) -> Any:
    """Build dataclass ``kind`` from plain data, recursing into fields that are dataclasses."""
    fields = {f.name for f in dataclasses.fields(kind)}
    unknown = sorted(set(data) - fields)
    if unknown:
        named = ", ".join(with_closest(name, fields) for name in unknown)
        raise ValueError(f"Unknown fields in {where}: {named}.")
    hints = typing.get_type_hints(kind)
    for name, value in data.items():  # before any __post_init__ compares a value of the wrong type
        if not dataclasses.is_dataclass(hints[name]):
            check_value(f"{where}.{name}".removeprefix("recipe."), value, hints[name])
    values = {
        name: dataclass_from_dict(hints[name], value, f"{where}.{name}")
        if dataclasses.is_dataclass(hints[name]) and isinstance(value, dict)
        else value
        for name, value in data.items()
    }
    return kind(**values)


def with_closest(name: str, fields: set[str]) -> str:
    """``name`` as an unknown field is reported: with the closest field's name when one is close (a typo, or
    ``-`` written for ``_``), e.g. ``stpes (did you mean steps?)``."""
    close = difflib.get_close_matches(name.replace("-", "_"), sorted(fields), n=1)
    return f"{name} (did you mean {close[0]}?)" if close else name
