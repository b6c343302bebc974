"""How much of a device's or a host's memory a plan may use."""

FIT_FRACTION = 0.9
"""Share of a device's (or worker VM's) memory a plan may use; the rest is left to the runtime,
compiler scratch space, the operating system and fragmentation."""
