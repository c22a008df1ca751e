"""A pacer.torch worker of a job of local steps (pacer-monitor --mode
local): the user's own torch optimizer steps here (--inner: SGD with
momentum, or RMSprop, which the shards do not run), the outer one is
distribute's outer= (SGD, Nesterov). It sleeps --sleep seconds per step
(a slower worker) and trains until the first batch of round --rounds,
whose pull holds the weights after that many rounds. Writes to --out one
line per local step ("step JOB_STEP INDEX...") and at the end the pulled
weights ("weights V..."), flat in the module's order."""

import argparse
import time

import torch

import pacer.torch as pt


def data():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4096, 20, generator=g)
    return torch.utils.data.TensorDataset(x, x[:, :4].argmax(dim=1))


def net():
    torch.manual_seed(11)
    return torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def inner_optimizer(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.RMSprop(params, lr=1e-3)


def outer_optimizer(params):
    return torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--inner", choices=["sgd", "rmsprop"], default="sgd")
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    pt.init()
    model = net()
    model, opt = pt.distribute(model, inner_optimizer(args.inner, model.parameters()),
                               outer=outer_optimizer(model.parameters()))
    loader = pt.DataLoader(data())
    with open(args.out, "w") as out:
        while not loader.stopped:
            for x, y in loader:
                if loader.job_step >= args.rounds:
                    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
                    out.write("weights %s\n" % " ".join(repr(float(v)) for v in flat))
                    out.flush()
                    pt.shutdown()
                    return
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                time.sleep(args.sleep)
                out.write("step %d %s\n" % (loader.job_step,
                                            " ".join(str(int(i)) for i in loader.samples)))
                out.flush()
                opt.step(loss=loss)
    pt.shutdown()


if __name__ == "__main__":
    main()
