"""
Count-model floors: the val loss of n-gram models counted from the training tokens a run sees,
scored on the tokens train.py scores on all of val.bin. A transformer above a floor has learned
less from its data than counting does.

$ python experiments/floors.py config/bytes_baseline.py    # a run's dataset, slice and context
$ python experiments/floors.py --dataset=wikipedia --train_tokens=100000 --context_size=128 \
      --max_order=2 --json=experiments/data_constrained_floors.json

The models: interpolated Kneser-Ney with one discount per order (docs/data.md, Count-model floors,
gives the formula). The scored tokens are train.py's whole-val ones: val.bin in consecutive windows
of context_size + 1 tokens, every token but a window's first predicted from the tokens before it in
its window, so near a window's start a model has the shorter history the transformer has. Uses
numpy only.
"""
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # configurator.py, when run as python experiments/floors.py
from configurator import ConfigError, die, load_config, train_defaults  # noqa: E402

METHOD = "interpolated Kneser-Ney, discount n1 / (n1 + 2 n2) per order, uniform below unigrams"


def gram_keys(x, k, V):
    """The k-grams of x as integers: key of x[i:i+k] = sum_m x[i+m] V^(k-1-m), for every i."""
    keys = np.zeros(len(x) - k + 1, dtype=np.int64)
    for m in range(k):
        keys = keys * V + x[m:len(x) - k + 1 + m]
    return keys


class Level:
    """Order k's counts: raw counts of the k-grams (the top order) or their continuation counts,
    the number of distinct tokens seen before each (lower orders); per history (the first k - 1
    tokens), the total and the number of distinct next tokens; and the discount."""

    def __init__(self, train, k, V, top):
        grams = gram_keys(train, k + (not top), V)
        if not top:  # a (k+1)-gram's last k tokens: one count per distinct left neighbour
            grams = np.unique(grams) % V ** k
        self.grams, self.counts = np.unique(grams, return_counts=True)
        self.hists, inv = np.unique(self.grams // V, return_inverse=True)
        self.hist_total = np.bincount(inv, weights=self.counts)
        self.hist_types = np.bincount(inv)
        n1, n2 = np.sum(self.counts == 1), np.sum(self.counts == 2)
        self.discount = n1 / (n1 + 2 * n2) if n1 else 0.5

    @staticmethod
    def lookup(table, values, keys):
        i = np.minimum(np.searchsorted(table, keys), len(table) - 1)
        return np.where(table[i] == keys, values[i], 0)

    def prob(self, gram, lower, V):
        """P_k(w | h) for the k-grams `gram` (keys), given P_(k-1) of the same targets."""
        total = self.lookup(self.hists, self.hist_total, gram // V)
        types = self.lookup(self.hists, self.hist_types, gram // V)
        count = self.lookup(self.grams, self.counts, gram)
        seen = total > 0
        total = np.where(seen, total, 1)
        p = (np.maximum(count - self.discount, 0) + self.discount * types * lower) / total
        return np.where(seen, p, lower)


def val_targets(val, context_size):
    """(x, order): the tokens train.py's whole-val loss predicts, each with how many tokens its
    window holds up to and including it (its history plus itself)."""
    n = (len(val) - 1) // context_size
    j = np.arange(1, n * context_size + 1)  # targets val[1 : n * T + 1]
    return j, j - (j - 1) // context_size * context_size + 1


def floor(train, val, V, n, context_size):
    """Mean cross-entropy (nats) on val of the order-n model counted from train."""
    train, val = train.astype(np.int64), val.astype(np.int64)
    j, have = val_targets(val, context_size)
    p = np.full(len(j), 1.0 / V)
    for k in range(1, n + 1):
        level = Level(train, k, V, top=(k == n))
        use = have >= k  # a history of k - 1 tokens in the window
        gram = np.zeros(len(j), dtype=np.int64)
        for m in range(k):  # the k-gram val[j-k+1 .. j], clipped where the window is shorter
            gram = gram * V + val[np.maximum(j - k + 1 + m, 0)]
        p = np.where(use, level.prob(gram, p, V), p)
    return float(-np.mean(np.log(p)))


OPTIONS = dict(max_order=0,  # highest n-gram order: 0 = 5 for bytes (vocab 256), 2 for GPT-2 ids
               json='')      # also write the floors here


def main(argv=sys.argv[1:]):
    defaults = {**train_defaults(), **OPTIONS}
    try:
        c = load_config(defaults, argv, sources=[__file__])
    except ConfigError as e:
        die(e)
    path = os.path.join(c['data_dir'], c['dataset'])
    try:
        with open(os.path.join(path, 'meta.json')) as f:
            meta = json.load(f)
        train = np.memmap(os.path.join(path, 'train.bin'), dtype=np.uint16, mode='r')
        val = np.memmap(os.path.join(path, 'val.bin'), dtype=np.uint16, mode='r')
    except (OSError, ValueError) as e:
        die(f"cannot read {path} ({getattr(e, 'strerror', None) or e}): run prepare.py first")
    V, T = meta['vocab_size'], c['context_size']
    if c['max_order'] < 0:
        die(f"max_order must be >= 0 (0: the default for the vocabulary), got {c['max_order']}")
    n_max = c['max_order'] or (5 if V <= 256 else 2)
    if V ** (n_max + 1) >= 2 ** 62:
        die(f"max_order {n_max} is too high for a vocabulary of {V}: its keys overflow int64")
    if c['train_tokens'] > len(train):
        die(f"train_tokens ({c['train_tokens']:,}) is more than {path}/train.bin holds")
    train = train[:c['train_tokens'] or None]
    floors = {}
    for n in range(1, n_max + 1):
        floors[str(n)] = round(floor(train, val, V, n, T), 4)
        print(f"{n}-gram: {floors[str(n)]:.4f}", file=sys.stderr, flush=True)
    from rundir import provenance  # imports torch: only when done
    result = {'dataset': c['dataset'], 'tokenizer': meta.get('tokenizer'), 'vocab_size': V,
              'train_tokens': len(train), 'all_of_train': not c['train_tokens'], 'context_size': T,
              'val_tokens_scored': len(val_targets(val, T)[0]), 'method': METHOD,
              'floors': floors, **provenance()}
    print(floors_line(result))
    if c['json']:
        try:
            with open(f"{c['json']}.tmp", 'w') as f:
                json.dump(result, f, indent=2)
            os.replace(f"{c['json']}.tmp", c['json'])
        except OSError as e:
            die(f"cannot write {c['json']}: {e.strerror}")


def floors_line(r):
    """The floors as one markdown line, as report.py prints them under a table."""
    grams = ", ".join(f"{n}-gram {v:.3f}" for n, v in r['floors'].items())
    kind = {'gpt2': 'GPT-2 tokens', 'bytes': 'bytes'}.get(r['tokenizer'], 'tokens')
    which = 'all' if r.get('all_of_train') else 'the first'
    return (f"Count-model floors (interpolated Kneser-Ney, experiments/floors.py) from {which} "
            f"{r['train_tokens']:,} {kind} of train.bin, on all of val.bin: {grams}.")


if __name__ == "__main__":
    main()
