r"""
Count-model floors: the val loss of n-gram models counted from the training tokens a run sees,
scored on the tokens train.py scores on all of val.bin. A transformer above a floor has learned
less from its data than counting does.

$ python experiments/floors.py config/bytes_baseline.py    # a run's dataset, slice and context
$ python experiments/floors.py --dataset=wikipedia --train_tokens=100000 --context_size=128 \
      --max_order=4 --json=experiments/data_constrained_floors.json
$ python experiments/floors.py config/bytes_baseline.py --sample=200 --start="The history of"

The models (docs/data.md, Count-model floors, gives the formulas): interpolated Kneser-Ney with one
discount per order (the JSON's 'floors') and modified Kneser-Ney with three ('floors_mkn'). The
scored tokens are train.py's whole-val ones: val.bin in consecutive windows of context_size + 1
tokens, every token but a window's first predicted from the tokens before it in its window, so near
a window's start a model has the shorter history the transformer has. --sample prints bytes drawn
from the top order's interpolated Kneser-Ney model instead. Uses numpy only.
"""
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # configurator.py, when run as python experiments/floors.py
from configurator import ConfigError, die, load_config  # noqa: E402
from report import train_defaults  # noqa: E402

METHOD = "interpolated Kneser-Ney, discount n1 / (n1 + 2 n2) per order, uniform below unigrams"
METHOD_MKN = ("modified Kneser-Ney, discounts D1, D2, D3+ per order from n1..n4 (Chen and Goodman "
              "1998; out of (0, r]: 0.5, 1, 1.5 for the order), uniform below unigrams")


class Grams:
    """The k-grams of the training tokens, k = 1..n, each named by an exact integer id: the rank of
    its key (id of its first k - 1 tokens) * V + its last token among the training k-grams' keys.
    Keys stay below V times the number of distinct (k-1)-grams at any order, and are exact: the
    integers sum x[i+m] V^(k-1-m) overflow int64 from V^k >= 2^63 (bytes: k = 8)."""

    def __init__(self, train, n, V):
        self.V, self.keys = V, [np.zeros(1, np.int64)]  # order 0: the empty history, id 0
        self.ids = [np.zeros(len(train) + 1, np.int64)]
        for k in range(1, n + 1):  # ids[k][i]: the id of train[i:i+k]; keys[k]: sorted, by id
            keys, ids = np.unique(self.ids[k - 1][:-1] * V + train[k - 1:], return_inverse=True)
            self.keys.append(keys)
            self.ids.append(ids.reshape(-1))
        self.levels = {}

    def find(self, prev, last, k):
        """The ids of the k-grams made of the (k-1)-grams `prev` (ids; -1: not in train) and the
        tokens `last`; -1 where that k-gram is not in train."""
        key, keys = prev * self.V + last, self.keys[k]
        i = np.minimum(np.searchsorted(keys, key), len(keys) - 1)
        return np.where((prev >= 0) & (keys[i] == key), i, -1)

    def level(self, k, top, modified):
        if (k, top, modified) not in self.levels:
            if top:  # raw counts
                counts = np.bincount(self.ids[k], minlength=len(self.keys[k]))
            else:  # continuation counts: the number of distinct (k+1)-grams ending in the k-gram
                tail = np.zeros(len(self.keys[k + 1]), np.int64)
                tail[self.ids[k + 1]] = self.ids[k][1:]  # any occurrence: all have the same tail
                counts = np.bincount(tail, minlength=len(self.keys[k]))
            self.levels[k, top, modified] = Level(counts, self.keys[k] // self.V,
                                                  len(self.keys[k - 1]), modified)
        return self.levels[k, top, modified]


FALLBACK = (0.5, 1.0, 1.5)  # D1, D2, D3+ of an order whose estimates are out of range (KenLM's)


