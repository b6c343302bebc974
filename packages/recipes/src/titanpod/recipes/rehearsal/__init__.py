"""Rehearsal scaling: a pod recipe made small with every setting it makes kept (run by ``titanpod.runs.rehearsal``)."""

from titanpod.recipes.rehearsal.scaling import RehearsalError, Setting, rehearsal_lanes, scale_recipe

__all__ = ["RehearsalError", "Setting", "rehearsal_lanes", "scale_recipe"]
