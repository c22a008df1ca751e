"""Parity: a one-worker BSP job trained through pacer.torch ends, after 50
steps, at the weights plain PyTorch reaches from the same start on the
same batches, to 1e-5: SGD with momentum, and AdamW with a group without
weight decay. The monitor is given no --optimizer: the script's
declaration sets the shards' optimizer."""

import copy
import os
import warnings

import numpy as np
import pytest
import torch

import pacer.torch as pt

STEPS = 50


def data():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(512, 20, generator=g)
    y = (x[:, :4].argmax(dim=1)).long()
    return torch.utils.data.TensorDataset(x, y)


def net():
    torch.manual_seed(11)
    return torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def sgd(m):
    return torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)


def adamw(m):
    return torch.optim.AdamW([{"params": [m[0].weight, m[2].weight]},
                              {"params": [m[0].bias, m[2].bias], "weight_decay": 0.0}],
                             lr=1e-2, weight_decay=0.01)


@pytest.mark.parametrize("make, kind", [(sgd, "sgd"), (adamw, "adamw")])
def test_weights_match_plain_torch(job, make, kind):
    # Each epoch one chunk: whole batches of 32 (an epoch is 16 of them).
    job.run(shards=2, monitor_args=["--min-workers", "1", "--mode", "bsp", "--policy", "fixed",
                                    "--global-batch", "32",
                                    "--time-cap", "60", "--chunk-samples", str(len(data()))])
    dataset = data()
    model = net()
    start = copy.deepcopy(model.state_dict())
    pt.init(job.monitor, handle_sigterm=False)
    model, opt = pt.distribute(model, make(model))
    loader = pt.DataLoader(dataset)
    batches = []
    while len(batches) < STEPS + 1 and not loader.stopped:  # an iteration per epoch
        for x, y in loader:
            if len(batches) == STEPS:
                batches.append(None)
                break  # the 51st batch's pull holds the weights after 50 steps
            batches.append(loader.samples.copy())
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step(loss=loss)
    assert batches.pop() is None, "no 51st batch: the job stopped early"
    pacer_weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    pt.shutdown()
    assert len(batches) == STEPS
    assert all(len(b) == 32 for b in batches)

    local = net()
    local.load_state_dict(start)
    local_opt = make(local)
    for idx in batches:
        x, y = dataset[torch.from_numpy(idx.astype(np.int64))]
        loss = torch.nn.functional.cross_entropy(local(x), y)
        local_opt.zero_grad()
        loss.backward()
        local_opt.step()
    worst = max((pacer_weights[k] - v).abs().max().item() for k, v in local.state_dict().items())
    moved = max((v - start[k]).abs().max().item() for k, v in local.state_dict().items())
    assert moved > 1e-2, "the weights hardly moved: the comparison would prove nothing"
    assert worst <= 1e-5, "pacer.torch differs from plain torch by %g" % worst


def test_a_parameter_that_changes_shape_is_refused(job):
    job.run(shards=1, monitor_args=["--min-workers", "1", "--mode", "bsp", "--global-batch", "32",
                                    "--time-cap", "60"])
    pt.init(job.monitor, handle_sigterm=False)
    model = net()
    model, opt = pt.distribute(model, sgd(model))
    loader = pt.DataLoader(data())
    with pytest.raises(RuntimeError, match=r"changed shape from \(4,\) to \(5,\)"):
        for x, y in loader:
            torch.nn.functional.cross_entropy(model(x), y).backward()
            model[2].bias.data = torch.zeros(5)
            opt.step()
    pt.shutdown()


def first_worker(job, make):
    """This process as the job's first worker (pt), `make`'s optimizer: the
    DataLoader and a function that trains one batch."""
    job.run(shards=1, monitor_args=["--min-workers", "1", "--mode", "bsp", "--global-batch", "32",
                                    "--lease", "1.5", "--time-cap", "60"])
    pt.init(job.monitor, handle_sigterm=False)
    model = net()
    model, opt = pt.distribute(model, make(model))
    loader = pt.DataLoader(data())
    batches = iter(loader)

    def train_one():
        x, y = next(batches)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step(loss=loss)

    return loader, train_one


