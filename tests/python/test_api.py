"""pacer.torch's refusals, which need no cluster: what it cannot map onto
the shards raises, naming what is supported."""

import pytest
import torch

import pacer.torch as pt


@pytest.fixture(autouse=True)
def worker():
    pt.init("tcp://127.0.0.1:9", handle_sigterm=False)
    yield
    pt.shutdown()


def net():
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def test_an_unsupported_optimizer_names_the_supported_ones():
    m = net()
    with pytest.raises(TypeError, match="RMSprop is not supported.*SGD.*Adam.*AdamW.*Adagrad"):
        pt.distribute(m, torch.optim.RMSprop(m.parameters()))


def test_maximize_is_refused():
    m = net()
    with pytest.raises(TypeError, match="maximize=True is not supported"):
        pt.distribute(m, torch.optim.SGD(m.parameters(), lr=0.1, maximize=True))


def test_every_trainable_parameter_must_be_in_the_optimizer():
    m = net()
    with pytest.raises(ValueError, match="does not train 2.weight, 2.bias"):
        pt.distribute(m, torch.optim.Adam(m[0].parameters()))


def test_float64_parameters_are_refused():
    m = net().double()
    with pytest.raises(TypeError, match="float64; the shards hold float32"):
        pt.distribute(m, torch.optim.SGD(m.parameters(), lr=0.1))


def test_step_with_a_closure_is_refused():
    m = net()
    _, opt = pt.distribute(m, torch.optim.SGD(m.parameters(), lr=0.1))
    with pytest.raises(TypeError, match="closure"):
        opt.step(lambda: 0.0)


def test_no_monitor_address_says_how_to_give_one(monkeypatch):
    monkeypatch.delenv("PACER_MONITOR", raising=False)
    pt.shutdown()
    with pytest.raises(ValueError, match="PACER_MONITOR"):
        pt.init()
    pt.init("tcp://127.0.0.1:9", handle_sigterm=False)


@pytest.mark.parametrize("address", ["127.0.0.1:5761", "tcp://127.0.0.1", "tcp://h:70000",
                                     "http://127.0.0.1:5761"])
def test_a_malformed_address_is_refused_at_init_as_the_tools_refuse_it(monkeypatch, address):
    pt.shutdown()
    with pytest.raises(ValueError, match=r"init\(monitor\)\): expected tcp://HOST:PORT \(or ipc://PATH\)"):
        pt.init(address, handle_sigterm=False)
    monkeypatch.setenv("PACER_MONITOR", address)
    with pytest.raises(ValueError, match=r"PACER_MONITOR\): expected tcp://HOST:PORT"):
        pt.init(handle_sigterm=False)
    pt.init("tcp://127.0.0.1:9", handle_sigterm=False)


def test_a_rank_that_is_not_a_whole_number_is_refused_at_init(monkeypatch):
    pt.shutdown()
    monkeypatch.setenv("PACER_RANK", "first")
    with pytest.raises(ValueError, match="PACER_RANK='first' is not a whole number"):
        pt.init("tcp://127.0.0.1:9", handle_sigterm=False)
    monkeypatch.delenv("PACER_RANK")
    with pytest.raises(ValueError, match="rank must be a whole number >= 0"):
        pt.init("tcp://127.0.0.1:9", rank=-1, handle_sigterm=False)
    pt.init("tcp://127.0.0.1:9", handle_sigterm=False)


def test_a_scheduler_on_a_metric_cannot_follow_the_job_step():
    m = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="ReduceLROnPlateau steps on a metric"):
        pt.follow_job_step(torch.optim.lr_scheduler.ReduceLROnPlateau(opt))
