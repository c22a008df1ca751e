#!/usr/bin/python3
"""Golden runs of torch.optim for Pacer's optimizer parity tests.

For each case below: a tiny model (a 3x4 weight and a bias of 4, float32),
200 steps of the torch.optim optimizer on gradients of a fixed quadratic
loss plus fixed noise (numpy seed per case), some cases with a second
parameter group or learning-rate changes mid-run. Each case is written to
tests/optimizer/golden/CASE.txt; the C++ tests replay the recorded
gradients through Pacer's shard table (optimizer_parity_test) and through a
2-shard job (optimizer_cluster_test) and compare with the recorded
parameters. Nothing in Pacer computes the expected values.

Run with Debian's Python and python3-torch (1.13):
    /usr/bin/python3 tests/optimizer/make_golden.py
and commit the output.

File format, one record per line, space-separated:
    # comment lines
    case NAME
    torch VERSION
    optimizer sgd|adam|adamw|adagrad
    tensor NAME SIZE GROUP        (in flat order; a tensor is one key)
    group INDEX SETTINGS          (torch's settings of that param group as
                                   key=value,...; group 0 is the default)
    init V1 V2 ...                (the initial parameters, flat)
    step T LR0 LR1 ... grad G1 G2 ...   (step T's lr per group and gradient)
    param T V1 V2 ...             (the parameters after step T, every 10)
Floats are printed with 9 significant digits (exact for float32).
"""
import os
import sys

import numpy as np
import torch

STEPS = 200
EVERY = 10
HERE = os.path.dirname(os.path.abspath(__file__))


def fmt(x):
    return "%.9g" % float(x)


def settings_text(kind, g):
    keys = {
        "sgd": ["lr", "momentum", "dampening", "nesterov", "weight_decay"],
        "adam": ["lr", "betas", "eps", "weight_decay", "amsgrad"],
        "adamw": ["lr", "betas", "eps", "weight_decay", "amsgrad"],
        "adagrad": ["lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps"],
    }[kind]
    out = []
    for k in keys:
        v = g[k]
        if k == "betas":
            out.append("betas=%s:%s" % (fmt(v[0]), fmt(v[1])))
        elif isinstance(v, bool):
            out.append("%s=%s" % (k, "true" if v else "false"))
        else:
            out.append("%s=%s" % (k, fmt(v)))
    return ",".join(out)


def f32(settings):
    """The settings rounded to float32 values: Pacer keeps them as float32,
    torch as Python floats; with float32-exact values both compute the same
    scalars (step sizes, bias corrections) from the same numbers."""
    out = {}
    for k, v in settings.items():
        if isinstance(v, bool) or k == "params":
            out[k] = v
        elif isinstance(v, tuple):
            out[k] = tuple(float(np.float32(x)) for x in v)
        else:
            out[k] = float(np.float32(v))
    return out


