"""Which steps ``profile.steps`` names, the errors for ranges that cannot be traced, and the xla lane's trace."""

from __future__ import annotations

import dataclasses
import gzip
import json

import pytest

from titanpod.graph import ProfileConfig, StepProfiler, TrainConfig
from titanpod.recipes import Recipe


@pytest.mark.parametrize(("steps", "expected"), [(None, None), ("5-7", (5, 7)), (" 3 - 3 ", (3, 3)), ("4", (4, 4))])
def test_step_ranges(steps, expected):
    assert ProfileConfig(steps).step_range() == expected


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ("7-5", "not after the last, e.g. --profile.steps 5-7"),
        ("0-2", "must be 1 or more .* 1-2"),
        ("5:7", "FIRST-LAST"),
        ("", "FIRST-LAST"),
    ],
)
def test_a_malformed_range_fails_when_the_recipe_is_made(steps, message):
    with pytest.raises(ValueError, match=message):
        ProfileConfig(steps)


def test_a_range_past_the_last_step_fails_when_the_recipe_is_made():
    recipe = Recipe(train=TrainConfig(steps=6), profile=ProfileConfig("5-6"))
    with pytest.raises(ValueError, match=r"ends after the run's last step \(train.steps=4\)"):
        dataclasses.replace(recipe, train=TrainConfig(steps=4))


def test_the_xla_lane_writes_a_jax_trace_with_the_traced_steps(tmp_path):
    import jax.numpy as jnp

    said = []
    profiler = StepProfiler(ProfileConfig("2-3"), tmp_path / "profile", "xla", say=said.append)
    for step_number in range(1, 5):
        profiler.before_step(step_number)
        assert profiler.active == (step_number in (2, 3))
        (jnp.ones((32, 32)) @ jnp.ones((32, 32))).block_until_ready()
        profiler.after_step(step_number)
    profiler.close()  # nothing left to write: the trace ended after step 3
    [perfetto] = list((tmp_path / "profile" / "plugins" / "profile").glob("*/perfetto_trace.json.gz"))
    assert list(perfetto.parent.glob("*.xplane.pb"))  # what TensorBoard's profile tab reads
    trace = json.loads(gzip.decompress(perfetto.read_bytes()))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    marked = sorted(int(event["args"]["step_num"]) for event in events if event.get("name") == "train")
    assert marked == [2, 3]
    assert len(said) == 1 and "step 2-3 (xla lane)" in said[0]


def test_the_xla_lanes_trace_stops_only_once_the_device_has_run_the_traced_steps(tmp_path, monkeypatch):
    import jax
    import jax.numpy as jnp

    @jax.jit
    def slow(x):  # a step's worth of device work, dispatched and not waited for, as the training loop does
        return jax.lax.fori_loop(0, 200, lambda _, y: jnp.tanh(y @ y), x)

    ready_at_stop = []
    stop_trace = jax.profiler.stop_trace

    def stop_and_look() -> None:
        ready_at_stop.append(result.is_ready())
        stop_trace()

    monkeypatch.setattr(jax.profiler, "stop_trace", stop_and_look)
    slow(jnp.ones((256, 256))).block_until_ready()  # compiled before the trace
    profiler = StepProfiler(ProfileConfig("1"), tmp_path / "profile", "xla")
    profiler.before_step(1)
    result = slow(jnp.ones((256, 256)))
    profiler.after_step(1)
    assert ready_at_stop == [True]
