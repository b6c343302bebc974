"""How ``titanpod-launch`` starts a lane's processes on one host of a multi-host job, as data a backend declares."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HostLaunch:
    """What the launcher needs to know of a lane to start it on a host (``Backend.launch``; ``None`` there: the
    launcher does not start the lane)."""

    processes_per_host: int | None = None
    """Processes each host runs when ``--nproc-per-node`` does not say; ``None``: one per device, counted as the
    fields below allow, else the launcher asks for ``--nproc-per-node``."""
    counts_local_devices: bool = False
    """The launcher may count this host's devices itself (``Backend.device_count`` of a backend it constructs,
    which must be cheap and start nothing)."""
    devices_per_host_var: str | None = None
    """The environment variable that holds the devices of each host, agreed with ``--nproc-per-node``."""
    devices_from_slice_type: bool = False
    """The slice type a TPU VM advertises (``TPU_ACCELERATOR_TYPE``) gives the devices of each host through the
    chip table."""
    workers_from_vm_metadata: bool = False
    """Hosts are Cloud TPU VMs: where neither flags nor variables name the worker hosts and this host's number,
    the VM's metadata does."""
    slicebuilder_ports: bool = False
    """The processes run torch_tpu's runtime: it needs ``TORCH_TPU_SLICEBUILDER_ADDRESSES`` (a port per device
    of every host) and the variables torch_tpu's own launch code fills in."""
