"""Llama 3.1's rope frequency scaling as the shape of a model states it: plain data, read without torch (a
recipe's flavors hold it); ``titanpod.models.common.rope`` applies it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1's frequency scaling ("llama3" rope type) for long context."""

    factor: float = 8.0
    """How much the context is stretched for the low frequencies."""
    low_freq_factor: float = 1.0
    """Wavelengths above ``original_max_position_embeddings / low_freq_factor`` are scaled fully."""
    high_freq_factor: float = 4.0
    """Wavelengths below ``original_max_position_embeddings / high_freq_factor`` are kept."""
    original_max_position_embeddings: int = 8192
    """Context length of the model before scaling."""
