"""A pacer.torch worker with a linear lr warm-up (LambdaLR over --warmup
steps), started at the job's step with --follow (pt.follow_job_step), of
SGD or (--optimizer adamw) AdamW. Writes one line per push to --out: the
batch's job step (loader.job_step) and the lr the push carries."""

import argparse

import torch

import pacer.torch as pt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warmup", type=int, default=100000)
    ap.add_argument("--follow", action="store_true")
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    pt.init()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2048, 20, generator=g)
    data = torch.utils.data.TensorDataset(x, x[:, :4].argmax(dim=1))
    torch.manual_seed(11)
    net = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    if args.optimizer == "sgd":
        inner = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    else:
        inner = torch.optim.AdamW(net.parameters(), lr=1e-3)
    model, opt = pt.distribute(net, inner)
    warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / args.warmup))
    if args.follow:
        pt.follow_job_step(warmup)
    loader = pt.DataLoader(data)
    with open(args.out, "w") as out:
        while not loader.stopped:
            for xb, yb in loader:
                loss = torch.nn.functional.cross_entropy(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                out.write("%d %.9g\n" % (loader.job_step, opt.param_groups[0]["lr"]))
                out.flush()
                opt.step(loss=loss)
                warmup.step()
    pt.shutdown()


if __name__ == "__main__":
    main()
