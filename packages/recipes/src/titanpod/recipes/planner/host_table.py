"""How a dry run shows host memory: a summary row, a table by phase, and why a plan does not fit its host."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from titanpod.device import backend_class
from titanpod.recipes.planner.host import PHASES, HostBytes, HostMemoryPlan
from titanpod.recipes.planner.limits import FIT_FRACTION

GiB = 1024**3
GB = 1000**3


def _gib(size: int) -> str:
    return f"{size / GiB:,.2f} GiB"


def host_verdict(host: HostMemoryPlan) -> str:
    """The peak of one worker VM against its memory, or why it is not checked."""
    name = host.chip.name
    if host.per_host is None:
        return f"chips per {name} VM unknown: host memory of {name} VMs unknown: not checked"
    phase, peak = host.per_host.peak
    if host.host_bytes is None:
        return f"{PHASES[phase]} {_gib(peak)}; host memory of {name} VMs unknown: not checked"
    verdict = "[green]fits[/]" if host.fits else "[bold red]does not fit[/]"
    return (
        f"{PHASES[phase]}: {_gib(peak)} of {_gib(host.host_bytes)} ({host.host_bytes / GB:,.0f} GB) "
        f"({peak / host.host_bytes:.0%}; plans may use {FIT_FRACTION:.0%}): {verdict}"
    )


def add_host_row(table: Table, host: HostMemoryPlan | None) -> None:
    """Add the one-line summary to a plan's table: the worker VM's peak against its memory."""
    if host is None:
        table.add_row("host memory", "cpu lane: parameters and state live in host memory (the device total above)")
    else:
        table.add_row(f"host memory per {host.chip.name} VM ({host.lane} lane)", host_verdict(host))


def host_table(host: HostMemoryPlan) -> Table:
    """Host memory by phase: of rank 0, of every other rank, and of the worker VM of rank 0."""
    name = host.chip.name
    if host.per_host is None:
        layout = f"chips per {name} VM unknown: figures per process, one chip's devices each"
    elif host.devices_per_process == 1:
        layout = f"{host.processes_per_host} processes per {name} VM, one per device"
    else:
        layout = f"one process per {name} VM driving its {host.devices_per_process} devices"
    table = Table(title=f"host memory: {host.lane} lane, {layout}")
    table.add_column("phase")
    alone = host.processes_per_host == 1 and host.per_host is not None
    columns: list[tuple[str, HostBytes]] = [("rank 0 (its whole VM)" if alone else "rank 0", host.rank0)]
    if host.processes_per_host > 1 or host.per_host is None:
        columns.append(("every other rank", host.other))
    if host.per_host is not None and host.processes_per_host > 1:
        columns.append((f"worker VM ({host.processes_per_host} processes)", host.per_host))
    for title, _ in columns:
        table.add_column(title, justify="right")
    for phase, words in PHASES.items():
        table.add_row(words, *(_gib(getattr(figures, phase)) for _, figures in columns))
    return table


def host_shortfall(host: HostMemoryPlan) -> str:
    """Why the plan does not fit its worker VM (the peak phase, what it holds, the VM's memory) and the fix."""
    if host.per_host is None or host.host_bytes is None:
        raise ValueError(f"The host memory of {host.chip.name} VMs is unknown: there is no shortfall to state.")
    phase, peak = host.per_host.peak
    held, fix = {
        "init": ("each process's largest parameter shard as it is created", "more chips make the shards smaller"),
        "load": ("the slices read at once and their converted copies", "more chips make the slices smaller"),
        "train": ("what the memory policy moves to the host", "--train.memory-policy recompute keeps it on the device"),
        "checkpoint": (
            "the trainer state staged on the host for an async save",
            "--checkpoint.no-async-save writes one tensor at a time",
        ),
        "save": (
            f"{host.largest_tensor} gathered whole on rank 0, with its write buffer",
            "--output.no-save-weights skips the final gather (the trainer-state checkpoints keep the weights)",
        ),
    }[phase]
    if backend_class(host.lane).single_controller and phase in ("init", "load", "train"):
        fix = f"--device.lane {host.chip.auto_lane} creates parameters on the devices, not the host, or {fix}"
    return (
        f"host memory: a {host.chip.name} worker VM needs {_gib(peak)} at its {PHASES[phase]} ({held}); "
        f"it has {_gib(host.host_bytes)}, of which plans may use {FIT_FRACTION:.0%}. Fix: {fix}."
    )


def print_host(console: Console, recipe_name: str, host: HostMemoryPlan | None) -> None:
    """Print the host memory table and, when the worker VM is too small, why and what to change."""
    if host is None:
        return
    console.print(host_table(host))
    if host.fits is False:
        console.print(f"[bold red]{recipe_name} does not fit:[/] {host_shortfall(host)}", soft_wrap=True)
