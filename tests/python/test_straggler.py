"""A Python worker slowed by sleeping 3x its measured compute in its own
loop (the emulation bench/torch uses for DDP too) gets a batch below half
the others' within 5 s of training, under the default pacer policy."""

import bisect
import os

EXAMPLE = os.path.join("..", "..", "worker", "python", "examples", "train_fashion.py")


def steps(path):
    """[(seconds since training started, batch)] of a --step-log."""
    out = []
    for line in open(path):
        f = line.split()
        out.append((float(f[0]), int(f[2])))
    return out


def batch_at(log, t):
    i = bisect.bisect_right([s for s, _ in log], t) - 1
    return log[i][1] if i >= 0 else None


def test_a_slowed_worker_gets_under_half_the_batch_within_5_s(job):
    job.run(shards=2, monitor_args=["--min-workers", "3", "--time-cap", "12",
                                    "--global-batch", "192", "--target-accuracy", "0.99"])
    logs = [os.path.join(job.dir, "steps-%d.log" % n) for n in range(3)]
    workers = [job.worker("worker%d" % n, EXAMPLE, "--eval-every", 10 ** 9, "--step-log", logs[n],
                          *(["--slowdown", "4"] if n == 2 else [])) for n in range(3)]
    for n, w in enumerate(workers):
        assert w.wait(timeout=60) == 0, job.log("worker%d" % n)[-3000:]
    slow, fast = steps(logs[2]), [steps(logs[0]), steps(logs[1])]
    when = None
    for t, b in slow:
        others = [batch_at(f, t) for f in fast]
        if all(o is not None for o in others) and b < 0.5 * min(others):
            when = t
            break
    trail = "; ".join("%.1f s: %d" % (t, b) for t, b in slow[::max(1, len(slow) // 12)])
    assert when is not None, "the slowed worker's batch never fell below half the others': " + trail
    assert when <= 5.0, "the slowed worker's batch fell below half the others' at %.1f s: %s" % (
        when, trail)
