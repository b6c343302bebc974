"""Lane names and the rule that picks one.

A lane is a way of running PyTorch: ``cpu``, ``cuda``, ``xla`` (torchax on JAX), ``tpu``
(torch_tpu) or ``torch_xla`` (legacy), each a backend class in a ``LaneRegistry``. Picking
one only *looks* at the machine (``titanpod.device.probes``), so nothing here imports jax,
torch_tpu or torch_xla.

Which lane runs, first match wins:

1. the lane named in the run's config (``DeviceConfig.lane``), unless it is ``auto``;
2. the ``TITANPOD_LANE`` environment variable, unless unset, empty or ``auto``;
3. automatic: the first lane of the registry's ``auto_order`` whose backend class is ``detected``
   here: ``tpu`` if torch_tpu is installed and a TPU is attached, then ``torch_xla`` if torch_xla
   is installed and a TPU is attached, then ``cuda`` if PyTorch sees a CUDA device, else ``cpu``.
   The ``xla`` lane is never picked automatically: ask for it.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping

from titanpod.device.errors import LaneUnavailableError
from titanpod.device.probes import cuda_visible as cuda_visible
from titanpod.device.probes import module_installed as module_installed
from titanpod.device.probes import tpu_attached as tpu_attached
from titanpod.device.registry import LANE_REGISTRY, LaneRegistry

LANES: tuple[str, ...] = LANE_REGISTRY.names
"""Every lane titanpod ships, in the order of the lane table in docs/architecture.md (Lanes)."""

AUTO = "auto"
LANE_ENV_VAR = "TITANPOD_LANE"


def check_lane_name(name: str, registry: LaneRegistry = LANE_REGISTRY) -> str:
    """Return ``name`` normalised, or raise ``ValueError`` naming the closest lane."""
    normalised = name.strip().lower().replace("-", "_")
    choices = (*registry.names, AUTO)
    if normalised in choices:
        return normalised
    close = difflib.get_close_matches(normalised, choices, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"Unknown lane {name!r}; choose one of {', '.join(choices)}.{hint}")


def unavailable_reason(lane: str, registry: LaneRegistry = LANE_REGISTRY) -> str | None:
    """Why ``lane`` cannot run here, with the fix; ``None`` when it can."""
    return registry.backend_class(check_lane_name(lane, registry)).unavailable_reason()


def auto_lane(registry: LaneRegistry = LANE_REGISTRY) -> str:
    """The lane the automatic order picks on this machine (see the module docstring)."""
    for lane in registry.auto_order:
        if registry.backend_class(lane).detected():
            return lane
    raise LaneUnavailableError(
        f"No lane of the automatic order ({', '.join(registry.auto_order)}) can run here: name one with "
        f"{LANE_ENV_VAR} or --device.lane."
    )


def resolve_lane(
    requested: str = AUTO, environ: Mapping[str, str] | None = None, registry: LaneRegistry = LANE_REGISTRY
) -> str:
    """Pick the lane to run from ``registry``: the config's, else ``TITANPOD_LANE``, else automatic.

    Raises ``LaneUnavailableError`` when the chosen lane cannot run here, and
    ``ValueError`` for a name that is not a lane.
    """
    env = os.environ if environ is None else environ
    lane = check_lane_name(requested or AUTO, registry)
    source = "the run's config (device.lane)"
    if lane == AUTO:
        from_env = env.get(LANE_ENV_VAR, "").strip()
        lane = check_lane_name(from_env, registry) if from_env else AUTO
        source = f"the {LANE_ENV_VAR} environment variable"
    if lane == AUTO:
        return auto_lane(registry)
    reason = registry.backend_class(lane).unavailable_reason()
    if reason is not None:
        raise LaneUnavailableError(f"{reason} (lane {lane!r} was asked for by {source})")
    return lane
