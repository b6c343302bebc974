"""Rehearsals: a pod recipe run on this machine with every setting it makes, at a small size, then checked."""

from titanpod.runs.rehearsal.rehearse import LaneResult, RehearsalReport, rehearse

__all__ = ["LaneResult", "RehearsalReport", "rehearse"]
