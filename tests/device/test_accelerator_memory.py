"""A JAX device's memory statistics in titanpod's shape: a TPU program's reserved temporaries count.

The dictionaries are what JAX 0.10.2 with libtpu 0.0.42.1 reported on a TPU v5e chip (2026-12-05): Qwen 3
0.6B training at 4 x 4,096 tokens, where the compiler ahead of time counts 12.91 GiB a device; and a probe
whose program has 3 GiB of temporaries beside a 1 GiB argument.
"""

from __future__ import annotations

import pytest

from titanpod.device.memory import accelerator_memory_stats

GIB = 1024**3

TRAINING = {"num_allocs": 46, "bytes_in_use": 7184804352, "peak_bytes_in_use": 9564298240,
            "bytes_limit": 16909336064, "bytes_reserved": 6678347776, "peak_bytes_reserved": 6678347776}  # fmt: skip
PROBE = {"bytes_in_use": 1075010048, "peak_bytes_in_use": 1075010560, "bytes_limit": 16909336064,
         "bytes_reserved": 3221241856, "peak_bytes_reserved": 3221241856}  # fmt: skip


def test_a_training_steps_peak_counts_the_programs_reserved_temporaries():
    stats = accelerator_memory_stats(TRAINING)
    assert stats.kind == "device" and stats.limit_bytes == 16909336064
    assert stats.peak_gib == pytest.approx(12.91, rel=0.01)  # the compiler's own figure for the program
    assert stats.current_bytes == TRAINING["bytes_in_use"] + TRAINING["bytes_reserved"]


def test_a_probes_temporaries_show_in_its_peak():
    assert accelerator_memory_stats(PROBE).peak_gib == pytest.approx(4.0, abs=0.01)


def test_the_allocators_own_peak_wins_where_it_is_higher_and_gpus_without_reservations_read_as_before():
    after_a_save = {**TRAINING, "peak_bytes_in_use": 14306873344, "bytes_reserved": 1381285888}
    assert accelerator_memory_stats(after_a_save).peak_bytes == 14306873344
    gpu = {"bytes_in_use": 5 * GIB, "peak_bytes_in_use": 7 * GIB, "bytes_limit": 80 * GIB}
    stats = accelerator_memory_stats(gpu)
    assert (stats.current_bytes, stats.peak_bytes) == (5 * GIB, 7 * GIB)
