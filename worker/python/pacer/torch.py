"""Train a PyTorch model with Pacer from your own training loop.

    import torch, pacer.torch as pt
    pt.init()                                   # PACER_MONITOR, or init("tcp://HOST:PORT")
    net = MyNet()
    model, opt = pt.distribute(net, torch.optim.AdamW(net.parameters(), lr=1e-3,
                                                      weight_decay=0.01))
    loader = pt.DataLoader(train_set)           # map-style Dataset
    while not loader.stopped:                   # until the job stops
        for x, y in loader:                     # one epoch of the job
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step(loss=loss)
            if pt.is_evaluator() and loader.step % 200 == 0:
                pt.report(accuracy=evaluate(model))
    pt.shutdown()

What Pacer does and what stays yours:

- The shards hold the parameters and run the optimizer: ``distribute``
  maps ``torch.optim.SGD``, ``Adam``, ``AdamW`` and ``Adagrad`` (with their
  param_groups) onto them; the job's kind is the monitor's ``--optimizer``
  and must be the same. Anything else raises ``TypeError``, as does an
  option the shards lack (``maximize=True``).
- The monitor sizes each worker's batch from its speed: ``DataLoader``
  yields batches of the size assigned at that moment, from the data the
  monitor hands this worker (chunks of the data stream, or with
  ``--data-partitions`` partitions) at their read positions. A position
  moves on only once the push that trained on it is acknowledged.
- Gradients must come from a MEAN-reduced loss over the batch: the shards
  weight each worker's gradient by its batch size.
- ``opt.step()`` pushes the gradient (with each group's current lr, so an
  ``lr_scheduler`` works unchanged) and waits for the acknowledgement; the
  next batch pulls the parameters into the model's tensors in place. A
  scheduler that changes anything else than lr raises.
- Module buffers (BatchNorm's running statistics) are not sent to the
  shards: each worker keeps its own, and ``distribute`` warns that they
  are local to the worker.
- ``loader.batch_size`` is the size the monitor gave this batch;
  ``rank()`` this worker's rank; ``is_evaluator()`` whether it evaluates.
- A model on a CUDA device trains from copies of the runtime's buffers,
  page-locked for it (Debian's torch is CPU-only: not run on a GPU here).
"""

import math
import os
import signal
import warnings

import numpy as np
import torch
import torch.utils.data

from . import _core

__all__ = ["init", "distribute", "DataLoader", "is_evaluator", "rank", "report", "shutdown",
           "DistributedOptimizer", "SUPPORTED_OPTIMIZERS"]

# torch.optim class -> (the shards' kind, the settings the shards take).
SUPPORTED_OPTIMIZERS = {
    torch.optim.SGD: ("sgd", ("lr", "momentum", "dampening", "weight_decay", "nesterov")),
    torch.optim.Adam: ("adam", ("lr", "betas", "eps", "weight_decay", "amsgrad")),
    torch.optim.AdamW: ("adamw", ("lr", "betas", "eps", "weight_decay", "amsgrad")),
    torch.optim.Adagrad: ("adagrad", ("lr", "lr_decay", "weight_decay",
                                      "initial_accumulator_value", "eps")),
}
# Options that choose how torch computes, not what: nothing to map.
_HOW_NOT_WHAT = ("foreach", "capturable", "fused", "differentiable")

_state = None


class _State:
    def __init__(self, monitor, options):
        self.monitor = monitor
        self.options = options   # for _core.Trainer
        self.trainer = None      # made when the DataLoader starts the run
        self.planned = False     # a batch was yielded and not pushed yet
        self.pending = None     # (names, sizes, init) until the DataLoader starts the run
        self.started = False
        self.optimizer = None   # the DistributedOptimizer
        self.views = []         # (param, host params view, host grads view), flat order
        self.pinned = []        # page-locked buffers' addresses (a CUDA model)
        self.devices = []       # the CUDA devices the model's parameters are on
        self.last_clock = None
        self.finished = None


