"""Train a PyTorch model with Pacer from your own training loop.

    import torch, pacer.torch as pt
    pt.init()                                   # PACER_MONITOR, or init("tcp://HOST:PORT")
    net = MyNet()
    model, opt = pt.distribute(net, torch.optim.AdamW(net.parameters(), lr=1e-3,
                                                      weight_decay=0.01),
                               evaluate=test_accuracy)  # on a side thread, when asked
    loader = pt.DataLoader(train_set)           # map-style Dataset
    while not loader.stopped:                   # until the job stops
        for x, y in loader:                     # one epoch of the job
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step(loss=loss)
    pt.shutdown()

What Pacer does and what stays yours:

- The shards hold the parameters and run the optimizer: ``distribute``
  maps ``torch.optim.SGD``, ``Adam``, ``AdamW`` and ``Adagrad`` (with their
  param_groups) onto them and declares it: the first worker's declaration
  sets the job's optimizer, and a worker that declares another is refused.
  Anything else raises ``TypeError``, as does an option the shards lack
  (``maximize=True``).
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
- ``loader.batch_size`` is the size the monitor gave this batch,
  ``loader.job_step`` the job's step it belongs to; ``rank()`` this
  worker's rank; ``is_evaluator()`` whether it evaluates.
- ``distribute(net, opt, evaluate=fn)`` evaluates on a side thread when
  the monitor asks (``fn(model)`` returns the accuracy), so the loop needs
  no evaluation; ``follow_job_step(scheduler)`` starts a joining worker's
  schedulers at the job's step.
- A model on a CUDA device trains from copies of the runtime's buffers,
  page-locked for it (Debian's torch is CPU-only: not run on a GPU here).
"""

from ._data import DataLoader
from ._optim import SUPPORTED_OPTIMIZERS, DistributedOptimizer, distribute
from ._runtime import follow_job_step, init, is_evaluator, rank, report, shutdown

__all__ = ["init", "distribute", "DataLoader", "follow_job_step", "is_evaluator", "rank",
           "report", "shutdown", "DistributedOptimizer", "SUPPORTED_OPTIMIZERS"]
