#!/usr/bin/python3
"""The char-level GPT recipe of examples/char_gpt.c in PyTorch (CPU, f32).

Run with Debian's python3-torch 1.13 (a bench-only dependency):
    /usr/bin/python3 bench/torch_gpt.py [--threads N] [--steps S] [...]
bench/gpt_vs_torch.sh runs it beside the C demo.

The same recipe as the C demo, flag for flag (defaults too):
- data: examples/corpus.h's reader (a directory's regular files not ending
  in .dat, symlinks skipped, names in byte order; fortunes split at lines
  holding only '%', empty ones skipped; fortune i is validation when
  i % 10 == 9; byte tokens, vocabulary = the training split's bytes in byte
  order plus one id for unseen bytes);
- batches: the same documented generator, implemented here again: row b of
  training step s starts at splitmix64(seed + 0x9E3779B97F4A7C15 *
  (1 + s * batch + b)) % (n - ctx) in the training tokens; evaluation batch e
  uses s = 2^40 + e over the validation tokens; --by-document:
  examples/docbatch.h's batches (stream 1 training, 2 validation), padding
  targets -100 (ignore_index);
- model: token + position embeddings, pre-norm blocks of causal attention
  written out (q k^T * 1/sqrt(head_dim) + additive -inf mask, softmax,
  dropout, @ v; torch 1.13 has no scaled_dot_product_attention) and a GELU
  (erf) MLP of 4 x dmodel, final layer norm (eps 1e-5), head tied to the
  token embedding, every linear with a bias; q, k, v project to
  heads x head_dim;
- initialisation distribution: N(0, 0.02) for weights and embeddings,
  N(0, 0.02 / sqrt(2 layers)) for the attention output and MLP output
  projections, biases 0, norms 1 / 0 (torch's generator, so the values are
  not ctpu's: the same distribution, not the same draws);
- optimizer: torch.optim.AdamW, betas 0.9 / 0.95, eps 1e-8, two groups (the
  2-D weights and embeddings with --wd, biases and norm parameters with 0);
  learning rate per step by ctpu_lr_warmup_cosine's rule (nanoGPT's get_lr:
  lr (s + 1) / (warmup + 1) during the warmup, then cosine to lr / 10 at
  --steps); warmup default min(100, steps / 10) as in the C demo;
- loop: the step's losses are kept on the side and read at the end of each
  --eval-every interval, as the C demo does; tokens/s counts the training
  time only (evaluations excluded), real (unpadded) tokens with
  --by-document.

Output lines as the C demo's:
    step S/N train_loss=... val_loss=... val_bpc=... tokens_per_s=...
    result val_loss=... train_loss=... steps=N tokens_per_s=... mode=torch
"""
import argparse
import math
import os
import stat
import sys
import time

import torch
import torch.nn.functional as F

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def splitmix64(z):
    z = (z + GOLDEN) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


assert splitmix64(0) == 0xE220A8397B1DCDAF  # tests/test_docbatch.c's fixed value


# ------------------------------------------------------------------ corpus
def read_fortunes(path, split):
    with open(path, "rb") as f:
        data = f.read()
    start = 0
    i = 0
    n = len(data)
    while i < n:
        e = data.find(b"\n", i)
        if e < 0:
            e = n
        nxt = e + 1 if e < n else e
        if e - i == 1 and data[i:i + 1] == b"%":
            split.add(data[start:i])
            start = nxt
        i = nxt
    split.add(data[start:n])


class Split:
    def __init__(self):
        self.tr, self.va = [], []
        self.index = 0

    def add(self, text):
        if not text:
            return
        (self.va if self.index % 10 == 9 else self.tr).append(text)
        self.index += 1


def load_corpus(path):
    s = Split()
    files = 0
    if os.path.isdir(path):
        for name in sorted(os.listdir(os.fsencode(path))):
            if name.endswith(b".dat"):
                continue
            full = os.path.join(os.fsencode(path), name)
            if stat.S_ISREG(os.lstat(full).st_mode):
                read_fortunes(full, s)
                files += 1
    else:
        read_fortunes(path, s)
        files = 1
    if not s.tr or not s.va:
        sys.exit(f"torch_gpt: {path} has {len(s.tr) + len(s.va)} fortunes; the 90/10 split needs at least 10")
    seen = sorted(set(b"".join(s.tr)))
    id_of = [len(seen)] * 256
    for i, b in enumerate(seen):
        id_of[b] = i
    vocab = len(seen) + 1

    def tokens(docs):
        offs = [0]
        for d in docs:
            offs.append(offs[-1] + len(d))
        tok = torch.tensor(list(b"".join(docs)), dtype=torch.int64)
        lut = torch.tensor(id_of, dtype=torch.int64)
        return lut[tok], offs

    tr, otr = tokens(s.tr)
    va, ova = tokens(s.va)
    return dict(files=files, train=tr, val=va, doc_train=otr, doc_val=ova, vocab=vocab,
                fortunes_train=len(s.tr), fortunes_val=len(s.va))


