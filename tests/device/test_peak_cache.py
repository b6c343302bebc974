"""The CPU peak is measured once per machine and kept: the second call reads it, a damaged file is measured
again, and the spec names how the figure was found."""

from __future__ import annotations

import json

import pytest

from titanpod.device import ChipSpec, cached_cpu_peak
from titanpod.device.peak_cache import machine_key


class CountingMeasure:
    """A stand-in for the matmul probe that counts its calls and returns ``peaks`` in turn."""

    def __init__(self, *peaks: float) -> None:
        self.peaks = list(peaks)
        self.calls = 0

    def __call__(self) -> ChipSpec:
        self.calls += 1
        return ChipSpec("cpu", self.peaks.pop(0), 1 << 30, measured=True)


def test_the_second_call_reads_the_kept_figure_without_measuring(tmp_path):
    path = tmp_path / "cache" / "cpu-peak.json"
    measure = CountingMeasure(2.5e11, 9.9e11)
    first = cached_cpu_peak(measure, path, key="machine A")
    second = cached_cpu_peak(measure, path, key="machine A")
    assert measure.calls == 1
    assert first.peak_flops == second.peak_flops == 2.5e11
    assert second.measured and second.name == "cpu"
    assert "fp32 matmul measured on this machine" in second.peak_method
    assert str(path) in second.peak_method  # where to delete it to measure again
    assert json.loads(path.read_text())["machines"]["machine A"]["peak_flops"] == 2.5e11


def test_another_machine_key_is_measured_and_kept_beside_the_first(tmp_path):
    path = tmp_path / "cpu-peak.json"
    measure = CountingMeasure(1e11, 3e11)
    cached_cpu_peak(measure, path, key="machine A")
    other = cached_cpu_peak(measure, path, key="machine B")
    assert measure.calls == 2 and other.peak_flops == 3e11
    assert set(json.loads(path.read_text())["machines"]) == {"machine A", "machine B"}


def test_a_damaged_file_is_measured_again_and_replaced(tmp_path):
    path = tmp_path / "cpu-peak.json"
    for damaged in ("{not json", '["a list"]', '{"machines": {"m": {"peak_flops": "fast"}}}', "\x00\xff"):
        path.write_text(damaged, encoding="latin-1")
        measure = CountingMeasure(4e11)
        spec = cached_cpu_peak(measure, path, key="m")
        assert measure.calls == 1 and spec.peak_flops == 4e11
        assert json.loads(path.read_text())["machines"]["m"]["peak_flops"] == 4e11


def test_an_unwritable_cache_costs_only_the_cache(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    measure = CountingMeasure(5e11, 6e11)
    spec = cached_cpu_peak(measure, blocker / "cpu-peak.json", key="m")  # its folder cannot be made
    assert spec.peak_flops == 5e11 and "not kept" in spec.peak_method
    assert cached_cpu_peak(measure, blocker / "cpu-peak.json", key="m").peak_flops == 6e11
    assert not list(tmp_path.glob(".cpu-peak.json.*"))


def test_the_default_file_is_under_the_user_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    measure = CountingMeasure(7e11)
    cached_cpu_peak(measure)
    assert (tmp_path / "titanpod" / "cpu-peak.json").is_file()
    assert machine_key() in json.loads((tmp_path / "titanpod" / "cpu-peak.json").read_text())["machines"]


def test_the_cpu_time_rate_counts_the_seconds_the_process_ran_times_its_threads(monkeypatch):
    import itertools

    from titanpod.device import chips

    # Each matmul is given 0.01 s of CPU time by the clock below, however long it took on the wall.
    ticks = itertools.count()
    monkeypatch.setattr(chips.time, "process_time", lambda: next(ticks) * 0.01)
    rate = chips.cpu_time_matmul_flops(size=64, seconds=0.0, threads=2)
    assert rate == pytest.approx(2 * 64**3 / 0.01 * 2)


def test_a_figure_measured_another_way_is_not_read(tmp_path):
    from titanpod.device.peak_cache import PEAK_MEASURE_VERSION, machine_key

    assert machine_key().endswith(PEAK_MEASURE_VERSION)


def test_a_peak_measured_on_a_busy_machine_is_measured_again_when_it_is_quiet_and_the_higher_kept(tmp_path):
    path = tmp_path / "cpu-peak.json"
    measure = CountingMeasure(1.3e11, 1.9e11, 1.5e11)
    busy = cached_cpu_peak(measure, path, key="m", load=lambda: 1.0)  # measured beside other work
    assert busy.peak_flops == 1.3e11 and measure.calls == 1
    assert cached_cpu_peak(measure, path, key="m", load=lambda: 0.6).peak_flops == 1.3e11  # not quiet enough
    assert measure.calls == 1
    quiet = cached_cpu_peak(measure, path, key="m", load=lambda: 0.1)
    assert quiet.peak_flops == 1.9e11 and measure.calls == 2
    assert json.loads(path.read_text())["machines"]["m"]["load_per_core"] == 0.1
    assert cached_cpu_peak(measure, path, key="m", load=lambda: 0.0).peak_flops == 1.9e11  # measured quiet: kept
    assert measure.calls == 2


def test_a_lower_figure_measured_again_does_not_replace_the_kept_one(tmp_path):
    path = tmp_path / "cpu-peak.json"
    measure = CountingMeasure(2.0e11, 1.5e11)
    cached_cpu_peak(measure, path, key="m", load=lambda: 0.9)
    again = cached_cpu_peak(measure, path, key="m", load=lambda: 0.2)
    assert measure.calls == 2 and again.peak_flops == 2.0e11
    entry = json.loads(path.read_text())["machines"]["m"]
    assert entry["peak_flops"] == 2.0e11 and entry["load_per_core"] == 0.2  # not measured a third time
    cached_cpu_peak(measure, path, key="m", load=lambda: 0.0)
    assert measure.calls == 2


def test_a_figure_kept_without_its_load_or_where_the_load_is_unknown_is_read_as_it_is(tmp_path):
    path = tmp_path / "cpu-peak.json"
    path.write_text(json.dumps({"machines": {"m": {"peak_flops": 1.0e11, "measured_on": "2026-12-01"}}}))
    measure = CountingMeasure(3.0e11)
    assert cached_cpu_peak(measure, path, key="m", load=lambda: 0.0).peak_flops == 1.0e11
    cached_cpu_peak(measure, path, key="other", load=lambda: None)
    assert cached_cpu_peak(measure, path, key="other", load=lambda: None).peak_flops == 3.0e11
    assert measure.calls == 1
