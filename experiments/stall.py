"""
Why the byte AED can stall at the 1-gram floor: trains the overfitting study's AED
(config/bytes_aed_mse_possub.py on the first 500,000 bytes) for its first steps at each seed, then
measures on 64 windows of val.bin: the ce, the embedding loss, and how much of the variance of the
encoder's output (enc) and of the state before the head (out) is position's alone (1: the state is
the same for every text at a position; the decoder sees the tokens only through enc).

$ python experiments/stall.py                      # seeds 3 and 2, 100 steps: ~7 min, one thread
$ python experiments/stall.py --seeds=3,2,4 --steps=200
$ python experiments/stall.py --seeds=3 --embedding_loss_coeff=0.0  # the same init and batches,
                                                                     # no embedding loss
$ python experiments/stall.py --rate=experiments/bytes_stall  # how often: a table of the runs

Needs data/wikipedia_bytes (python prepare.py --tokenizer=bytes). The runs go in a temporary folder.
"""
import argparse
import glob
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from checkpoint import load  # noqa: E402
from model import Transformer  # noqa: E402


def position_share(h):
    """h: (B, T, C) -> the share of h's variance (over texts and positions) that is position's."""
    total = h.var(dim=(0, 1), unbiased=False).sum()
    within = h.var(dim=0, unbiased=False).sum(-1).mean()  # across texts, at each position
    return float(1 - within / total)


def probe(model, x, y):
    """The ce, embedding loss and position's shares of a model on windows x, targets y (B, T)."""
    model.eval()
    with torch.no_grad():
        out, E, enc = model.hidden_states(x)  # (B, T, C) each
        ce = F.cross_entropy(model.head(out).flatten(0, 1), y.flatten())
        emb = model.embedding_distance(*model.embedding_pair(E, enc))
    return dict(ce=float(ce), emb=float(emb), enc=position_share(enc), out=position_share(out))


STALL = 3.0  # the rule, declared first: a val estimate of 3.0 or more at step 400
STALL_STEP = 400


def binomial_interval(k, n, alpha=0.05):
    """The exact (Clopper-Pearson) interval of a rate of k in n, by bisection on the binomial."""
    def tail(p, lo):  # P(X >= k) if lo else P(X <= k), X ~ Binomial(n, p)
        ks = range(k, n + 1) if lo else range(0, k + 1)
        return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in ks)

    def solve(f):  # the p where f(p) = alpha / 2, f increasing in p
        a, b = 0.0, 1.0
        for _ in range(60):
            m = (a + b) / 2
            a, b = (m, b) if f(m) < alpha / 2 else (a, m)
        return (a + b) / 2
    lower = 0.0 if k == 0 else solve(lambda p: tail(p, True))
    upper = 1.0 if k == n else solve(lambda p: -tail(p, False) + alpha)
    return lower, upper


def rate_table(res, of=0):
    """The stall rule applied to each finished run in res, by arm (the name without _seed<n>)."""
    arms = {}
    for path in sorted(glob.glob(os.path.join(res, '*', 'log.jsonl'))):
        name = os.path.basename(os.path.dirname(path))
        est = {r['step']: r['val'] for r in map(json.loads, open(path)) if r['type'] == 'est'}
        if STALL_STEP in est:
            arms.setdefault(re.sub(r'_seed\d+$', '', name), []).append((name, est))
    n_runs = sum(map(len, arms.values()))
    lines = [f"{n_runs} of {of or n_runs} runs finished.", "",
             "| arm | runs | stalled | rate | 95% interval (exact) | val at 400, the others |",
             "|---|---|---|---|---|---|"]
    stalled = []
    for arm, runs in arms.items():
        bad = [(name, est) for name, est in runs if est[STALL_STEP] >= STALL]
        ok = [est[STALL_STEP] for name, est in runs if est[STALL_STEP] < STALL]
        lo, hi = binomial_interval(len(bad), len(runs))
        spread = f"{min(ok):.3f}-{max(ok):.3f}" if ok else "-"
        lines.append(f"| {arm} | {len(runs)} | {len(bad)} | {len(bad) / len(runs):.1%} "
                     f"| [{lo:.1%}, {hi:.1%}] | {spread} |")
        stalled += bad
    for name, est in stalled:
        lines.append(f"\nStalled: {name}, val estimate "
                     + ", ".join(f"{v:.3f} at step {s}" for s, v in sorted(est.items())) + ".")
    where = set()  # from each run's summary.json
    for path in glob.glob(os.path.join(res, '*', 'summary.json')):
        s = json.load(open(path))
        where.add(f"commit {str(s.get('commit'))[:7]}{'+' * bool(s.get('tree_changed'))}, "
                  f"{s.get('threads')} thread(s), {s.get('cpu')} ({s.get('cpu_isa')}), "
                  f"torch {s.get('torch')}")
    if where:
        lines.append("\nWhere they ran: " + "; ".join(sorted(where)) + ".")
    lines = "\n".join(lines).split("\n")  # prose within 100 columns; table rows as they are
    return "\n".join(line if line.startswith('|') else textwrap.fill(line, 100) for line in lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument('--seeds', default='3,2')
    p.add_argument('--steps', type=int, default=100)
    p.add_argument('--embedding_loss_coeff', type=float,
                   help="the embedding loss's coefficient (default: the config's, 8); 0 trains "
                        "without it, on the same init and batches")
    p.add_argument('--rate', help="a study's folder of runs: the stall rule's table, nothing run")
    p.add_argument('--of', type=int, default=0, help="the runs the study has in all")
    args = p.parse_args()
    if args.rate:
        print(rate_table(args.rate, args.of))
        return
    if args.steps < 1:
        p.error(f"--steps must be at least 1, got {args.steps}")
    path = os.path.join(ROOT, 'data', 'wikipedia_bytes', 'val.bin')
    if not os.path.isfile(path):
        sys.exit(f"error: no {path}: run python prepare.py --tokenizer=bytes first")
    val = np.memmap(path, np.uint16, mode='r')
    ix = np.random.default_rng(0).integers(0, len(val) - 257, 64)
    rows = torch.from_numpy(np.stack([val[i:i + 257] for i in ix]).astype(np.int64))
    x, y = rows[:, :-1], rows[:, 1:]
    coeff = [] if args.embedding_loss_coeff is None else [
        f'--embedding_loss_coeff={args.embedding_loss_coeff}']
    print("| seed | step | val estimate | ce | embedding loss | position's share of enc | of out |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds.split(','):
            out_dir = os.path.join(tmp, seed)
            cmd = [sys.executable, 'train.py', 'config/bytes_aed_mse_possub.py', f'--seed={seed}',
                   '--train_tokens=500000', f'--train_steps={args.steps}',
                   f'--est_interval={args.steps}', f'--out_dir={out_dir}', *coeff]
            r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                               env={**os.environ, 'OMP_NUM_THREADS': '1'})
            if r.returncode:
                why = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
                sys.exit(f"error: train.py failed at seed {seed}: {why.removeprefix('error: ')}")
            ckpt, config = load(os.path.join(out_dir, 'ckpt_last.pt'))
            model = Transformer(config)
            model.load_state_dict(ckpt['model'])
            m = probe(model, x, y)
            with open(os.path.join(out_dir, 'log.jsonl')) as f:  # train.py's own, at the last step
                est = [r['val'] for r in map(json.loads, f) if r['type'] == 'est'][-1]
            print(f"| {seed} | {args.steps} | {est:.3f} | {m['ce']:.3f} | {m['emb']:.2e} "
                  f"| {m['enc']:.2f} | {m['out']:.2f} |", flush=True)


if __name__ == '__main__':
    main()
