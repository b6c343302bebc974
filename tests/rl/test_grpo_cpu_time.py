"""process_cpu_seconds counts this process's work and that of the children it waited for."""

import subprocess
import sys
import time

from titanpod.rl.grpo.cpu_time import process_cpu_seconds


def test_cpu_seconds_grow_with_work_in_this_process():
    start, deadline = process_cpu_seconds(), time.monotonic() + 60
    total = 0
    while process_cpu_seconds() - start < 0.05 and time.monotonic() < deadline:
        total += sum(i * i for i in range(10_000))
    assert process_cpu_seconds() - start >= 0.05


def test_cpu_seconds_count_a_waited_for_child():
    # The child burns 0.25 s for the 0.2 asked: os.times counts in clock ticks (10 ms), and the child's user and
    # system parts are each cut down to a tick (once seen: 0.19999 counted for 0.2 burned).
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.25: pass"
    start = process_cpu_seconds()
    subprocess.run([sys.executable, "-c", burn], check=True)
    assert process_cpu_seconds() - start >= 0.2
