"""The host CPU as ``/proc/cpuinfo`` describes it, for keys of what is built for, checked or measured on this
CPU."""

from __future__ import annotations

import platform


def _cpuinfo_field(names: tuple[str, ...]) -> str | None:
    """The value of the first ``/proc/cpuinfo`` line starting with one of ``names``; ``None`` without one."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(names):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_features() -> str:
    """The CPU's feature flags as ``/proc/cpuinfo`` lists them (``flags`` on x86, ``Features`` on Arm); where there
    is no such file, ``platform.processor()``."""
    found = _cpuinfo_field(("flags", "Features"))
    return found if found is not None else platform.processor()


def cpu_model() -> str:
    """The CPU's model name as ``/proc/cpuinfo`` gives it (``model name``, or ``Model`` on some Arm boards);
    elsewhere ``platform.processor()``, else the machine type."""
    return _cpuinfo_field(("model name", "Model")) or platform.processor() or platform.machine()
