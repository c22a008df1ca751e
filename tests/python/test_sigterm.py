"""SIGTERM leaves cleanly, at once, even while the worker is blocked in a
pull: here on the BSP barrier, waiting for a second worker that is
frozen (SIGSTOP). The blocking calls wait without the GIL and check
Python's signals as they wait."""

import os
import re
import signal
import time


def test_sigterm_while_blocked_on_the_barrier_leaves_within_a_second(job):
    job.run(shards=1, monitor_args=["--min-workers", "2", "--mode", "bsp", "--global-batch", "64",
                                    "--lease", "30", "--time-cap", "60"])
    a = job.worker("a", "sigterm_worker.py")
    b = job.worker("b", "sigterm_worker.py")
    deadline = time.time() + 30
    # Training for real: a progress line ("epoch E clock C loss ...").
    while not re.search(r"epoch [0-9.]+ clock [1-9]", open(os.path.join(job.dir, "a.log")).read()):
        assert time.time() < deadline, job.log("a")[-2000:]
        time.sleep(0.1)
    b.send_signal(signal.SIGSTOP)  # a now waits on the barrier (the lease is 30 s)
    time.sleep(1.0)
    sent = time.time()
    a.send_signal(signal.SIGTERM)
    rc = a.wait(timeout=20)
    took = time.time() - sent
    b.send_signal(signal.SIGCONT)
    assert rc == 0, job.log("a")[-2000:]
    assert "left after" in open(os.path.join(job.dir, "a.out")).read()
    assert took < 1.5, "the worker took %.1f s to leave" % took
