"""``DataLoader``: batches of a map-style Dataset at the size and read
positions the monitor gives this worker, one iteration per epoch of the
job, items read by loader processes while the pull is on its way."""

import numpy as np
import torch
import torch.utils.data

from ._runtime import _catch_up, _start, _wait_for_copies

_worker_dataset = None


def _set_worker_dataset(dataset):
    global _worker_dataset
    _worker_dataset = dataset


def _fetch(indices):
    # In a loader process: the dataset's items (the process never makes a
    # trainer, so no ZeroMQ socket crosses a process boundary).
    return [_worker_dataset[int(i)] for i in indices]


class DataLoader:
    """Batches of a map-style Dataset as the monitor assigns them: the size
    the policy gives this worker at that moment, the samples at the read
    positions of the data the monitor handed this worker. ``step`` counts
    the batches this loader yielded; ``job_step`` is the job's step the
    last one belongs to (its clock: the shards' step count in the
    synchronous modes, the same on every worker; a worker that joins a
    running job starts at the slowest live worker's); ``samples`` holds
    the dataset indices of the last one.

    One iteration is one epoch of the job over the whole data set (the
    monitor's data stream, its default): it ends when this worker's next
    batch belongs to the next epoch (the data stream's tail rule makes that
    the same moment, within a few batches, on every worker), so that the
    usual ``for epoch in range(E): for x, y in loader:`` loop lines up its
    per-epoch schedules, evaluation and checkpoints with the data.
    ``epoch`` is the job's epoch the current (or last) iteration belongs
    to. Iterating also ends when the job stops or the worker is told to
    leave (SIGTERM); ``stopped`` is then True and further iterations yield
    nothing, so ``while not loader.stopped: for x, y in loader:`` trains
    until the job stops. With per-worker partitions (``pacer-monitor
    --data-partitions N``) one iteration runs until the job stops or this
    worker's partitions ran their epochs.

    With ``num_workers`` > 0 the items of each batch are read by that many
    processes (started with ``multiprocessing_context``, "spawn" by default;
    the dataset must pickle), each reading its share while the pull is on
    its way; collate runs here. Fork is refused: it would copy this
    process's ZeroMQ sockets and threads."""

    def __init__(self, dataset, collate_fn=None, num_workers=0, multiprocessing_context="spawn"):
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TypeError("pacer.torch.DataLoader takes a map-style Dataset (__getitem__ and "
                            "__len__)")
        if num_workers < 0:
            raise ValueError("pacer.torch.DataLoader: num_workers must be >= 0")
        if num_workers and multiprocessing_context not in ("spawn", "forkserver"):
            raise ValueError("pacer.torch.DataLoader: multiprocessing_context must be 'spawn' or "
                             "'forkserver', not %r: a fork would copy this process's ZeroMQ "
                             "sockets" % (multiprocessing_context,))
        self.dataset = dataset
        self.collate_fn = collate_fn or torch.utils.data.default_collate
        self.num_workers = num_workers
        self.multiprocessing_context = multiprocessing_context
        self._pool = None
        self.step = 0
        self.job_step = None
        self.samples = None
        self.batch_size = None
        self.epoch = None
        # The data stream: the first batch of the next epoch, found when the
        # iteration before it ended: (plan, pulled).
        self._next = None
        self._stopped = False

    def _items(self, samples, pending=None):
        if pending is not None:
            return [item for part in pending for item in part.result()]
        return [self.dataset[int(i)] for i in samples]

    def _submit(self, samples):
        if not self.num_workers:
            return None
        if self._pool is None:
            import concurrent.futures
            import multiprocessing
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.num_workers,
                mp_context=multiprocessing.get_context(self.multiprocessing_context),
                initializer=_set_worker_dataset, initargs=(self.dataset,))
        shares = np.array_split(np.asarray(samples), min(self.num_workers, len(samples)))
        return [self._pool.submit(_fetch, share.tolist()) for share in shares]

    def close(self):
        """Stops the loader processes (also when the job stops, or an
        iteration is left early)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __len__(self):
        raise TypeError("pacer.torch.DataLoader has no length: the monitor sizes each batch")

    @property
    def stopped(self):
        """True once the job stopped (or this worker must leave): iterating
        yields nothing more."""
        return self._stopped

    def __iter__(self):
        epoch_ended = False
        try:
            yield from self._batches()
            # An epoch's end keeps the loader processes for the next one.
            epoch_ended = not self._stopped
        finally:
            if not epoch_ended:
                self.close()

    def _batches(self):
        state = _start(len(self.dataset))
        trainer = state.trainer
        if self._stopped:
            return
        stream = trainer.data_stream
        yielded = False
        while True:
            # A batch yielded and not pushed: nothing moved; it comes again.
            state.planned = False
            if self._next is not None:
                plan, pulled = self._next
                self._next = None
            else:
                # The pull writes `params`: the last copies out of it are done.
                _wait_for_copies(state)
                plan = trainer.next_batch() if self.num_workers else trainer.next_pulled()
                pulled = not self.num_workers
            if plan is None:
                self._stopped = True
                return
            if stream:
                epoch = int(plan[4])
                if self.epoch is None:
                    self.epoch = epoch
                if len(plan[1]) and epoch > self.epoch:
                    if yielded:
                        # The next epoch's first batch: this epoch ends here.
                        self._next = (plan, pulled)
                        return
                    self.epoch = epoch
            pending = None
            if not pulled:
                # The loader processes read while the pull is on its way.
                pending = self._submit(plan[1]) if len(plan[1]) else None
                if trainer.pull() is None:
                    self._stopped = True
                    return  # the job stopped while the pull waited
            clock, samples, assigned, _, _ = plan
            # In a round of local steps only its first batch brings the
            # shards' parameters; the others train on the device's own.
            fresh = not trainer.local_steps or trainer.round_began
            for p, host_p, _ in state.views:
                if fresh and p.data.data_ptr() != host_p.data_ptr():
                    # Page-locked: asynchronous, ordered before the forward
                    # on the same stream; the next pull waits for it.
                    with torch.no_grad():
                        p.data.copy_(host_p, non_blocking=bool(state.pinned))
            self.batch_size = int(assigned)
            if len(samples) == 0:
                # No partition to read (more workers than partitions): an
                # empty push keeps the barrier moving.
                trainer.grads.fill(0.0)
                trainer.push(float("nan"))
                continue
            self.samples = samples
            batch = self.collate_fn(self._items(samples, pending))
            self.job_step = int(clock)
            _catch_up(state, self.job_step)
            state.planned = True
            self.step += 1
            yielded = True
            yield batch