# ------------------------------------------------------------------ batches
class WindowBatches:
    """char_gpt.c's fixed-window sampler."""

    def __init__(self, tok, a):
        self.tok, self.batch, self.ctx, self.seed = tok, a.batch, a.ctx, a.seed
        self.n = len(tok)

    def get(self, s):
        starts = [splitmix64((self.seed + GOLDEN * (1 + s * self.batch + b)) & M64) % (self.n - self.ctx)
                  for b in range(self.batch)]
        idx = torch.tensor(starts, dtype=torch.int64)[:, None] + torch.arange(self.ctx + 1)[None, :]
        w = self.tok[idx]
        return w[:, :-1], w[:, 1:], self.batch * self.ctx


class DocBatches:
    """examples/docbatch.h's --by-document batches."""

    POOL = 50

    def __init__(self, tok, offs, a, stream):
        self.tok, self.batch, self.ctx, self.seed, self.stream = tok, a.batch, a.ctx, a.seed, stream
        self.start, self.len = [], []
        for i in range(len(offs) - 1):
            n = offs[i + 1] - offs[i]
            t = min(n, self.ctx + 1) - 1
            if t >= 1:
                self.start.append(offs[i])
                self.len.append(t)
        self.n = len(self.start)
        if self.n < self.batch:
            sys.exit(f"torch_gpt: by-document batches: {self.n} documents of 2 or more tokens, "
                     f"fewer than --batch {self.batch}")
        self.nb = self.n // self.batch
        self.epoch = self.pool = -1

    def key(self, *vs):
        k = self.seed
        for v in vs:
            k = splitmix64((k + v) & M64)
        return k

    @staticmethod
    def shuffle(a, k):
        n = len(a)
        for i in range(n - 1, 0, -1):
            j = splitmix64((k + GOLDEN * (1 + (n - 1 - i))) & M64) % (i + 1)
            a[i], a[j] = a[j], a[i]

    def get(self, step):
        e, r = divmod(step, self.nb)
        k = r // self.POOL
        if e != self.epoch:
            self.perm = list(range(self.n))
            self.shuffle(self.perm, self.key(self.stream, e))
            self.epoch, self.pool = e, -1
        if k != self.pool:
            lo = k * self.POOL * self.batch
            hi = min(lo + self.POOL * self.batch, self.nb * self.batch)
            pos = sorted(range(lo, hi), key=lambda p: (self.len[self.perm[p]], p))
            self.sorted = [self.perm[p] for p in pos]
            self.order = list(range((hi - lo) // self.batch))
            self.shuffle(self.order, self.key(self.stream, e, 1 + k))
            self.pool = k
        j = self.order[r % self.POOL]
        docs = self.sorted[j * self.batch:(j + 1) * self.batch]
        T = max(2, max(self.len[d] for d in docs))
        x = torch.zeros(self.batch, T, dtype=torch.int64)
        y = torch.full((self.batch, T), -100, dtype=torch.int64)
        real = 0
        for b, d in enumerate(docs):
            n, s0 = self.len[d], self.start[d]
            x[b, :n] = self.tok[s0:s0 + n]
            y[b, :n] = self.tok[s0 + 1:s0 + n + 1]
            real += n
        return x, y, real


# ------------------------------------------------------------------ model
class GPT(torch.nn.Module):
    def __init__(self, a, vocab):
        super().__init__()
        L, H, D, hd, T = a.layers, a.heads, a.dmodel, a.head_dim, a.ctx
        self.L, self.H, self.hd, self.T, self.p = L, H, hd, T, a.dropout
        HD = H * hd
        proj = 0.02 / math.sqrt(2.0 * L)

        def w(r, c, std=0.02):
            return torch.nn.Parameter(torch.randn(r, c) * std)

        def const(n, v):
            return torch.nn.Parameter(torch.full((n,), float(v)))

        self.wte, self.wpe = w(vocab, D), w(T, D)
        self.blocks = torch.nn.ModuleList()
        for _ in range(L):
            b = torch.nn.Module()
            b.ln1_w, b.ln1_b = const(D, 1), const(D, 0)
            b.wq, b.bq = w(D, HD), const(HD, 0)
            b.wk, b.bk = w(D, HD), const(HD, 0)
            b.wv, b.bv = w(D, HD), const(HD, 0)
            b.wo, b.bo = w(HD, D, proj), const(D, 0)
            b.ln2_w, b.ln2_b = const(D, 1), const(D, 0)
            b.w1, b.b1 = w(D, 4 * D), const(4 * D, 0)
            b.w2, b.b2 = w(4 * D, D, proj), const(D, 0)
            self.blocks.append(b)
        self.lnf_w, self.lnf_b = const(D, 1), const(D, 0)
        self.register_buffer("mask", torch.full((T, T), float("-inf")).triu(1))

    def forward(self, x):
        B, T = x.shape
        p, tr = self.p, self.training
        D = self.wte.shape[1]
        h = F.dropout(self.wte[x] + self.wpe[:T], p, tr)
        scale = 1.0 / math.sqrt(self.hd)
        mask = self.mask[:T, :T]
        for b in self.blocks:
            a = F.layer_norm(h, (D,), b.ln1_w, b.ln1_b, 1e-5)
            q = (a @ b.wq + b.bq).view(B, T, self.H, self.hd).transpose(1, 2)
            k = (a @ b.wk + b.bk).view(B, T, self.H, self.hd).transpose(1, 2)
            v = (a @ b.wv + b.bv).view(B, T, self.H, self.hd).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * scale + mask
            att = F.dropout(torch.softmax(att, -1), p, tr)
            o = (att @ v).transpose(1, 2).reshape(B, T, self.H * self.hd)
            h = h + F.dropout(o @ b.wo + b.bo, p, tr)
            m = F.layer_norm(h, (D,), b.ln2_w, b.ln2_b, 1e-5)
            m = F.gelu(m @ b.w1 + b.b1) @ b.w2 + b.b2
            h = h + F.dropout(m, p, tr)
        h = F.layer_norm(h, (D,), self.lnf_w, self.lnf_b, 1e-5)
        return h @ self.wte.t()


def loss_of(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100)


def lr_warmup_cosine(base, step, warmup, total, min_lr):
    """ctpu_lr_warmup_cosine (include/ctpu_nn.h)."""
    step = max(step, 0)
    if step < warmup:
        return base * (step + 1) / (warmup + 1)
    if step >= total or total <= warmup:
        return min_lr
    return min_lr + (base - min_lr) * (1 + math.cos(math.pi * (step - warmup) / (total - warmup))) / 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="/usr/share/games/fortunes")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dmodel", type=int, default=128)
    ap.add_argument("--head-dim", type=int, default=0)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=-1)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--by-document", action="store_true")
    ap.add_argument("--log", default=None)
    a = ap.parse_args()
    if a.warmup < 0:
        a.warmup = min(100, a.steps // 10)
    if a.head_dim == 0:
        if a.dmodel % a.heads:
            sys.exit(f"torch_gpt: --dmodel {a.dmodel} is not a multiple of --heads {a.heads}")
        a.head_dim = a.dmodel // a.heads

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    c = load_corpus(a.data)
    if a.by_document:
        btr = DocBatches(c["train"], c["doc_train"], a, 1)
        bva = DocBatches(c["val"], c["doc_val"], a, 2)
        val_step = lambda e: e  # noqa: E731
    else:
        btr, bva = WindowBatches(c["train"], a), WindowBatches(c["val"], a)
        val_step = lambda e: (1 << 40) + e  # noqa: E731
    model = GPT(a, c["vocab"])
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    nparams = sum(p.numel() for p in model.parameters())
    print(f"torch_gpt: {a.data}: {c['files']} files, {c['fortunes_train']}/{c['fortunes_val']} fortunes, "
          f"{len(c['train'])}/{len(c['val'])} train/val tokens, vocab {c['vocab']}; GPT {a.layers} layers, "
          f"{a.heads} heads x {a.head_dim}, dmodel {a.dmodel}, ctx {a.ctx}, {nparams} parameters, f32; "
          f"batch {a.batch}{' (by document)' if a.by_document else ''}, {a.steps} steps, lr {a.lr:g}, "
          f"warmup {a.warmup}, dropout {a.dropout:g}, seed {a.seed}, threads {a.threads}, torch {torch.__version__}",
          flush=True)

    def evaluate():
        model.eval()
        with torch.no_grad():
            ls = [loss_of(model, *bva.get(val_step(e))[:2]).item() for e in range(a.eval_batches)]
        model.train()
        return sum(ls) / a.eval_batches

    log = open(a.log, "w") if a.log else None
    if log:
        log.write("step,lr,train_loss,val_loss\n")
    train_time, tokens = 0.0, 0
    losses, lrs = [], []
    train_loss = val_loss = float("nan")
    t0 = time.perf_counter()
    for step in range(a.steps):
        lr = lr_warmup_cosine(a.lr, step, a.warmup, a.steps, a.lr / 10)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y, real = btr.get(step)
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model, x, y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        lrs.append(lr)
        tokens += real
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            ls = [v.item() for v in losses]
            train_time += time.perf_counter() - t0
            train_loss = sum(ls) / len(ls)
            val_loss = evaluate()
            if log:
                for i, v in enumerate(ls):
                    last = i == len(ls) - 1
                    log.write(f"{step + 1 - len(ls) + i},{lrs[i]:.9g},{v:.9g},{f'{val_loss:.9g}' if last else ''}\n")
            print(f"step {step + 1}/{a.steps} train_loss={train_loss:.4f} val_loss={val_loss:.4f} "
                  f"val_bpc={val_loss / math.log(2):.4f} tokens_per_s={tokens / train_time:.0f}", flush=True)
            losses, lrs = [], []
            t0 = time.perf_counter()
    if log:
        log.close()
    print(f"result val_loss={val_loss:.4f} train_loss={train_loss:.4f} steps={a.steps} "
          f"tokens_per_s={tokens / train_time if train_time > 0 else 0:.0f} mode=torch", flush=True)


if __name__ == "__main__":
    main()
