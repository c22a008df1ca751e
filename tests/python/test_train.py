"""A 2-shard, 3-worker job of Python workers (pacer.torch, the example
worker/python/examples/train_fashion.py) trains a torch MLP on
Fashion-MNIST to 0.84 test accuracy under the default pacer policy, within
the monitor's 60 s time cap. The example evaluates on a side thread
(distribute(..., evaluate=...)): the loop holds no evaluation."""

import os
import re

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "worker",
                       "python", "examples", "train_fashion.py")


def test_three_python_workers_reach_0_84(job):
    job.run(shards=2, monitor_args=["--min-workers", "3", "--target-accuracy", "0.84",
                                    "--time-cap", "60", "--global-batch", "192"])
    workers = [job.worker("worker%d" % i, os.path.relpath(EXAMPLE, os.path.dirname(__file__)),
                          "--model", "mlp") for i in range(3)]
    for i, w in enumerate(workers):
        rc = w.wait(timeout=120)
        assert rc == 0, "worker%d exited %d:\n%s" % (i, rc, job.log("worker%d" % i)[-3000:])
    monitor = job.log("monitor")
    assert re.search(r"target accuracy 0\.84 reached", monitor), monitor[-3000:]
    ranks = set()
    for i in range(3):
        out = open(os.path.join(job.dir, "worker%d.out" % i)).read()
        assert "stop=target accuracy 0.84 reached" in out, out
        ranks.add(int(re.search(r"rank=(\d+)", out).group(1)))
    assert ranks == {0, 1, 2}, "pacer.torch.rank() of the three workers: %s" % sorted(ranks)
