"""The launch environment of one host of a multi-host job, computed from the slice's worker list.

Pure: it reads only the mapping it is given, and never overwrites a variable already set there
(an operator can pin any of them from outside, as with torch_tpu's ``set_tpu_launch_env``).
The variables are named as torch_tpu names them, so a job launched by either agrees:

- every lane: ``NNODES``, ``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` (the process group's
  coordinator: the first host, port 29500), ``WORLD_SIZE`` (hosts x processes per host) and
  ``TITANPOD_LANE``;
- a lane whose processes run torch_tpu's runtime (``HostLaunch.slicebuilder_ports``: the tpu lane), as
  well: ``TORCH_TPU_SLICEBUILDER_ADDRESSES``, ``host:port`` for each device of each host in host order,
  ports ``TORCH_TPU_BASE_PORT`` (8070) + device index.

What a lane needs is what its backend class declares (``Backend.launch``, a ``HostLaunch``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from titanpod.device import LANE_ENV_VAR, LANES, HostLaunch, backend_class
from titanpod.device.chips import chip_by_name
from titanpod.device.lanes import AUTO

DEFAULT_MASTER_PORT = 29500
"""The coordinator's port when neither ``--coordinator`` nor ``MASTER_PORT`` gives one (torch_tpu's)."""
DEFAULT_BASE_PORT = 8070
"""torch_tpu's first slicebuilder port on each host (``TORCH_TPU_BASE_PORT``)."""
ACCELERATOR_TYPE_VARS = ("TPU_ACCELERATOR_TYPE", "ACCELERATOR_TYPE")
"""Where a TPU VM says its slice type (``v5p-256``), read for the devices per host."""


class LaunchError(ValueError):
    """The launch cannot be set up as asked; the message names the input and the fix."""


def launch_lanes() -> tuple[str, ...]:
    """Lanes the launcher starts: those whose backend class declares a ``HostLaunch`` (tpu, cuda, cpu)."""
    return tuple(lane for lane in LANES if backend_class(lane).launch is not None)


def host_launch(lane: str) -> HostLaunch:
    """How the launcher starts ``lane`` on a host; ``LaunchError`` naming the lanes it starts otherwise."""
    launch = backend_class(lane).launch if lane in LANES else None
    if launch is None:
        raise LaunchError(
            f"Lane {lane!r} cannot be launched by titanpod-launch; choose one of {', '.join(launch_lanes())}."
        )
    return launch


@dataclass(frozen=True)
class LaunchRequest:
    """What the launcher was told on its command line; ``None`` means: from the environment."""

    lane: str = "tpu"
    """A lane the launcher starts (``launch_lanes``): ``tpu``, ``cuda`` or ``cpu``."""
    hosts: tuple[str, ...] | None = None
    """Every worker host of the job in order, the same list on every host; else ``TPU_WORKER_HOSTNAMES``."""
    node_rank: int | None = None
    """This host's index in ``hosts``; else ``NODE_RANK``, ``TPU_WORKER_ID`` or ``JOB_COMPLETION_INDEX``."""
    nproc_per_node: int | None = None
    """Processes on this host; else what the lane's ``HostLaunch`` says: ``TORCH_TPU_DEVICES_PER_HOST`` or the
    slice type's devices per host (lane tpu), 1 (lane cpu)."""
    nnodes: int | None = None
    """Expected number of hosts, checked against ``hosts`` so a wrong list fails here, not as a hang."""
    coordinator: str | None = None
    """``host[:port]`` of the process group's store; else ``MASTER_ADDR``/``MASTER_PORT`` or the first host."""
    base_port: int | None = None
    """First slicebuilder port on each host (lane tpu); else ``TORCH_TPU_BASE_PORT`` or 8070."""


@dataclass(frozen=True)
class LaunchEnvironment:
    """The variables of this host's launch, and what the agent (torchrun) is started with."""

    variables: dict[str, str]
    """Every launch variable with the value the job will see (a pinned one keeps its value)."""
    pinned: frozenset[str] = field(default_factory=frozenset)
    """Names that were already set in the base environment: shown, never overwritten."""

    @property
    def to_set(self) -> dict[str, str]:
        """The variables the launcher adds to the environment."""
        return {name: value for name, value in self.variables.items() if name not in self.pinned}

    @property
    def nnodes(self) -> int:
        """Number of hosts."""
        return int(self.variables["NNODES"])

    @property
    def node_rank(self) -> int:
        """This host's rank among the hosts."""
        return int(self.variables["NODE_RANK"])

    @property
    def nproc_per_node(self) -> int:
        """Processes on each host."""
        return int(self.variables["WORLD_SIZE"]) // self.nnodes

    @property
    def master_addr(self) -> str:
        """The coordinator's host."""
        return self.variables["MASTER_ADDR"]

    @property
    def master_port(self) -> int:
        """The coordinator's port."""
        return int(self.variables["MASTER_PORT"])