def init(monitor=None, *, block_floats=32768, request_timeout=60.0, start_timeout=120.0,
         progress_interval=1.0, max_batch=0, sample_log="", ack_log="", step_log="",
         handle_sigterm=True):
    """Makes this process a worker of the job at ``monitor`` (tcp://HOST:PORT;
    default: the PACER_MONITOR variable). Registration happens when the
    DataLoader starts. The options are pacer-worker's of the same names:

    - ``block_floats``: floats per key block (the shards' unit of keys);
    - ``request_timeout``: seconds a request to a shard or the monitor may
      take before the worker gives up (``TimeoutError``);
    - ``start_timeout``: seconds to wait for the monitor to start the run;
    - ``progress_interval``: seconds between progress lines on stderr;
    - ``max_batch``: this worker's memory limit in samples (0: none);
    - ``sample_log``, ``ack_log``, ``step_log``: files for the samples each
      acknowledged push trained on, the acknowledgements, and per-step
      timings (empty: none);
    - ``handle_sigterm``: SIGTERM leaves the job cleanly (the loader ends
      after the current step)."""
    global _state
    monitor = monitor or os.environ.get("PACER_MONITOR", "")
    if not monitor:
        raise ValueError("pacer.torch.init: no monitor address: pass init('tcp://HOST:PORT') "
                         "or set PACER_MONITOR")
    if _state is not None and _state.finished is None:
        raise RuntimeError("pacer.torch.init: this process is a worker already; "
                           "call pacer.torch.shutdown() first")
    _state = _State(monitor, dict(block_floats=block_floats, request_timeout=request_timeout,
                                  start_timeout=start_timeout,
                                  progress_interval=progress_interval, max_batch=max_batch,
                                  sample_log=sample_log, ack_log=ack_log, step_log=step_log))
    if handle_sigterm:
        signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum, frame):
    if _state is not None and _state.trainer is not None:
        _state.trainer.cancel()


def _require():
    if _state is None:
        raise RuntimeError("pacer.torch: call pacer.torch.init() first")
    return _state


def _glob_escape(name):
    # fnmatch(3): a backslash makes the next character literal.
    return "".join("\\" + c if c in "*?[]\\" else c for c in name)


def _setting_text(key, value):
    if key == "betas":
        return "betas=%r:%r" % (float(value[0]), float(value[1]))
    if isinstance(value, bool):
        return "%s=%s" % (key, "true" if value else "false")
    if isinstance(value, torch.Tensor):
        value = value.item()
    return "%s=%r" % (key, float(value))


def _settings(kind, keys, group, what):
    """The settings of one torch param_group, checked against what the shards take."""
    for key, value in group.items():
        if key == "params" or key in keys:
            continue
        if key == "maximize" and value:
            raise TypeError("%s: maximize=True is not supported: the shards minimise "
                            "(negate the loss instead)" % what)
        if key in _HOW_NOT_WHAT or key == "maximize" or key == "initial_lr":
            continue
        raise TypeError("%s: option %r is not supported by the shards' %s (they take %s)"
                        % (what, key, kind, ", ".join(keys)))
    return {k: group[k] for k in keys if k in group}


def distribute(module, optimizer):
    """Hands ``module``'s parameters and ``optimizer``'s updates to the shards.
    Returns (module, a DistributedOptimizer to call step() and zero_grad() on).
    The module trains in place: its parameters become views of the runtime's
    buffers once the DataLoader starts the run."""
    state = _require()
    if state.pending is not None or state.started:
        raise RuntimeError("pacer.torch.distribute: one model per worker process")
    entry = SUPPORTED_OPTIMIZERS.get(type(optimizer))
    if entry is None:
        raise TypeError("pacer.torch.distribute: %s is not supported; the shards run %s"
                        % (type(optimizer).__name__,
                           ", ".join("torch.optim." + c.__name__ for c in SUPPORTED_OPTIMIZERS)))
    kind, keys = entry
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    if not named:
        raise ValueError("pacer.torch.distribute: the module has no trainable parameters")
    name_of = {id(p): n for n, p in named}
    groups, group_settings, seen = [], [], set()
    for i, g in enumerate(optimizer.param_groups):
        what = "torch.optim.%s param_groups[%d]" % (type(optimizer).__name__, i)
        settings = _settings(kind, keys, g, what)
        names = []
        for p in g["params"]:
            if id(p) not in name_of:
                raise ValueError("%s holds a tensor that is not a trainable parameter of the "
                                 "module" % what)
            if id(p) in seen:
                raise ValueError("%s: a parameter is in two groups" % what)
            seen.add(id(p))
            names.append(name_of[id(p)])
        if not names:
            continue
        spec = ",".join(_setting_text(k, v) for k, v in settings.items())
        groups.append("group%d:%s:%s" % (i, ",".join(_glob_escape(n) for n in names), spec))
        group_settings.append((len(groups), g, {k: v for k, v in settings.items() if k != "lr"}))
    missing = [n for n, p in named if id(p) not in seen]
    if missing:
        raise ValueError("pacer.torch.distribute: the optimizer does not train %s; give it every "
                         "trainable parameter (or set requires_grad=False)" % ", ".join(missing))
    for n, p in named:
        if p.dtype != torch.float32:
            raise TypeError("pacer.torch.distribute: %s is %s; the shards hold float32"
                            % (n, p.dtype))
    if any(True for _ in module.buffers()):
        warnings.warn("pacer.torch: the module's buffers (such as BatchNorm's running "
                      "statistics) are not shared: each worker keeps and updates its own",
                      stacklevel=2)
    init_values = np.concatenate(
        [p.detach().to("cpu").reshape(-1).numpy().astype(np.float32) for _, p in named])
    state.pending = ([n for n, _ in named], [p.numel() for _, p in named], init_values, named,
                     groups, kind)
    state.optimizer = DistributedOptimizer(optimizer, group_settings, kind)
    return module, state.optimizer


