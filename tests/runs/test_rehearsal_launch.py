"""A rehearsal on the xla lane drives 8 JAX devices on the host's CPU, and those devices share its few cores: XLA's
CPU collectives must wait for the slowest device's thread rather than abort the run after their default 40 s
(what a qwen3_06b rehearsal did on a loaded 2-core machine, a device still in its interpreted Pallas kernels)."""

from __future__ import annotations

from titanpod.runs.rehearsal.launch import HOST_COLLECTIVE_WAIT_SECONDS, TIMEOUT_SECONDS, launch_environment


def test_the_xla_rehearsal_waits_for_every_host_device_and_keeps_the_users_flags(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/dump")
    flags = launch_environment("xla")["XLA_FLAGS"].split()
    assert flags[0] == "--xla_dump_to=/tmp/dump"
    assert "--xla_force_host_platform_device_count=8" in flags
    assert f"--xla_cpu_collective_call_terminate_timeout_seconds={HOST_COLLECTIVE_WAIT_SECONDS}" in flags
    assert 40 < HOST_COLLECTIVE_WAIT_SECONDS < TIMEOUT_SECONDS  # a run that truly hangs is still stopped


def test_the_cpu_lanes_ranks_get_no_xla_flags(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert "XLA_FLAGS" not in launch_environment("cpu")
