"""A Cloud TPU VM's worker list and worker number, from the VM's metadata server.

Used only when neither the command line nor the environment (``TPU_WORKER_HOSTNAMES``,
``TPU_WORKER_ID``) says them, on lane tpu.
"""

from __future__ import annotations

import urllib.request

METADATA_URL = "http://metadata.google.internal/computeMetadata/v1/instance/attributes/"
"""The VM's instance attributes; a TPU VM's include ``agent-worker-number`` and ``worker-network-endpoints``."""


def attribute(key: str, timeout_s: float = 2.0) -> str | None:
    """The instance attribute ``key``, or ``None`` off Cloud or when the server does not answer."""
    request = urllib.request.Request(METADATA_URL + key, headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.read().decode().strip() or None
    except (OSError, ValueError):
        return None


def hosts_from_endpoints(endpoints: str) -> tuple[str, ...] | None:
    """Worker addresses from ``worker-network-endpoints`` (``id:name:address`` per worker, comma-separated)."""
    fields = [entry.split(":") for entry in endpoints.split(",") if entry.strip()]
    if not fields or any(len(f) < 3 or not f[2] for f in fields):
        return None
    return tuple(f[2] for f in fields)


def tpu_worker_hosts() -> tuple[str, ...] | None:
    """The slice's worker addresses in worker order, or ``None`` where the metadata has none."""
    endpoints = attribute("worker-network-endpoints")
    return hosts_from_endpoints(endpoints) if endpoints else None


def tpu_worker_number() -> int | None:
    """This VM's worker number in the slice, or ``None`` where the metadata has none."""
    number = attribute("agent-worker-number")
    return int(number) if number is not None and number.isdigit() else None