def _start(samples):
    state = _require()
    if state.started:
        return state
    if state.pending is None:
        raise RuntimeError("pacer.torch: call pacer.torch.distribute(model, optimizer) before "
                           "iterating a DataLoader")
    names, sizes, init_values, named, groups, kind = state.pending
    trainer = _core.Trainer(state.monitor, param_groups=groups, **state.options)
    state.trainer = trainer
    trainer.start(names, sizes, init_values, samples)
    if trainer.optimizer != kind:
        trainer.cancel()
        trainer.finish()
        raise TypeError("pacer.torch: this job's shards run %s (pacer-monitor --optimizer); the "
                        "optimizer given to distribute() is %s"
                        % (trainer.optimizer, kind))
    state.started = True
    if trainer.stopping:
        return state  # stopped (or SIGTERM) before the run began: no batches
    params = torch.from_numpy(trainer.params)
    grads = torch.from_numpy(trainer.grads)
    offset = 0
    state.views = []
    for (name, p), n in zip(named, sizes):
        host_p = params[offset:offset + n].view(p.shape)
        host_g = grads[offset:offset + n].view(p.shape)
        offset += n
        if p.device.type == "cpu":
            # The module trains on the runtime's memory: pulls write it in
            # place, backward accumulates into the pushed buffer.
            p.data = host_p
            p.grad = host_g
        state.views.append((p, host_p, host_g))
    _pin(state)
    return state


def _pin(state):
    """For a model with CUDA tensors: page-locks the runtime's buffers
    (cudaHostRegister), so that the copies to and from the device go by DMA
    without a staging copy and run asynchronously (the push, and the next
    pull, wait for them). Where that fails (no CUDA runtime), neither is
    page-locked and the copies stay synchronous."""
    state.devices = sorted({p.device for p, _, _ in state.views if p.device.type == "cuda"},
                           key=str)
    if not state.devices:
        return
    try:
        cudart = torch.cuda.cudart()
        for array in (state.trainer.params, state.trainer.grads):
            torch.cuda.check_error(cudart.cudaHostRegister(array.ctypes.data, array.nbytes, 0))
            state.pinned.append(array.ctypes.data)
    except (AttributeError, AssertionError, RuntimeError) as e:
        _unpin(state)
        warnings.warn("pacer.torch: the runtime's buffers could not be page-locked (%s); "
                      "copies to and from the device stay synchronous" % (e,))


def _wait_for_copies(state):
    """Waits for the asynchronous copies between the page-locked buffers
    and every device the model is on."""
    if state.pinned:
        for device in state.devices:
            torch.cuda.synchronize(device)


def _unpin(state):
    if state.pinned:
        cudart = torch.cuda.cudart()
        for ptr in state.pinned:
            cudart.cudaHostUnregister(ptr)
        state.pinned = []


