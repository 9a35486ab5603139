#!/usr/bin/python3
"""The Fashion-MNIST recipe of examples/fashion_mnist.c in PyTorch (CPU).

Run with Debian's python3-torch (a bench-only dependency):
    /usr/bin/python3 bench/torch_mlp.py [--threads N] [--seed S] [--epochs E]

Same recipe: pixels in [0, 1] normalised by the training set's mean and std;
MLP 784-256-128-10 with ReLU (torch.nn.Linear's default init); AdamW lr 1e-3,
betas 0.9/0.999, eps 1e-8, weight decay 1e-4; CosineAnnealingLR to 0 over all
batches (stepped per batch); batch 128 reshuffled every epoch, last partial
batch kept; 5 epochs; seed 1. Like the C demo, the loop reads no value back
inside an epoch (losses are kept and read at its end). The last line:
    result test_accuracy=... train_loss=... epochs=5 images_per_s=... mode=torch
"""
import argparse
import gzip
import os
import struct
import time

import numpy as np
import torch


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 8:
        raise ValueError(f"{path}: not an idx u8 file")
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise ValueError(f"{path}: size does not match the header")
    return arr.reshape(dims)


def load(d, split):
    def p(kind):
        g = os.path.join(d, f"{split}-{kind}.gz")
        return g if os.path.exists(g) else os.path.join(d, f"{split}-{kind}")
    x = read_idx(p("images-idx3-ubyte")).reshape(-1, 784).astype(np.float32) / 255.0
    y = read_idx(p("labels-idx1-ubyte")).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--wd", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    xtr, ytr = load(args.data, "train")
    xte, yte = load(args.data, "t10k")
    mean, std = xtr.mean().item(), xtr.std(unbiased=False).item()
    xtr = (xtr - mean) / std
    xte = (xte - mean) / std

    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=args.wd)
    n = xtr.shape[0]
    per_epoch = (n + args.batch - 1) // args.batch
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=per_epoch * args.epochs, eta_min=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    print(f"torch_mlp: {n} train / {xte.shape[0]} test images, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, seed {args.seed}", flush=True)

    train_time, train_loss, acc = 0.0, 0.0, 0.0
    for ep in range(args.epochs):
        t0 = time.perf_counter()
        model.train()
        perm = torch.randperm(n, generator=gen)
        losses = []
        for b in range(per_epoch):
            idx = perm[b * args.batch:(b + 1) * args.batch]
            x, y = xtr[idx], ytr[idx]
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.detach() * idx.numel())
        train_loss = torch.stack(losses).sum().item() / n
        dt = time.perf_counter() - t0
        train_time += dt
        model.eval()
        with torch.no_grad():
            correct = sum((model(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum().item()
                          for i in range(0, xte.shape[0], 1000))
        acc = correct / xte.shape[0]
        print(f"epoch {ep + 1}/{args.epochs} train_loss={train_loss:.4f} test_accuracy={acc:.4f} "
              f"time={dt:.2f}s images_per_s={n / dt:.0f}", flush=True)
    print(f"result test_accuracy={acc:.4f} train_loss={train_loss:.4f} epochs={args.epochs} "
          f"images_per_s={n * args.epochs / train_time:.0f} mode=torch", flush=True)


if __name__ == "__main__":
    main()
