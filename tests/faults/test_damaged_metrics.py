"""A ``metrics.jsonl`` the run cannot take back as its own (invalid UTF-8, a symbolic link) is set aside whole,
with a line naming it and why, and never stops the resume of a good checkpoint; readers of a damaged file skip
its damaged lines. ``loss.png`` replaces a link found there rather than writing through it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.faults.sessions import open_session, session_recipe
from titanpod.graph.metrics_rows import read_rows, set_aside_rows_after
from titanpod.runs.loss_plot import draw_loss_plot, read_loss_history

DAMAGED = b'{"step": 1, "loss": 2.0}\n{"step": 2, "loss": \xff\xfe}\n{"step": 3, "loss": 1.0}\n'


def test_a_metrics_file_with_invalid_utf8_is_set_aside_and_the_good_checkpoint_resumed(tmp_path):
    run_dir = tmp_path / "runs" / "run"
    (run_dir / "checkpoints" / "step-000002").mkdir(parents=True)
    (run_dir / "checkpoints" / "step-000002" / "trainer.json").write_bytes(b"{}")
    (run_dir / "metrics.jsonl").write_bytes(DAMAGED)
    session, said = open_session(session_recipe(tmp_path / "runs"))
    with session:
        assert session.checkpointer.resume_folder() == run_dir / "checkpoints" / "step-000002"
        session.write_scalars(3, {"loss": 0.5})
    (aside,) = run_dir.glob("metrics-damaged-*.jsonl")
    assert aside.read_bytes() == DAMAGED  # kept whole, as it was
    text = " ".join(said.getvalue().split())
    assert (
        f"{run_dir / 'metrics.jsonl'} cannot be read back (it is not UTF-8 text (byte 0xff at offset 45)): moved to "
        f"{aside.name}, and this run starts a new metrics.jsonl" in text
    )
    assert [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [
        {"step": 3, "loss": 0.5}
    ]


def test_a_metrics_file_that_is_a_link_is_moved_aside_not_written_through(tmp_path):
    run_dir = tmp_path / "runs" / "run"
    run_dir.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_bytes(b"")
    (run_dir / "metrics.jsonl").symlink_to(elsewhere)
    session, said = open_session(session_recipe(tmp_path / "runs"))
    with session:
        session.write_scalars(1, {"loss": 0.5})
    assert elsewhere.read_bytes() == b""
    assert not (run_dir / "metrics.jsonl").is_symlink()
    assert "(it is a symbolic link): moved to metrics-damaged-" in said.getvalue()


def test_readers_skip_the_damaged_lines_of_a_metrics_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(DAMAGED)
    assert read_rows(path) == [{"step": 1, "loss": 2.0}, {"step": 3, "loss": 1.0}]
    aside = set_aside_rows_after(path, 1)
    assert aside is not None and path.read_bytes() == DAMAGED.split(b"\n")[0] + b"\n"


def test_the_loss_plot_replaces_a_link_rather_than_writing_through_it(tmp_path):
    rows = [{"step": 1, "loss": 2.0, "lr": 0.1}, {"step": 2, "loss": 1.0, "lr": 0.1}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    elsewhere = tmp_path / "elsewhere.png"
    elsewhere.write_bytes(b"keep")
    plot = tmp_path / "run" / "loss.png"
    plot.parent.mkdir()
    plot.symlink_to(elsewhere)
    draw_loss_plot(read_loss_history(tmp_path / "metrics.jsonl"), plot, "t")
    assert elsewhere.read_bytes() == b"keep"
    assert not plot.is_symlink() and Path(plot).read_bytes()[:4] == b"\x89PNG"