def make(name, kind, defaults, bias_group=None, schedule=None, seed=1):
    """schedule(step, optimizer): changes param_groups' lr before step (1-based)."""
    defaults = f32(defaults)
    bias_group = None if bias_group is None else f32(bias_group)
    rng = np.random.RandomState(seed)
    weight = torch.tensor(rng.normal(0, 0.5, (3, 4)).astype(np.float32), requires_grad=True)
    bias = torch.tensor(rng.normal(0, 0.5, (4,)).astype(np.float32), requires_grad=True)
    target_w = torch.tensor(rng.normal(0, 1, (3, 4)).astype(np.float32))
    target_b = torch.tensor(rng.normal(0, 1, (4,)).astype(np.float32))
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
           "adagrad": torch.optim.Adagrad}[kind]
    if bias_group is None:
        groups = [{"params": [weight, bias]}]
    else:
        groups = [{"params": [weight]}, dict({"params": [bias]}, **bias_group)]
    opt = cls(groups, **defaults)
    for g in opt.param_groups:  # the defaults torch filled in (eps, betas), float32-exact too
        g.update(f32({k: v for k, v in g.items() if k != "params" and isinstance(v, (float, tuple))}))
    lines = ["# torch.optim golden run: written by tests/optimizer/make_golden.py; do not edit",
             "case " + name, "torch " + torch.__version__, "optimizer " + kind]
    lines.append("tensor weight %d 0" % weight.numel())
    lines.append("tensor bias %d %d" % (bias.numel(), 0 if bias_group is None else 1))
    for i, g in enumerate(opt.param_groups):
        lines.append("group %d %s" % (i, settings_text(kind, g)))
    flat = lambda: torch.cat([weight.detach().reshape(-1), bias.detach().reshape(-1)])
    lines.append("init " + " ".join(fmt(v) for v in flat().tolist()))
    for t in range(1, STEPS + 1):
        if schedule is not None:
            schedule(t, opt)
        opt.zero_grad()
        # A quadratic pull towards a target, with noise; every 37th step a
        # large gradient and every 53rd a zero one (eps, amsgrad, moments).
        loss = 0.5 * ((weight - target_w) ** 2).sum() + 0.5 * ((bias - target_b) ** 2).sum()
        loss.backward()
        noise = rng.normal(0, 0.3, 16).astype(np.float32)
        scale = 20.0 if t % 37 == 0 else (0.0 if t % 53 == 0 else 1.0)
        with torch.no_grad():
            weight.grad.add_(torch.from_numpy(noise[:12].reshape(3, 4)))
            bias.grad.add_(torch.from_numpy(noise[12:]))
            weight.grad.mul_(scale)
            bias.grad.mul_(scale)
        grad = torch.cat([weight.grad.reshape(-1), bias.grad.reshape(-1)])
        lrs = " ".join(fmt(g["lr"]) for g in opt.param_groups)
        lines.append("step %d %s grad %s" % (t, lrs, " ".join(fmt(v) for v in grad.tolist())))
        opt.step()
        if t % EVERY == 0:
            lines.append("param %d %s" % (t, " ".join(fmt(v) for v in flat().tolist())))
    path = os.path.join(HERE, "golden", name + ".txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote", os.path.relpath(path))


def step_decay(at, factor):
    """StepLR-like: every group's lr times `factor` at each step in `at`."""
    def schedule(t, opt):
        if t in at:
            for g in opt.param_groups:
                g["lr"] *= factor
    return schedule


def main():
    if not torch.__version__.startswith("1.13"):
        print("make_golden.py: torch %s; the golden runs follow PyTorch 1.13 (Debian's "
              "python3-torch, run /usr/bin/python3)" % torch.__version__, file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    os.makedirs(os.path.join(HERE, "golden"), exist_ok=True)
    make("sgd_momentum", "sgd", {"lr": 0.1, "momentum": 0.9}, seed=1)
    make("sgd_nesterov_weight_decay", "sgd",
         {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}, seed=2)
    make("sgd_dampening", "sgd", {"lr": 0.1, "momentum": 0.8, "dampening": 0.3}, seed=3)
    make("sgd_plain_weight_decay", "sgd", {"lr": 0.1, "weight_decay": 0.05}, seed=4)
    make("adam", "adam", {"lr": 1e-3}, seed=5)
    make("adam_amsgrad_weight_decay", "adam",
         {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.01, "amsgrad": True},
         seed=6)
    make("adamw_no_decay_bias", "adamw", {"lr": 1e-2, "weight_decay": 0.01},
         bias_group={"weight_decay": 0.0}, seed=7)
    make("adamw_lr_schedule", "adamw", {"lr": 1e-2, "weight_decay": 0.05},
         bias_group={"weight_decay": 0.0, "lr": 3e-2},
         schedule=step_decay({50, 100, 150}, 0.5), seed=8)
    make("adagrad", "adagrad", {"lr": 1e-2}, seed=9)
    make("adagrad_decay_weight_decay", "adagrad",
         {"lr": 5e-2, "lr_decay": 0.01, "weight_decay": 1e-3, "initial_accumulator_value": 0.1},
         seed=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
