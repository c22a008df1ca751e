"""pacer.torch.DataLoader with loader processes (num_workers=2, spawn):
one epoch of a one-worker job, every batch exactly the dataset's items at
the monitor's indices, every sample once; fork is refused."""

import os
import re

import pytest
import torch

import pacer.torch as pt


def test_spawned_loader_processes_read_the_monitors_batches(job):
    # The epoch as one chunk: whole batches but the last.
    job.run(shards=1, monitor_args=["--min-workers", "1", "--mode", "bsp", "--global-batch", "64",
                                    "--epochs", "1", "--time-cap", "60", "--chunk-samples", "2000"])
    w = job.worker("worker0", "loader_worker.py", "--num-workers", "2", "--train-limit", "2000")
    assert w.wait(timeout=120) == 0, job.log("worker0")[-3000:]
    out = open(os.path.join(job.dir, "worker0.out")).read()
    m = re.search(r"batches (\d+) samples (\d+)", out)
    assert m, out
    assert int(m.group(2)) == 2000, out  # one epoch: every sample once
    assert int(m.group(1)) == 32, out    # 31 batches of 64 and the tail of 16


def test_fork_is_refused():
    with pytest.raises(ValueError, match="fork would copy"):
        pt.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 1)), num_workers=2,
                      multiprocessing_context="fork")
