"""titanpod-launch: one launcher per worker host of a slice; the launch environment and torchrun."""

from titanpod.runs.pod_launch.environment import LaunchEnvironment, LaunchError, LaunchRequest, launch_environment

__all__ = ["LaunchEnvironment", "LaunchError", "LaunchRequest", "launch_environment"]
