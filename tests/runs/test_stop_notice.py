"""After a stop signal the trainer state is saved first, and the final weights only while the signal's notice
(``checkpoint.notice_seconds``) still covers them; else the resumed run that finishes writes them."""

from __future__ import annotations

from pathlib import Path

from tests.runs.test_signals import pretrain
from titanpod.graph import TrainSummary
from titanpod.runs.stop_notice import weights_left_out


def summary(interrupted: bool = True, received_at: float | None = 100.0) -> TrainSummary:
    return TrainSummary(steps_done=3, losses=[1.0] * 3, tokens_per_second=1.0, mfu=0.0, peak_memory_gib=None,
                        wall_seconds=1.0, interrupted=interrupted, stop_received_at=received_at)  # fmt: skip


def one_process(value: int) -> int:
    return value


def test_the_weights_are_written_while_the_time_left_covers_a_save_as_long_as_the_checkpoints():
    now = lambda: 112.0  # noqa: E731  (12 s after the signal: 18 s of a 30 s notice left)
    assert weights_left_out(summary(), 30.0, 18.0, one_process, now) is None
    left_out = weights_left_out(summary(), 30.0, 18.5, one_process, now)
    assert left_out is not None and "18.0 s of the signal's 30 s notice were left" in left_out
    assert "the checkpoint took 18.5 s" in left_out and "--checkpoint.notice-seconds" in left_out


def test_without_a_notice_or_a_signal_the_weights_are_always_written():
    late = lambda: 1e6  # noqa: E731
    assert weights_left_out(summary(), 0.0, 50.0, one_process, late) is None
    assert weights_left_out(summary(interrupted=False, received_at=None), 30.0, 50.0, one_process, late) is None


def test_one_process_short_of_time_leaves_them_out_on_every_process():
    agreed = lambda value: 1  # noqa: E731  (another process found too little time)
    assert weights_left_out(summary(), 30.0, 1.0, agreed, lambda: 101.0) is not None


def test_a_run_stopped_with_too_little_notice_saves_its_checkpoint_and_the_finishing_run_its_weights(tmp_path):
    stopped = pretrain(tmp_path, "--output.run-name", "notice", "--checkpoint.notice-seconds", "0.001",
                       signal_at=(3, "SIGTERM"))  # fmt: skip
    assert stopped.returncode == 143, stopped.stdout[-3000:] + stopped.stderr[-3000:]
    run_dir = tmp_path / "runs" / "notice"
    saved = Path("runs", "notice", "checkpoints", "step-000003")
    assert f"stopped by SIGTERM after step 3: saved checkpoint {saved}" in stopped.stdout
    assert "the final weights were left to the run that finishes it" in stopped.stdout
    assert not (run_dir / "model").exists()

    finished = pretrain(tmp_path, "--output.run-name", "notice", "--checkpoint.notice-seconds", "0.001")
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    assert (run_dir / "model" / "model.safetensors").is_file()
