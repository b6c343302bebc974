"""The metadata server's preemption notice stops a run as its SIGTERM would: a stand-in server on this machine
answers ``instance/preempted`` as Compute Engine's does (``wait_for_change`` held until the value changes)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.runs.test_signals import ENV, RUN
from titanpod.runs.preemption_watch import PREEMPTED_PATH, PreemptionWatch


@contextmanager
def metadata_server(preempted: Callable[[], bool]) -> Iterator[str]:
    """A metadata server whose ``instance/preempted`` is ``TRUE`` once ``preempted()`` is; yields its host."""
    done = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            assert self.path.startswith(PREEMPTED_PATH) and self.headers["Metadata-Flavor"] == "Google"
            if "wait_for_change=true" in self.path:
                while not preempted() and not done.wait(0.05):
                    pass
            body = b"TRUE" if preempted() else b"FALSE"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        done.set()
        server.shutdown()


def test_the_notice_calls_back_once_the_server_says_the_vm_is_preempted():
    notice, called = threading.Event(), threading.Event()
    with metadata_server(notice.is_set) as host:
        watch = PreemptionWatch(called.set, host=host).start()
        assert not called.wait(0.5)  # FALSE so far: the watch waits on the server
        notice.set()
        assert called.wait(30)
        watch.thread.join(30)
        assert not watch.thread.is_alive()


def test_a_stopped_watch_does_nothing_when_the_notice_comes_later():
    notice, called = threading.Event(), threading.Event()
    with metadata_server(notice.is_set) as host:
        watch = PreemptionWatch(called.set, host=host).start()
        watch.stop()
        notice.set()
        watch.thread.join(30)
        assert not called.is_set()


def test_without_a_metadata_server_the_watch_ends_at_once():
    called = threading.Event()
    watch = PreemptionWatch(called.set, host="127.0.0.1:9").start()  # nothing listens on the discard port
    watch.thread.join(30)
    assert not watch.thread.is_alive() and not called.is_set()


def test_a_run_told_it_is_preempted_stops_after_the_step_and_saves_its_checkpoint(tmp_path):
    metrics = tmp_path / "runs" / "spot" / "metrics.jsonl"
    reached_step_2 = lambda: metrics.is_file() and '"step": 2' in metrics.read_text()  # noqa: E731
    with metadata_server(reached_step_2) as host:
        command = [sys.executable, "-m", "titanpod.pretrain.cli", *RUN, "--train.steps", "1000",
                   "--checkpoint.every", "0", "--output.run-name", "spot"]  # fmt: skip
        env = {**ENV, "GCE_METADATA_HOST": host}
        result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 143, result.stdout[-3000:] + result.stderr[-3000:]
    assert "the metadata server says this VM is being preempted" in result.stdout
    saved = sorted(path.parent.name for path in (tmp_path / "runs" / "spot" / "checkpoints").glob("step-*/COMMITTED"))
    assert len(saved) == 1 and int(saved[0].split("-")[1]) >= 2
    assert f"stopped by SIGTERM after step {int(saved[0].split('-')[1])}" in result.stdout