def declaration(model):
    """`model`'s tensor names, sizes and values, as core.Trainer.start takes them."""
    named = list(model.named_parameters())
    return ([n for n, _ in named], [p.numel() for _, p in named],
            torch.cat([p.detach().reshape(-1) for _, p in named]).numpy())


def test_a_worker_with_another_model_is_refused_and_the_job_goes_on(job):
    loader, train_one = first_worker(job, sgd)
    train_one()  # the job's model is declared
    # A second worker (a second runtime in this process) brings another model.
    import pacer._core as core
    other = torch.nn.Linear(20, 4)
    t = core.Trainer(job.monitor, start_timeout=10)
    with pytest.raises(Exception, match="differs from the one already declared"):
        t.start(["weight", "bias"], [80, 4],
                torch.cat([other.weight.reshape(-1), other.bias]).detach().numpy(), 512)
    # The first worker trains on (the refused one left the membership at once).
    for _ in range(5):
        train_one()
    assert loader.step == 6
    pt.shutdown()


def test_a_worker_declaring_another_optimizer_is_refused_naming_both(job):
    """The job's optimizer is its first worker's (AdamW here; the monitor is
    on its default, sgd): a later worker that declares SGD is refused, its
    error naming both, and the first trains on."""
    loader, train_one = first_worker(job, adamw)
    train_one()  # the job's model and optimizer are declared
    import pacer._core as core
    names, sizes, init = declaration(net())
    t = core.Trainer(job.monitor, optimizer="sgd", optimizer_settings="lr=0.05,momentum=0.9",
                     start_timeout=10)
    with pytest.raises(Exception,
                       match=r"declares the optimizer sgd \(lr=0.05.*the job runs adamw \(lr=0.01"):
        t.start(names, sizes, init, len(data()))
    for _ in range(3):
        train_one()
    assert loader.step == 4
    pt.shutdown()


def test_a_job_whose_every_worker_is_refused_exits_non_zero(job):
    """The one worker the job needs is refused (a group with a negative lr):
    nothing will train, so the monitor stops the job as a failure: exit 1,
    and a stop reason that says why."""
    job.run(shards=1, monitor_args=["--min-workers", "1", "--time-cap", "60"])
    import pacer._core as core
    names, sizes, init = declaration(net())
    t = core.Trainer(job.monitor, param_groups=["bad:0.bias:lr=-1"], start_timeout=10)
    with pytest.raises(Exception, match="parameter group 'bad'"):
        t.start(names, sizes, init, len(data()))
    monitor = job.procs[0]
    assert monitor.wait(timeout=20) == 1, job.log("monitor")[-3000:]
    out = open(os.path.join(job.dir, "monitor.out")).read()
    assert "stop reason: every worker was refused (1 worker(s); the last: model declaration: " \
           "parameter group 'bad'" in out, out


def test_schedulers_raise_no_false_warning(job):
    """torch's "lr_scheduler.step() before optimizer.step()" warning must not
    show when the loop steps them in order: neither for a scheduler made on
    the user's optimizer before distribute() nor for one made on the
    DistributedOptimizer after."""
    job.run(shards=1, monitor_args=["--min-workers", "1", "--mode", "bsp", "--global-batch", "32",
                                    "--time-cap", "60"])
    pt.init(job.monitor, handle_sigterm=False)
    model = net()
    inner = sgd(model)
    before = torch.optim.lr_scheduler.LambdaLR(inner, lambda step: min(1.0, (step + 1) / 10))
    model, opt = pt.distribute(model, inner)
    after = torch.optim.lr_scheduler.StepLR(opt, step_size=100)
    loader = pt.DataLoader(data())
    steps = 0
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step(loss=loss)
            before.step()
            after.step()
            steps += 1
            if steps == 3:
                break
    pt.shutdown()
    assert steps == 3
    assert [str(w.message) for w in seen if "lr_scheduler" in str(w.message)] == []