def discounts(counts, modified):
    """The discount of a count of 0, 1, 2 and 3 or more: from n_r, the number of k-grams whose count
    is r. Interpolated Kneser-Ney: D = Y = n1 / (n1 + 2 n2) for all; modified: D_r = r - (r + 1) Y
    n_(r+1) / n_r (Chen and Goodman; Y where n_r is 0), or FALLBACK for the order."""
    n = [np.sum(counts == r) for r in range(5)]
    Y = n[1] / (n[1] + 2 * n[2]) if n[1] else 0.5
    if not modified:
        return np.array([0, Y, Y, Y])
    D = [r - (r + 1) * Y * n[r + 1] / n[r] if n[r] else Y for r in (1, 2, 3)]
    # sparse counts of counts (GPT-2 ids past order 4) can put an estimate at or below 0: clipped to
    # 0, a history whose continuations all had that count kept no back-off mass and an unseen token
    # after it scored log 0 = inf. As KenLM's lmplz (--discount_fallback) does, such an order takes
    # FALLBACK instead: each D_r in (0, r], so every seen history keeps mass for the tokens it lacks
    if not all(0 < d <= r for r, d in zip((1, 2, 3), D)):
        D = FALLBACK
    return np.array([0, *D])


class Level:
    """Order k: the counts c(hw) of its k-grams (by id), each one's discount D(c(hw)), and per
    history h (a (k-1)-gram id) c(h) = sum_w c(hw) and gamma(h) = sum_w D(c(hw))."""

    def __init__(self, counts, hist, n_hists, modified):
        self.counts = counts
        self.discount = discounts(counts, modified)[np.minimum(counts, 3)]
        self.total = np.bincount(hist, weights=counts, minlength=n_hists)
        self.gamma = np.bincount(hist, weights=self.discount, minlength=n_hists)

    def prob(self, hist, gram, lower):
        """P_k(w | h) for histories `hist` and k-grams `gram` (ids; -1: not in train), given
        P_(k-1)(w | h') of the same targets: an unseen history passes P_(k-1) on."""
        total = np.where(hist >= 0, self.total[hist], 0)
        count = np.where(gram >= 0, self.counts[gram] - self.discount[gram], 0)
        p = (count + self.gamma[hist] * lower) / np.where(total > 0, total, 1)
        return np.where(total > 0, p, lower)


def val_targets(val, context_size):
    """(x, order): the tokens train.py's whole-val loss predicts, each with how many tokens its
    window holds up to and including it (its history plus itself)."""
    n = (len(val) - 1) // context_size
    j = np.arange(1, n * context_size + 1)  # targets val[1 : n * T + 1]
    return j, j - (j - 1) // context_size * context_size + 1


def floors(train, val, V, n, context_size):
    """{'kn': [...], 'mkn': [...]}: the mean cross-entropy (nats) on val of the order 1..n models
    counted from train, interpolated and modified Kneser-Ney."""
    train, val = train.astype(np.int64), val.astype(np.int64)
    grams = Grams(train, n, V)
    ids = [np.zeros(len(val) + 1, np.int64)]  # ids[k][i]: the id of val[i:i+k], -1: not in train
    for k in range(1, n + 1):
        ids.append(grams.find(ids[k - 1][:-1], val[k - 1:], k))
    j, have = val_targets(val, context_size)
    out = {}
    for method in ('kn', 'mkn'):
        lower, out[method] = np.full(len(j), 1.0 / V), []
        for k in range(1, n + 1):
            use = np.nonzero(have >= k)[0]  # a history of k - 1 tokens in the window
            at = j[use] - k + 1  # where the k-gram val[j-k+1 .. j] starts
            for top in (True, False) if k < n else (True,):  # order k's model; k+1's lower
                p = lower.copy()
                p[use] = grams.level(k, top, method == 'mkn').prob(ids[k - 1][at], ids[k][at],
                                                                   lower[use])
                if top:
                    out[method].append(float(-np.mean(np.log(p))))
                else:
                    lower = p
    return out