def _integer(value: str | int, what: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"{what} must be an integer, got {value!r}.") from None


def _agreed(flag: str | int | None, flag_name: str, var: str, environ: Mapping[str, str]) -> str | None:
    """The flag's value, else the variable's; both given and different is an error (nothing is overwritten)."""
    pinned = environ.get(var)
    if flag is not None and pinned is not None and str(flag) != pinned:
        raise LaunchError(
            f"{flag_name} {flag} disagrees with {var}={pinned} already set in the environment, which the "
            f"launcher never overwrites: drop {flag_name} or unset {var}."
        )
    return str(flag) if flag is not None else pinned


def worker_hosts(request: LaunchRequest, environ: Mapping[str, str]) -> tuple[str, ...]:
    """The job's hosts: ``--hosts``, else ``TPU_WORKER_HOSTNAMES`` (comma-separated)."""
    hosts = request.hosts
    if hosts is None:
        hosts = tuple(h.strip() for h in environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip())
    if not hosts:
        raise LaunchError(
            "No worker hosts: pass --hosts h0,h1,... (the same list, in the same order, on every host), "
            "or run on a TPU VM where TPU_WORKER_HOSTNAMES is set. On one machine: --hosts localhost."
        )
    expected = _agreed(request.nnodes, "--nnodes", "NNODES", environ)
    if expected is not None and _integer(expected, "--nnodes / NNODES") != len(hosts):
        raise LaunchError(
            f"--nnodes / NNODES says {expected} hosts but the worker list has {len(hosts)} "
            f"({','.join(hosts)}): pass every worker of the slice in --hosts, or fix --nnodes."
        )
    return tuple(hosts)


def node_rank(request: LaunchRequest, environ: Mapping[str, str], hosts: tuple[str, ...]) -> int:
    """This host's rank: ``--node-rank``, ``NODE_RANK``, ``TPU_WORKER_ID``, ``JOB_COMPLETION_INDEX``; 0 alone."""
    value = _agreed(request.node_rank, "--node-rank", "NODE_RANK", environ)
    for var in ("TPU_WORKER_ID", "JOB_COMPLETION_INDEX"):
        if value is None:
            value = environ.get(var)
    if value is None:
        if len(hosts) == 1:
            return 0
        raise LaunchError(
            f"Cannot tell which of the {len(hosts)} hosts this is: pass --node-rank N, or set NODE_RANK "
            "or TPU_WORKER_ID (a Cloud TPU VM's worker number)."
        )
    rank = _integer(value, "--node-rank / NODE_RANK / TPU_WORKER_ID")
    if not 0 <= rank < len(hosts):
        raise LaunchError(
            f"Node rank {rank} is out of range for {len(hosts)} hosts (0 .. {len(hosts) - 1}): "
            "check --node-rank / TPU_WORKER_ID against --hosts / TPU_WORKER_HOSTNAMES."
        )
    return rank


def processes_per_host(request: LaunchRequest, environ: Mapping[str, str]) -> int:
    """``--nproc-per-node``, else as the lane's ``HostLaunch`` says: its devices-per-host variable
    (``TORCH_TPU_DEVICES_PER_HOST``) or the slice type's devices per host (lane tpu), its fixed count (1 on cpu)."""
    launch = host_launch(request.lane)
    value: str | None = str(request.nproc_per_node) if request.nproc_per_node is not None else None
    if launch.devices_per_host_var is not None:
        value = _agreed(request.nproc_per_node, "--nproc-per-node", launch.devices_per_host_var, environ)
    if launch.devices_from_slice_type:
        slice_type = next((environ[var] for var in ACCELERATOR_TYPE_VARS if environ.get(var)), None)
        if value is None and slice_type is not None:
            try:
                chip = chip_by_name(slice_type)
            except KeyError as error:
                raise LaunchError(f"{error.args[0]} Pass --nproc-per-node, the TPU devices on each host.") from None
            if chip.chips_per_host is not None:
                value = str(chip.chips_per_host * chip.devices_per_chip)
        if value is None:
            variables = " or ".join(var for var in (launch.devices_per_host_var, ACCELERATOR_TYPE_VARS[0]) if var)
            raise LaunchError(
                "Cannot tell how many TPU devices each host has: pass --nproc-per-node (4 on v5p, v5e, "
                f"v6e hosts; 8 on v7), or set {variables}."
            )
    if value is None and launch.processes_per_host is not None:
        value = str(launch.processes_per_host)
    if value is None:
        raise LaunchError(f"Lane {request.lane}: pass --nproc-per-node, the number of devices on each host.")
    count = _integer(value, "--nproc-per-node")
    if count < 1:
        raise LaunchError(f"--nproc-per-node must be at least 1, got {count}.")
    return count


