"""Whether a checkpoint may be continued under this run's recipe: the one rule resume applies.

Every recipe field is compared, flattened to dotted names (``data.seq_len``, ``model.shape.dim``),
except those in ``HARMLESS_CHANGES``: fields that say how long, where, how often or how fast a run
goes, never what it trains or on what, and those the recipe's classes declare the same maths
(``titanpod.models.field_checks.SAME_MATHS``: which kernel implements an op, its tiles), which the caller
passes as ``same_maths``; so a kernel setting that changes what the model computes, such as
``kernels.window``, is compared. A field outside
that list that differs (the model, the attention, the data stream, the optimizer, the schedule, the
precision) is refused, each named with both values (``old -> new``), unless ``checkpoint.allow_changes``
lists it. Patterns use ``fnmatch``: ``*`` matches any part of a name. A field one recipe lacks (added to
titanpod after the checkpoint was written) and the other leaves at ``None`` is no change: ``None`` is how an
optional setting says "as before".
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Sequence
from typing import Any

from titanpod.checkpoint.errors import CheckpointError
from titanpod.checkpoint.locations import Location

HARMLESS_CHANGES: tuple[str, ...] = (
    "train.steps",  # extends (or shortens) the run, never below the steps done; the schedule is stretched over it
    "train.stop_at_step",  # where this part of the run stops
    "train.log_every",
    "train.step_mode",  # how a step runs (eager, per_block, whole_step), not what it computes
    "train.memory_policy",
    "train.compiler",
    "train.step_compiler",
    "train.compile_cache_dir",
    "train.keep_host_memory",
    "train.skip_nonfinite",
    "train.optimizer_offload",  # where AdamW's moments wait between steps, not their values
    "train.optimizer_offload_overlap",  # how they travel to the device and back
    "train.sum_gradients_in_loop",  # where the micro-batches' gradients are summed, not their sum
    "train.whole_step_update",  # whether AdamW runs inside the compiled step or after it: the same update
    "checkpoint.*",  # when and where checkpoints go, and this list's escape hatch itself
    "output.*",
    "profile.*",  # which steps are traced
    "device.*",
    "target.*",  # read by --dry-run only
    "parallel.tp",  # how the model is laid out over processes; the data-parallel degree (dp_replicate,
    "parallel.ep",  # fsdp) is compared, as it sets the global batch
    "parallel.sequence_parallel",
    "model.recompute_blocks",  # diffusion: memory, not maths
    "model.encodings_cache",
    "data.validation_batches",  # validation and evaluation read the model; they do not train it
    "data.validation_every",
    "eval.*",
    "samples.*",
    "rollout.ray_address",  # GRPO: the resources rollouts run on
    "rollout.worker_cpus",
    "rollout.worker_gpus",
    "rollout.vllm_gpu_memory_utilization",
    "rollout.vllm_kv_cache_mib",
)
"""Recipe fields (``fnmatch`` patterns of dotted names) a resumed run may change without a word."""

_ABSENT = "<absent>"


def recipe_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """Every field whose value differs between recipes ``saved`` and ``current`` (nested dicts), as ``(dotted name,
    old, new)`` sorted by name; a field one lacks is ``<absent>`` there, and one lacks and the other leaves at
    ``None`` is no change."""
    old, new = _flatten(_as_json(saved)), _flatten(_as_json(current))
    changes = []
    for name in sorted(set(old) | set(new)):
        before, after = old.get(name, _ABSENT), new.get(name, _ABSENT)
        if before != after and not (before in (_ABSENT, None) and after in (_ABSENT, None)):
            changes.append((name, before, after))
    return changes


def change_text(name: str, before: Any, after: Any) -> str:
    """One change as it is shown: ``data.seq_len: 32 -> 64``."""
    return f"{name}: {_shown(before)} -> {_shown(after)}"


def is_harmless(name: str, same_maths: Sequence[str] = ()) -> bool:
    """Whether a resumed run may change the field ``name`` without a word: ``HARMLESS_CHANGES``, or a field of
    ``same_maths`` (``titanpod.models.field_checks.same_maths_fields`` of the recipe's class)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in (*HARMLESS_CHANGES, *same_maths))


def is_allowed(name: str, allowed: Sequence[str]) -> bool:
    """Whether ``checkpoint.allow_changes`` (``allowed``, ``fnmatch`` patterns) names the field ``name``."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in allowed)


def check_same_run(
    saved: dict[str, Any],
    current: dict[str, Any],
    folder: Location,
    allowed: Sequence[str] = (),
    same_maths: Sequence[str] = (),
) -> list[str]:
    """Refuse to continue the checkpoint in ``folder`` (written with recipe ``saved``) under the recipe ``current``
    when a field outside ``HARMLESS_CHANGES``, ``same_maths`` (the fields ``current``'s classes declare the same
    maths) and ``allowed`` differs; ``CheckpointError`` names each such field with both values, and an
    ``allowed`` pattern that names no field of either recipe.

    Returns the differences ``allowed`` let through (``"data.seq_len: 32 -> 64"``), to report.
    """
    names = [*_flatten(_as_json(saved)), *_flatten(_as_json(current))]
    unknown = [pattern for pattern in allowed if not fnmatch.filter(names, pattern)]
    if unknown:
        raise CheckpointError(
            f"checkpoint.allow_changes names {', '.join(map(repr, unknown))}, which is no field of this recipe; "
            "give dotted field names such as data.seq_len or train.lr (a * matches any part: data.*)."
        )
    refused, let_through = [], []
    for name, before, after in recipe_changes(saved, current):
        if is_harmless(name, same_maths):
            continue
        (let_through if is_allowed(name, allowed) else refused).append((name, change_text(name, before, after)))
    if refused:
        raise CheckpointError(
            f"The checkpoint {folder} is from a different run: {'; '.join(text for _, text in refused)}. "
            "These change the model, the data stream or the training trajectory, so resuming would mix two runs. "
            "Resume with the recipe the checkpoint was written with, start a new run (--output.run-name NEW), "
            "or accept the changes with "
            f"--checkpoint.allow-changes {','.join(name for name, _ in refused)}."
        )
    return [text for _, text in let_through]


def _shown(value: Any) -> str:
    """A recipe value as a change shows it: ``<absent>`` bare, any other as Python writes it."""
    return value if value == _ABSENT else repr(value)


def _as_json(recipe: dict[str, Any]) -> Any:
    """The recipe as JSON reads it back (tuples become lists), so a saved and a live recipe compare."""
    return json.loads(json.dumps(recipe))


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level of dotted names: ``{"data": {"seq_len": 32}}`` -> ``{"data.seq_len": 32}``."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat
