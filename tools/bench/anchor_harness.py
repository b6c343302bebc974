"""What the runners beside the anchor harness share: importing it, and its run set-up.

The harness (``../shared/anchors``: ``common.py`` and its runners) is not a package; a runner
here names its folder with ``--anchors`` and imports its ``common`` module from there, so that
its rows are measured with the harness's own shape, data, clock and record.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any


def import_harness() -> ModuleType:
    """The harness's ``common`` module, from the folder the command line's ``--anchors`` names."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--anchors", type=Path, required=True)
    known, _ = pre.parse_known_args()
    sys.path.insert(0, str(known.anchors.resolve()))
    import common

    return common


def start_run(common: ModuleType, args: argparse.Namespace) -> tuple[dict, dict, dict]:
    """Threads as asked, then ``(quiet, peak, config)``: the host-quiet check, the matmul peak and the
    harness's config with the command line's shape, steps and seed."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    quiet = common.quiet_check(args)
    peak = common.resolve_peak(args)
    config = dict(common.BENCH_CONFIG)
    config.update(seq_len=args.seq_len, local_batch_size=args.batch_size, steps=args.steps,
                  warmup_steps=args.warmup, seed=args.seed)  # fmt: skip
    return quiet, peak, config


def timed_steps(common: ModuleType, config: dict, one_step: Callable[[Any], float], extra_token: int) -> dict:
    """``config["steps"]`` steps on random token ids (``[batch, seq + extra_token]``, seeded by ``config``), each
    timed by the harness's clock; ``one_step(ids)`` runs one and returns its loss as a float. Returns the
    harness's step summary with ``loadavg_start``, ``losses`` and ``first_step_s`` added."""
    import torch

    generator = torch.Generator().manual_seed(config["seed"])
    batch, seq, vocab = config["local_batch_size"], config["seq_len"], config["vocab_size"]
    clock, losses = common.StepClock(), []
    loadavg_start = [round(x, 2) for x in os.getloadavg()]
    for _ in range(config["steps"]):
        clock.start()
        losses.append(one_step(torch.randint(0, vocab, (batch, seq + extra_token), generator=generator)))
        clock.stop()
    stats = common.summarize_steps(clock, config["warmup_steps"], batch * seq)
    return {**stats, "loadavg_start": loadavg_start, "losses": losses, "first_step_s": round(clock.wall[0], 2)}