class DistributedOptimizer(torch.optim.Optimizer):
    """The user's optimizer, stepped on the shards. ``param_groups`` are the
    user's own (an lr_scheduler changes their lr, which each push carries)."""

    def __init__(self, inner, group_settings, kind):
        # Not Optimizer.__init__: the groups and defaults are the inner one's.
        self.inner = inner
        self.defaults = inner.defaults
        self.param_groups = inner.param_groups
        self.state = {}
        self.kind = kind
        self._declared = group_settings  # (pacer group, torch group, settings but lr)
        self._hook_for_increment_step = None

    def __getstate__(self):
        return {"kind": self.kind}

    def __repr__(self):
        return "pacer.torch.DistributedOptimizer(%r on the shards)" % (self.inner,)

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradient buffer the push sends (never sets it to None:
        backward accumulates into that buffer)."""
        state = _require()
        if not state.started:
            self.inner.zero_grad()
            return
        for p, _, host_g in state.views:
            if p.grad is not None and p.grad.data_ptr() != host_g.data_ptr():
                p.grad.zero_()
        state.trainer.grads.fill(0.0)

    def step(self, closure=None, loss=None):
        """Pushes the gradient (with each group's lr) and waits for the
        shards' acknowledgement. ``loss`` (optional) shows in progress lines
        and pacer_training_loss."""
        if closure is not None:
            raise TypeError("pacer.torch: step(closure) is not supported: the shards step once "
                            "per push")
        state = _require()
        if not state.started:
            raise RuntimeError("pacer.torch: step() before the DataLoader's first batch")
        if not state.planned:
            raise RuntimeError("pacer.torch: step() once per batch the DataLoader yields")
        lrs = []
        for group_id, group, declared in self._declared:
            for key, value in declared.items():
                now = group.get(key)
                if (tuple(now) if key == "betas" else now) != (tuple(value) if key == "betas"
                                                               else value):
                    raise RuntimeError(
                        "pacer.torch: %s of a param_group changed from %r to %r while training "
                        "(a scheduler?); the shards fix everything but lr at the start"
                        % (key, value, now))
            lr = group["lr"]
            lrs.append((group_id, float(lr.item() if isinstance(lr, torch.Tensor) else lr)))
        state.trainer.set_learning_rates(lrs)
        for p, host_p, _ in state.views:
            if p.shape != host_p.shape:
                raise RuntimeError("pacer.torch: a parameter changed shape from %s to %s while "
                                   "training; the shards hold the shapes distribute() declared"
                                   % (tuple(host_p.shape), tuple(p.shape)))
        copied = False
        for p, _, host_g in state.views:
            # A gradient that is not the buffer (a device model, or grad
            # replaced): copy it in.
            if p.grad is None:
                host_g.zero_()
            elif p.grad.data_ptr() != host_g.data_ptr():
                host_g.copy_(p.grad.detach(), non_blocking=bool(state.pinned))
                copied = True
        if copied:
            _wait_for_copies(state)  # the gradients are in before the push
        if isinstance(loss, torch.Tensor):
            loss = loss.detach().item()
        state.planned = False
        state.trainer.push(float("nan") if loss is None else float(loss))
        return None


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
    the batches yielded; ``samples`` holds the dataset indices of the last
    one.

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
            for p, host_p, _ in state.views:
                if p.data.data_ptr() != host_p.data_ptr():
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
            state.planned = True
            self.step += 1
            yielded = True
            yield batch


def is_evaluator():
    """Whether the monitor names this worker to evaluate (the live worker with
    the lowest rank): it then reports with report()."""
    state = _require()
    return state.started and state.trainer.evaluator


def rank():
    """This worker's rank, once the DataLoader started the run: the lowest
    number no live worker holds when it registered (0, 1, 2, ... for the
    workers that start a job), kept until it leaves."""
    state = _require()
    if not state.started:
        raise RuntimeError("pacer.torch.rank: the run has not started")
    return state.trainer.rank


def report(accuracy, loss=0.0, samples=0):
    """Sends an evaluation to the monitor: logged, and the job stops at the
    monitor's --target-accuracy."""
    state = _require()
    if not state.started:
        raise RuntimeError("pacer.torch.report: the run has not started")
    if not (isinstance(accuracy, (int, float)) and math.isfinite(accuracy)):
        raise ValueError("pacer.torch.report: accuracy must be a finite number")
    state.trainer.report(float(accuracy), float(loss), int(samples))


def shutdown():
    """Leaves the job (the monitor stops waiting for this worker); returns the
    run's figures."""
    global _state
    state = _require()
    if state.finished is None:
        try:
            state.finished = state.trainer.finish() if state.trainer is not None else {}
        finally:
            _unpin(state)
    return state.finished
