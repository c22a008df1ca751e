"""This process as a worker of a job: its state (``init`` makes it,
``shutdown`` ends it), the run's start (the runtime's buffers become the
module's parameters), the page-locked copies for a model on CUDA, and the
calls that read the run (``is_evaluator``, ``rank``, ``report``)."""

import math
import os
import signal
import sys
import warnings

import torch

from .. import _core

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
        self.evaluate = None    # distribute(evaluate=...), as the runtime calls it
        self.schedulers = []    # follow_job_step's


def init(monitor=None, *, block_floats=32768, request_timeout=60.0, start_timeout=120.0,
         progress_interval=1.0, max_batch=0, sample_log="", ack_log="", step_log="",
         rank=None, handle_sigterm=True):
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
    - ``rank``: the rank to ask the monitor for, given when it is below the
      monitor's --min-workers and no live worker holds it, else the lowest
      free one (default: the PACER_RANK variable,
      which pacer-run sets to each worker's launch index; None: any);
    - ``handle_sigterm``: SIGTERM leaves the job cleanly (the loader ends
      after the current step)."""
    global _state
    source = "init(monitor)" if monitor else "PACER_MONITOR"
    monitor = monitor or os.environ.get("PACER_MONITOR", "")
    if not monitor:
        raise ValueError("pacer.torch.init: no monitor address: pass init('tcp://HOST:PORT') "
                         "or set PACER_MONITOR")
    if rank is None and os.environ.get("PACER_RANK", "") != "":
        try:
            rank = int(os.environ["PACER_RANK"])
        except ValueError:
            raise ValueError("pacer.torch.init: PACER_RANK=%r is not a whole number"
                             % os.environ["PACER_RANK"]) from None
    if rank is not None and not (isinstance(rank, int) and rank >= 0):
        raise ValueError("pacer.torch.init: rank must be a whole number >= 0, not %r" % (rank,))
    error = _core.address_error(monitor)
    if error:
        raise ValueError("pacer.torch.init: the monitor's address (%s): %s" % (source, error))
    if _state is not None and _state.finished is None:
        raise RuntimeError("pacer.torch.init: this process is a worker already; "
                           "call pacer.torch.shutdown() first")
    _state = _State(monitor, dict(block_floats=block_floats, request_timeout=request_timeout,
                                  start_timeout=start_timeout,
                                  progress_interval=progress_interval, max_batch=max_batch,
                                  sample_log=sample_log, ack_log=ack_log, step_log=step_log,
                                  rank_hint=-1 if rank is None else rank))
    if handle_sigterm:
        signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum, frame):
    if _state is not None and _state.trainer is not None:
        _state.trainer.cancel()


def _require():
    if _state is None:
        raise RuntimeError("pacer.torch: call pacer.torch.init() first")
    return _state


def _start(samples):
    state = _require()
    if state.started:
        return state
    if state.pending is None:
        raise RuntimeError("pacer.torch: call pacer.torch.distribute(model, optimizer) before "
                           "iterating a DataLoader")
    names, sizes, init_values, named, groups, kind, default_spec, local = state.pending
    outer = dict(outer=local[0], outer_settings=local[3], outer_groups=local[1]) if local else {}
    trainer = _core.Trainer(state.monitor, param_groups=groups, optimizer=kind,
                            optimizer_settings=default_spec, evaluate=state.evaluate,
                            **outer, **state.options)
    state.trainer = trainer
    trainer.start(names, sizes, init_values, samples)
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


def follow_job_step(*schedulers):
    """Starts these learning-rate schedulers at the job's step: before each
    batch the DataLoader yields, each one is stepped until its
    ``last_epoch`` reaches the batch's step of the job
    (``DataLoader.job_step``). A worker that joins a running job (or skips
    clocks it fell behind on) then pushes its first gradient with the lr
    the other workers push at that step, instead of starting its warm-up
    over. For schedulers stepped once per ``opt.step()`` (warm-up, cosine,
    OneCycleLR, ...); call it before the loop."""
    state = _require()
    for s in schedulers:
        if isinstance(s, torch.optim.lr_scheduler.ReduceLROnPlateau):
            raise TypeError("pacer.torch.follow_job_step: ReduceLROnPlateau steps on a metric, "
                            "not once per step: it cannot be stepped to the job's step")
        if not hasattr(s, "last_epoch") or not callable(getattr(s, "step", None)):
            raise TypeError("pacer.torch.follow_job_step: %r is not an lr scheduler" % (s,))
    state.schedulers.extend(schedulers)


def _catch_up(state, step):
    """follow_job_step's schedulers at `step` (without torch's warning on
    a scheduler stepped before its optimizer)."""
    behind = [s for s in state.schedulers if s.last_epoch < step]
    if not behind:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s in behind:
            while s.last_epoch < step:
                s.step()


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
    """Leaves the job (the monitor stops waiting for this worker) and returns
    the run's figures, a dict: ``id`` and ``rank`` (the monitor's), ``clocks``
    (steps pushed), ``samples`` (trained), ``last_batch`` (the last batch's
    size), ``seconds`` (from the run's start to the end), of which
    ``compute_seconds`` (the loop's own time: forward, backward, the
    optimizer's bookkeeping), ``communication_seconds`` (pushes and pulls)
    and ``wait_seconds`` (waiting for the barrier or the monitor), and
    ``stop_reason`` (why the run ended). The same figures go to stderr as one
    ``worker summary:`` line, as pacer-worker prints it (pacer-run's table
    is made of these lines)."""
    global _state
    state = _require()
    if state.finished is None:
        try:
            state.finished = state.trainer.finish() if state.trainer is not None else {}
        finally:
            _unpin(state)
        f = state.finished
        if f:
            sys.stderr.write(
                "pacer.torch: worker summary: rank=%d clocks=%d samples=%d seconds=%.3f "
                "compute_s=%.3f communication_s=%.3f wait_s=%.3f last_batch=%d\n"
                % (f["rank"], f["clocks"], f["samples"], f["seconds"], f["compute_seconds"],
                   f["communication_seconds"], f["wait_seconds"], f["last_batch"]))
            sys.stderr.flush()
    return state.finished
