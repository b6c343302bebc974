"""Draw the picture of titanpod's layers and lanes: ``docs/images/layers.svg``.

    uv run python tools/make_layers_image.py            # writes docs/images/layers.svg
    uv run python tools/make_layers_image.py --check    # exits 1 when the file is not what this draws

The layers come, bottom to top, from the import-linter contract in ``pyproject.toml`` (the order
``uv run lint-imports`` enforces), so the picture cannot drift from it:
``tests/workspace/test_doc_links.py`` checks that the file is what this script draws. The SVG is
written by hand (plain text, no plotting library), so the same input gives the same bytes.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from html import escape
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
IMAGE = REPO / "docs" / "images" / "layers.svg"
"""Where the picture lives."""

OWNS = {
    "titanpod.device": "lanes, devices, meshes, memory statistics, the chip table",
    "titanpod.models": "single-device PyTorch models, flavors, op slots, Hugging Face adapters",
    "titanpod.parallel": "sharding plans as data; DTensor and XLA SPMD executors",
    "titanpod.kernels": "jax_op; Splash, Pallas loss, megablox gmm, cpu_flash",
    "titanpod.graph": "the step (eager, per-block, whole step), loop, AdamW, metrics",
    "titanpod.checkpoint": "trainer state (DCP, Orbax), safetensors, Hugging Face, Hub",
    "titanpod.data": "sources, tokenizers, packing, per-rank positions, exact resume",
    "titanpod.recipes": "typed recipes, registries, the dry-run planner, rehearsal scaling",
    "titanpod.runs": "run sessions, runners, rehearsals, titanpod-launch",
    "titanpod.rl": "rollout engines, verified weight sync, rewards, GRPO",
    "titanpod.pretrain": "titanpod-pretrain, -convert",
    "titanpod.diffusion": "titanpod-diffusion",
    "titanpod.posttrain": "titanpod-posttrain",
}
"""What each layer owns, in a line (docs/architecture.md says it in full)."""

LANES = (
    ("cpu", "cpu · inductor · gloo"),
    ("cuda", "cuda · inductor · NCCL"),
    ("xla", "JAX devices via torchax · jax.jit · XLA SPMD"),
    ("tpu", 'torch_tpu · backend="tpu" · torch_tpu group'),
    ("torch_xla", "xla lazy tensors · torch_xla.compile · PJRT"),
)
"""Each lane of ``titanpod.device.LANES``: device · compiler · collectives."""

CHOOSING = (
    "each run picks one lane, first match:",
    "1. the recipe's device.lane (--device.lane)",
    "2. the TITANPOD_LANE environment variable",
    "3. tpu or torch_xla when a TPU is attached,",
    "    then cuda when a GPU is visible, else cpu",
    "xla runs only when asked for; tpu and",
    "torch_xla have envs/tpu, envs/torch_xla",
)
"""The rule of ``titanpod.device.lanes.resolve_lane``, in a few lines."""

WIDTH, ROW, GAP, TOP = 1000, 40, 8, 64
LAYER_X, LAYER_W = 24, 600
LANE_X, LANE_W = 690, 286
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
INK, MUTED, EDGE = "#1f2933", "#52606d", "#9aa5b1"
APP_FILL, LAYER_FILL, DEVICE_FILL, LANE_FILL = "#e3f0ff", "#f5f7fa", "#fff4d6", "#fdebd0"


def layer_order(pyproject: Path = REPO / "pyproject.toml") -> list[list[str]]:
    """The layers of the import-linter contract, top first; each a list of the modules that share it."""
    config = tomllib.loads(pyproject.read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    return [[name.strip() for name in layer.split("|")] for layer in contract["layers"]]


def _text(
    x: float, y: float, text: str, *, size: int = 13, weight: str = "normal", fill: str = INK, anchor: str = "start"
) -> str:
    return (
        f'<text x="{x:g}" y="{y:g}" font-family="{FONT}" font-size="{size}" font-weight="{weight}" '
        f'fill="{fill}" text-anchor="{anchor}">{escape(text)}</text>'
    )


def _box(x: float, y: float, w: float, h: float, fill: str) -> str:
    return f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="6" fill="{fill}" stroke="{EDGE}"/>'


def render(layers: list[list[str]] | None = None) -> str:
    """The SVG text of the picture."""
    layers = layer_order() if layers is None else layers
    height = TOP + len(layers) * (ROW + GAP) + 56
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}">',
        f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>',
        _text(LAYER_X, 28, "titanpod: layers (each imports only the layers below it)", size=17, weight="bold"),
        _text(
            LAYER_X,
            48,
            "order enforced by import-linter (uv run lint-imports); the apps are thin entry points",
            size=12,
            fill=MUTED,
        ),
        _text(LANE_X, 28, "lanes: how PyTorch runs", size=17, weight="bold"),
        _text(LANE_X, 48, "device · compiler · collectives", size=12, fill=MUTED),
    ]
    device_y = 0.0
    for row, names in enumerate(layers):
        y = TOP + row * (ROW + GAP)
        width = (LAYER_W - GAP * (len(names) - 1)) / len(names)
        for column, name in enumerate(names):
            x = LAYER_X + column * (width + GAP)
            app = len(names) > 1 or name in ("titanpod.pretrain", "titanpod.diffusion", "titanpod.posttrain")
            fill = APP_FILL if app else DEVICE_FILL if name == "titanpod.device" else LAYER_FILL
            parts.append(_box(x, y, width, ROW, fill))
            parts.append(_text(x + 10, y + 17, name, size=13, weight="bold"))
            parts.append(_text(x + 10, y + 33, OWNS.get(name, ""), size=11, fill=MUTED))
        if names == ["titanpod.device"]:
            device_y = y
    lanes_top = TOP + (len(layers) - len(LANES)) * (ROW + GAP)
    for row, (lane, what) in enumerate(LANES):
        y = lanes_top + row * (ROW + GAP)
        parts.append(_box(LANE_X, y, LANE_W, ROW, LANE_FILL))
        parts.append(_text(LANE_X + 10, y + 17, lane, size=13, weight="bold"))
        parts.append(_text(LANE_X + 10, y + 33, what, size=11, fill=MUTED))
        # every lane hangs off the device layer: it picks one per run (device.lane, TITANPOD_LANE, automatic)
        parts.append(
            f'<path d="M {LAYER_X + LAYER_W:g} {device_y + ROW / 2:g} C {LANE_X - 40:g} {device_y + ROW / 2:g} '
            f'{LAYER_X + LAYER_W + 20:g} {y + ROW / 2:g} {LANE_X:g} {y + ROW / 2:g}" fill="none" stroke="{EDGE}" '
            'stroke-width="1.5"/>'
        )
    # how a run picks its lane, above the lanes
    choose_y = lanes_top - 4 * (ROW + GAP) + GAP
    parts.append(_box(LANE_X, choose_y, LANE_W, 4 * (ROW + GAP) - 3 * GAP, "#ffffff"))
    for line, text in enumerate(CHOOSING):
        indent = 14 if text.startswith(" ") else 0
        parts.append(
            _text(
                LANE_X + 10 + indent,
                choose_y + 22 + 19 * line,
                text.strip(),
                size=12,
                fill=INK if line == 0 else MUTED,
                weight="bold" if line == 0 else "normal",
            )
        )
    note_y = TOP + len(layers) * (ROW + GAP) + 16
    parts.append(
        _text(
            LAYER_X,
            note_y,
            "A recipe names the model, plan, kernels, step mode, data and lane; the same "
            "recipe runs on a CPU, a GPU or a TPU pod.",
            size=12,
            fill=MUTED,
        )
    )
    parts.append(
        _text(
            LAYER_X,
            note_y + 18,
            "Model code never imports parallel, kernels or graph: they are applied to it from outside, by name.",
            size=12,
            fill=MUTED,
        )
    )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main() -> None:
    """Write the picture, or with ``--check`` say whether the file is up to date."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the file differs from what this draws")
    args = parser.parse_args()
    svg = render()
    if args.check:
        if not IMAGE.is_file() or IMAGE.read_text() != svg:
            sys.exit(f"{IMAGE.relative_to(REPO)} is out of date: run uv run python tools/make_layers_image.py")
        return
    IMAGE.parent.mkdir(parents=True, exist_ok=True)
    IMAGE.write_text(svg)
    print(f"wrote {IMAGE.relative_to(REPO)}")


if __name__ == "__main__":
    main()
