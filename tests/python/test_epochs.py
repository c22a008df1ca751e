"""The epoch loop over a --data-stream job: `for epoch in range(E): for x,
y in loader:` runs one iteration per epoch of the job over the whole data
set, on every worker, and every sample is trained exactly once per epoch
(by the workers' own record of what each iteration trained)."""

import collections
import json
import os

EPOCHS, TRAIN = 3, 3000


def test_each_loader_iteration_is_one_epoch_of_the_job(job):
    job.run(shards=1, monitor_args=["--min-workers", "2", "--mode", "bsp", "--global-batch", "64",
                                    "--data-stream", "--chunk-samples", "200",
                                    "--epochs", str(EPOCHS), "--time-cap", "120",
                                    "--eval-interval", "5"])
    outs = [os.path.join(job.dir, "loops-%d.jsonl" % n) for n in range(2)]
    # Two loops more than the job has epochs: they yield nothing.
    workers = [job.worker("worker%d" % n, "epoch_worker.py", "--loops", EPOCHS + 2,
                          "--train-limit", TRAIN, "--out", outs[n]) for n in range(2)]
    for n, w in enumerate(workers):
        assert w.wait(timeout=120) == 0, job.log("worker%d" % n)[-3000:]
    job.procs[0].wait(timeout=30)
    assert ("stop reason: %d epoch(s) over the training set done" % EPOCHS
            in open(os.path.join(job.dir, "monitor.out")).read()), job.log("monitor")[-3000:]

    trained = collections.defaultdict(collections.Counter)  # epoch -> index counts
    for n, path in enumerate(outs):
        loops = [json.loads(line) for line in open(path)]
        assert [l["loop"] for l in loops] == list(range(EPOCHS + 2)), path
        for l in loops[:EPOCHS]:
            # Iteration i of the loop is epoch i of the job, on every worker.
            assert l["epoch"] == l["loop"], (n, l["loop"], l["epoch"])
            assert l["samples"], "worker%d trained nothing in epoch %d" % (n, l["loop"])
            trained[l["epoch"]].update(l["samples"])
        for l in loops[EPOCHS:]:
            assert not l["samples"], "worker%d trained after the job's epochs" % n
    for e in range(EPOCHS):
        counts = trained[e]
        missing = [i for i in range(TRAIN) if i not in counts]
        twice = [i for i, c in counts.items() if c > 1]
        assert not missing and not twice, (e, missing[:5], twice[:5])