def coordinator(request: LaunchRequest, environ: Mapping[str, str], hosts: tuple[str, ...]) -> tuple[str, int]:
    """The process group's store: ``--coordinator host[:port]``, ``MASTER_ADDR``/``MASTER_PORT``, first host."""
    flag_addr, flag_port = None, None
    if request.coordinator is not None:
        flag_addr, colon, port = request.coordinator.rpartition(":")
        if not colon:
            flag_addr, port = request.coordinator, ""
        if not flag_addr:
            raise LaunchError(f"--coordinator must be host or host:port, got {request.coordinator!r}.")
        flag_port = _integer(port, "--coordinator's port") if port else None
    addr = _agreed(flag_addr, "--coordinator", "MASTER_ADDR", environ) or hosts[0]
    port = _agreed(flag_port, "--coordinator", "MASTER_PORT", environ) or str(DEFAULT_MASTER_PORT)
    return addr, _integer(port, "MASTER_PORT")


def slicebuilder_addresses(hosts: tuple[str, ...], devices_per_host: int, base_port: int) -> str:
    """torch_tpu's ``TORCH_TPU_SLICEBUILDER_ADDRESSES``: ``host:base+i`` for each device i of each host."""
    return ",".join(f"{host}:{base_port + i}" for host in hosts for i in range(devices_per_host))


def launch_environment(request: LaunchRequest, environ: Mapping[str, str]) -> LaunchEnvironment:
    """The launch variables of this host, given the launcher's flags and the environment it runs in."""
    launch = host_launch(request.lane)
    already_set = environ.get(LANE_ENV_VAR, "")
    if already_set not in {"", AUTO, request.lane}:
        raise LaunchError(
            f"--lane {request.lane} disagrees with {LANE_ENV_VAR}={already_set} already set in the environment, "
            f"which the launcher never overwrites: unset {LANE_ENV_VAR} or pass --lane {already_set}."
        )
    hosts = worker_hosts(request, environ)
    rank = node_rank(request, environ, hosts)
    nproc = processes_per_host(request, environ)
    addr, port = coordinator(request, environ, hosts)
    computed = {
        "NNODES": str(len(hosts)),
        "NODE_RANK": str(rank),
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(len(hosts) * nproc),
        LANE_ENV_VAR: request.lane,
    }
    if launch.slicebuilder_ports:
        base = _integer(_agreed(request.base_port, "--base-port", "TORCH_TPU_BASE_PORT", environ)
                        or DEFAULT_BASE_PORT, "TORCH_TPU_BASE_PORT")  # fmt: skip
        computed["TORCH_TPU_SLICEBUILDER_ADDRESSES"] = slicebuilder_addresses(hosts, nproc, base)
    pinned = frozenset(name for name in computed if name in environ)
    variables = {name: environ[name] if name in pinned else value for name, value in computed.items()}
    _check_pinned_sizes(variables, pinned, len(hosts) * nproc)
    return LaunchEnvironment(variables, pinned)


def _check_pinned_sizes(variables: dict[str, str], pinned: frozenset[str], world_size: int) -> None:
    """A pinned size that disagrees with this launch would hang the rendezvous: fail now instead."""
    if "WORLD_SIZE" in pinned and variables["WORLD_SIZE"] != str(world_size):
        raise LaunchError(
            f"WORLD_SIZE={variables['WORLD_SIZE']} is set in the environment but this launch runs "
            f"{world_size} processes (hosts x --nproc-per-node): unset WORLD_SIZE or fix --nproc-per-node."
        )
    addresses = variables.get("TORCH_TPU_SLICEBUILDER_ADDRESSES")
    if "TORCH_TPU_SLICEBUILDER_ADDRESSES" in pinned and addresses and len(addresses.split(",")) != world_size:
        raise LaunchError(
            f"TORCH_TPU_SLICEBUILDER_ADDRESSES is set in the environment with {len(addresses.split(','))} "
            f"addresses but this launch runs {world_size} processes: unset it or fix --nproc-per-node."
        )
