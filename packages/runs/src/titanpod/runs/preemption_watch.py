"""The cloud's own preemption notice: on a Compute Engine or Cloud TPU VM the metadata server says when the VM is
being preempted (``instance/preempted`` turns ``TRUE``), which a run takes as the SIGTERM that follows it.

A thread waits on the server (``wait_for_change``) and, once the VM is preempted, sends this process SIGTERM,
so the step in flight finishes and the checkpoint is saved as for the signal itself (a second SIGTERM arriving
within the duplicate window is the same request). Off a cloud VM the server's name does not resolve and the
thread ends at its first try; ``GCE_METADATA_HOST`` names another server, as Google's own libraries read it.
"""

from __future__ import annotations

import os
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Callable

DEFAULT_HOST = "metadata.google.internal"
HOST_ENV = "GCE_METADATA_HOST"
PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
WAIT_SECONDS = 60
"""How long one request waits for the value to change before the server answers with it unchanged."""
RETRIES = 5
"""Failed requests in a row, after the first answer, before the watch gives up."""


def send_sigterm() -> None:
    """What a preemption does to this process: SIGTERM, as the VM's shutdown would send it."""
    os.kill(os.getpid(), signal.SIGTERM)


class PreemptionWatch:
    """Waits in a daemon thread for the metadata server to say the VM is preempted, then calls ``on_preempted``
    once. ``stop()`` ends the watch (its request may still be waiting; the thread then exits without acting)."""

    def __init__(
        self,
        on_preempted: Callable[[], None] = send_sigterm,
        say: Callable[[str], None] = lambda message: None,
        host: str | None = None,
    ) -> None:
        self.url = f"http://{host or os.environ.get(HOST_ENV) or DEFAULT_HOST}{PREEMPTED_PATH}"
        self.on_preempted = on_preempted
        self.say = say
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="preemption watch", daemon=True)

    def start(self) -> PreemptionWatch:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()

    def _ask(self, wait: bool) -> str:
        query = f"?wait_for_change=true&timeout_sec={WAIT_SECONDS}" if wait else ""
        request = urllib.request.Request(self.url + query, headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(request, timeout=WAIT_SECONDS + 10 if wait else 2) as answer:
            return answer.read().decode().strip().upper()

    def _watch(self) -> None:
        try:
            value = self._ask(wait=False)
        except (OSError, urllib.error.URLError):
            return  # no metadata server: not a cloud VM
        failures = 0
        while not self.stopped.is_set():
            if value == "TRUE":
                self.say("[yellow]the metadata server says this VM is being preempted: stopping after this step[/]")
                self.on_preempted()
                return
            try:
                value, failures = self._ask(wait=True), 0
            except (OSError, urllib.error.URLError):
                failures += 1
                if failures >= RETRIES or self.stopped.wait(1.0):
                    return
