"""Churn with Python workers: one is killed with SIGKILL mid-run and
another starts. By every worker's sample log (what each acknowledged push
trained on), every sample of every partition is trained in each epoch,
and the only samples trained twice are those of the killed worker's last
batch. And a worker that joins a running job starts its lr warm-up at
the job's step; a primary shard killed under replicas fails over with the
optimizer the script declared."""

import collections
import os
import re
import time

EXAMPLE = os.path.join("..", "..", "worker", "python", "examples", "train_fashion.py")
PARTITIONS, EPOCHS, TRAIN = 4, 10, 6000


def lines(path):
    return open(path).read().splitlines() if os.path.exists(path) else []


def test_a_killed_python_worker_skips_nothing_and_repeats_at_most_its_last_batch(job):
    job.run(shards=2, monitor_args=["--min-workers", "3", "--mode", "bsp", "--global-batch", "96",
                                    "--data-partitions", str(PARTITIONS), "--epochs", str(EPOCHS),
                                    "--lease", "1.5", "--time-cap", "120",
                                    "--eval-interval", "5"])
    log = lambda n: os.path.join(job.dir, "samples-%d.log" % n)  # noqa: E731
    args = lambda n: ["--train-limit", TRAIN, "--eval-every", 10 ** 9,  # noqa: E731
                      "--sample-log", log(n)]
    workers = [job.worker("worker%d" % n, EXAMPLE, *args(n)) for n in range(3)]
    deadline = time.time() + 60
    while len(lines(log(1))) < 15:
        assert time.time() < deadline, "worker1 trained nothing:\n" + job.log("worker1")[-2000:]
        assert workers[1].poll() is None, job.log("worker1")[-2000:]
        time.sleep(0.05)
    workers[1].kill()  # SIGKILL
    workers[1].wait()
    workers.append(job.worker("worker3", EXAMPLE, *args(3)))
    monitor = job.procs[0]
    monitor.wait(timeout=120)
    assert "stop reason: all workers finished" in open(os.path.join(job.dir, "monitor.out")).read(), \
        job.log("monitor")[-3000:]
    for n in (0, 2, 3):
        assert workers[n].wait(timeout=30) == 0, job.log("worker%d" % n)[-3000:]

    trained = collections.defaultdict(collections.Counter)  # (partition, epoch) -> sample counts
    killed_last = []
    for n in range(4):
        for line in lines(log(n)):
            fields = [int(v) for v in line.split()]
            partition, epoch, batch = fields[0], fields[1], fields[2:]
            assert 0 <= partition < PARTITIONS and 0 <= epoch < EPOCHS, line
            trained[(partition, epoch)].update(batch)
            if n == 1:
                killed_last = batch
    assert killed_last, "the killed worker trained nothing"
    assert lines(log(3)), "the worker that joined trained nothing"
    repeated = 0
    for p in range(PARTITIONS):
        begin, end = TRAIN * p // PARTITIONS, TRAIN * (p + 1) // PARTITIONS
        for e in range(EPOCHS):
            counts = trained[(p, e)]
            missing = [i for i in range(begin, end) if i not in counts]
            assert not missing, "partition %d epoch %d skipped %d samples" % (p, e, len(missing))
            for sample, count in counts.items():
                assert begin <= sample < end, "sample %d in partition %d" % (sample, p)
                if count > 1:
                    repeated += count - 1
                    assert count == 2 and sample in killed_last, (
                        "sample %d of partition %d epoch %d trained %d times, and not in the "
                        "killed worker's last batch" % (sample, p, e, count))
    assert repeated <= len(killed_last)


def test_a_joiners_warmup_starts_at_the_jobs_step(job):
    """A worker that joins a running job, its warm-up scheduler given to
    pt.follow_job_step, pushes its first gradient with the lr the first
    worker pushes at that step of the job (not the warm-up's first lr)."""
    job.run(shards=1, monitor_args=["--min-workers", "1", "--mode", "bsp", "--global-batch", "32",
                                    "--lease", "1.5", "--time-cap", "60"])
    logs = [os.path.join(job.dir, "lr-%s.log" % n) for n in "ab"]
    first = job.worker("worker-a", "schedule_worker.py", "--follow", "--out", logs[0])
    deadline = time.time() + 60
    while len(lines(logs[0])) < 30:
        assert time.time() < deadline, "worker-a trained nothing:\n" + job.log("worker-a")[-2000:]
        time.sleep(0.1)
    joiner = job.worker("worker-b", "schedule_worker.py", "--follow", "--out", logs[1])
    while len(lines(logs[1])) < 3:
        assert joiner.poll() is None, "worker-b exited:\n" + job.log("worker-b")[-2000:]
        assert time.time() < deadline, "worker-b trained nothing:\n" + job.log("worker-b")[-2000:]
        time.sleep(0.1)
    for w in (joiner, first):
        w.terminate()
        w.wait(timeout=30)
    pushed = lambda path: [(int(s), float(lr)) for s, lr in map(str.split, lines(path))]  # noqa: E731
    at = dict(pushed(logs[0]))
    step, lr = pushed(logs[1])[0]
    assert step >= 30, "worker-b joined at step %d, before worker-a's 30th" % step
    assert step in at, "worker-a pushed nothing at step %d" % step
    assert lr == at[step], ("worker-b's first push at step %d carried lr %g; worker-a's %g"
                            % (step, lr, at[step]))


def test_a_range_fails_over_with_the_declared_optimizer(job):
    """With replicas, the job's optimizer is the script's (AdamW; the
    monitor is on its default, sgd): a killed primary's backup serves its
    range with that optimizer's state, and training goes on."""
    job.run(shards=3, monitor_args=["--min-workers", "1", "--mode", "bsp", "--global-batch", "32",
                                    "--replicas", "1", "--shard-lease", "1", "--time-cap", "60"])
    log = os.path.join(job.dir, "lr-a.log")
    worker = job.worker("worker-a", "schedule_worker.py", "--optimizer", "adamw", "--out", log)
    deadline = time.time() + 60

    def replicated():
        # Every range's backup holds its replica (a primary killed before
        # that loses its range: that is replica-all-lost, not this test).
        text = "".join(job.log("shard%d" % i) for i in range(3))
        seeding = set(re.findall(r"shard (\d+): seeding backup", text))
        return seeding and seeding <= set(re.findall(r"holds a replica of shard (\d+)'s", text))

    while len(lines(log)) < 30 or not replicated():
        assert time.time() < deadline, "worker-a trained nothing, or no replica is held:\n" + \
            job.log("worker-a")[-2000:]
        time.sleep(0.1)
    # A primary of keys (it seeds a backup); procs[0] is the monitor.
    primary = next(i for i in range(3) if "seeding backup" in job.log("shard%d" % i))
    job.procs[1 + primary].kill()
    others = [i for i in range(3) if i != primary]
    trained = len(lines(log))
    deadline = time.time() + 30
    while len(lines(log)) < trained + 30:
        shards = "".join(job.log("shard%d" % i) for i in others)
        assert time.time() < deadline, "no training after the failover:\n" + shards[-3000:]
        time.sleep(0.1)
    worker.terminate()
    worker.wait(timeout=30)
    shards = "".join(job.log("shard%d" % i) for i in others)
    assert "promoted: serves" in shards and "cannot serve" not in shards, shards[-3000:]
