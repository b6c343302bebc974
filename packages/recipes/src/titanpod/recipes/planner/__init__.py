"""The dry-run planner: parameters, FLOPs, memory per device and step time of a recipe on a slice."""

from titanpod.recipes.planner.plan import FIT_FRACTION, MemoryPlan, RunPlan, plan_run

__all__ = ["FIT_FRACTION", "MemoryPlan", "RunPlan", "plan_run"]
