"""Rehearsals: a pod recipe run on this machine with every setting it makes, at a small size, then checked."""

from titanpod.recipes.rehearsal.rehearse import LaneResult, RehearsalReport, rehearse
from titanpod.recipes.rehearsal.scaling import RehearsalError, Setting, rehearsal_lanes, scale_recipe

__all__ = ["LaneResult", "RehearsalError", "RehearsalReport", "Setting", "rehearsal_lanes", "rehearse", "scale_recipe"]
