"""A Python worker slowed by sleeping 3x its measured compute in its own
loop (the emulation bench/torch uses for DDP too) gets a batch below half
the others' within 5 s of training, under the default pacer policy. While
the batch sizes change, no sample is skipped and none trained twice: no
batch read at an old size is wasted or counted again."""

import bisect
import collections
import os

EXAMPLE = os.path.join("..", "..", "worker", "python", "examples", "train_fashion.py")
TRAIN, PARTITIONS = 6000, 3  # one partition per worker


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
                                    "--global-batch", "192", "--target-accuracy", "0.99",
                                    "--data-partitions", str(PARTITIONS)])
    logs = [os.path.join(job.dir, "steps-%d.log" % n) for n in range(3)]
    samples = [os.path.join(job.dir, "samples-%d.log" % n) for n in range(3)]
    workers = [job.worker("worker%d" % n, EXAMPLE, "--eval-every", 10 ** 9, "--step-log", logs[n],
                          "--sample-log", samples[n], "--train-limit", TRAIN,
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
    check_every_sample_once(samples, [steps(log) for log in logs])


def check_every_sample_once(samples, step_logs):
    """Each (partition, epoch) a worker finished holds every sample of the
    partition once; the epoch each partition was in when the job stopped
    holds none twice."""
    trained = collections.defaultdict(collections.Counter)
    last_epoch = {}
    for path in samples:
        for line in open(path):
            fields = [int(v) for v in line.split()]
            partition, epoch = fields[0], fields[1]
            trained[(partition, epoch)].update(fields[2:])
            last_epoch[partition] = max(last_epoch.get(partition, 0), epoch)
    sizes = sorted({b for log in step_logs for _, b in log})
    assert len(sizes) > 2, "the batch sizes never changed: %s" % sizes
    assert len(last_epoch) == PARTITIONS, "partitions trained: %s" % sorted(last_epoch)
    finished = 0
    for (partition, epoch), counts in sorted(trained.items()):
        begin, end = TRAIN * partition // PARTITIONS, TRAIN * (partition + 1) // PARTITIONS
        twice = sorted(i for i, c in counts.items() if c > 1)
        assert not twice, "partition %d epoch %d trained %d samples twice (%s ...)" % (
            partition, epoch, len(twice), twice[:5])
        outside = [i for i in counts if not begin <= i < end]
        assert not outside, "partition %d holds samples %s" % (partition, outside[:5])
        if epoch < last_epoch[partition]:
            missing = end - begin - len(counts)
            assert missing == 0, "partition %d epoch %d skipped %d samples" % (
                partition, epoch, missing)
            finished += 1
    assert finished > 0, "no partition finished an epoch: %s" % last_epoch
