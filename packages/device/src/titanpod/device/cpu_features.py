"""The host CPU's feature flags, for keys of what is built for or checked on this CPU."""

from __future__ import annotations

import platform


def cpu_features() -> str:
    """The CPU's feature flags as ``/proc/cpuinfo`` lists them (``flags`` on x86, ``Features`` on Arm); where there
    is no such file, ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