def next_probs(grams, x, n):
    """P(w | x) for every token w: the order-n model's, or order len(x) + 1's if x is shorter."""
    p = np.full(grams.V, 1.0 / grams.V)
    for k in range(1, min(n, len(x) + 1) + 1):
        h = np.zeros(1, np.int64)  # the id of the k - 1 tokens before, token by token
        for i, t in enumerate(x[len(x) - k + 1:] if k > 1 else []):
            h = grams.find(h, t, i + 1)
        p = grams.level(k, k == n, False).prob(h, grams.find(h, np.arange(grams.V), k), p)
    return p


def sample(train, V, n, start, length, seed):
    """start, then `length` tokens drawn one by one from the order-n interpolated Kneser-Ney model
    of train, given the n - 1 tokens before each."""
    grams, rng, x = Grams(train.astype(np.int64), n, V), np.random.default_rng(seed), list(start)
    for _ in range(length):
        p = next_probs(grams, x, n)
        x.append(int(rng.choice(V, p=p / p.sum())))  # p sums to 1 but for rounding
    return x


READS = ('dataset', 'data_dir', 'train_tokens', 'context_size')  # of train.py's keys
OPTIONS = dict(
    max_order=0,  # highest n-gram order: 0 = 8 for bytes (vocab 256), 2 for GPT-2 ids
    json='',      # also write the floors here
    sample=0,     # print this many bytes from the max_order model instead of the floors
    start='The history of',  # --sample's prompt
    seed=1337,    # --sample's random draws
)


def main(argv=sys.argv[1:]):
    defaults = {**train_defaults(), **OPTIONS}  # a run's config file sets all of train.py's keys
    try:  # --help: only the keys read here
        c = load_config(defaults, argv, shown=(*READS, *OPTIONS), sources=[
            __file__, os.path.join(ROOT, 'train.py'), os.path.join(ROOT, 'model.py')])
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
    if c['sample'] < 0:
        die(f"sample must be >= 0 (0: the floors, not a sample), got {c['sample']}")
    n_max = c['max_order'] or (8 if V <= 256 else 2)
    if c['train_tokens'] > len(train):
        die(f"train_tokens ({c['train_tokens']:,}) is more than {path}/train.bin holds")
    train = train[:c['train_tokens'] or None]
    if c['sample']:
        if meta.get('tokenizer') != 'bytes':
            die(f"--sample is for byte datasets; {c['dataset']} is {meta.get('tokenizer')} tokens")
        x = sample(train, V, n_max, c['start'].encode(), c['sample'], c['seed'])
        print(bytes(x).decode(errors='replace'))
        return
    res = floors(train, val, V, n_max, T)
    floors_kn, floors_mkn = ({str(n): round(v, 4) for n, v in enumerate(res[m], 1)} for m in res)
    from rundir import provenance  # imports torch: only when done
    result = {'dataset': c['dataset'], 'tokenizer': meta.get('tokenizer'), 'vocab_size': V,
              'train_tokens': len(train), 'all_of_train': not c['train_tokens'], 'context_size': T,
              'val_tokens_scored': len(val_targets(val, T)[0]), 'method': METHOD,
              'floors': floors_kn, 'method_mkn': METHOD_MKN, 'floors_mkn': floors_mkn,
              **provenance()}
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
    if 'floors_mkn' not in r:  # a JSON from before modified Kneser-Ney
        return (f"Count-model floors (interpolated Kneser-Ney, experiments/floors.py) from {which} "
                f"{r['train_tokens']:,} {kind} of train.bin, on all of val.bin: {grams}.")
    n, v = list(r['floors_mkn'].items())[-1]
    return (f"Count-model floors (experiments/floors.py) from {which} {r['train_tokens']:,} {kind} "
            f"of train.bin, on all of val.bin: interpolated Kneser-Ney {grams}; modified "
            f"Kneser-Ney {n}-gram {v:.3f}.")


if __name__ == "__main__":
    main()
