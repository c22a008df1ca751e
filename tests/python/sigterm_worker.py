"""A pacer.torch worker on synthetic data that trains until the job stops
or SIGTERM; prints 'left after N batches' and the stop reason."""

import torch

import pacer.torch as pt


def main():
    torch.manual_seed(0)
    pt.init()
    m = torch.nn.Linear(8, 3)
    model, opt = pt.distribute(m, torch.optim.SGD(m.parameters(), lr=0.1))
    data = torch.utils.data.TensorDataset(torch.randn(4096, 8), torch.randint(0, 3, (4096,)))
    loader = pt.DataLoader(data)
    while not loader.stopped:  # an iteration per epoch of the job, until it stops
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step(loss=loss)
    result = pt.shutdown()
    print("left after %d batches: %s" % (loader.step, result["stop_reason"]), flush=True)


if __name__ == "__main__":
    main()
