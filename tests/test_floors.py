"""experiments/floors.py against a brute-force count of the same models on a tiny text."""
import itertools
import json
import math
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from conftest import ROOT
import floors


def kn_prob(train, n, V, w, hist):
    """P(w | hist) of the order-n interpolated Kneser-Ney model, by counting tuples directly."""
    grams = lambda k: Counter(tuple(train[i:i + k]) for i in range(len(train) - k + 1))

    def counts(k):  # raw counts at the top order, else continuation counts
        if k == n:
            return grams(k)
        return Counter(g[1:] for g in grams(k + 1))  # Counter over distinct (k+1)-grams' tails

    def p(k, hist):
        if k == 0:
            return 1 / V
        c = counts(k)
        h = tuple(hist[len(hist) - k + 1:]) if k > 1 else ()
        n1 = sum(1 for v in c.values() if v == 1)
        n2 = sum(1 for v in c.values() if v == 2)
        D = n1 / (n1 + 2 * n2) if n1 else 0.5
        total = sum(v for g, v in c.items() if g[:-1] == h)
        types = sum(1 for g in c if g[:-1] == h)
        lower = p(k - 1, hist)
        if total == 0:
            return lower
        return (max(c[h + (w,)] - D, 0) + D * types * lower) / total

    return p(min(n, len(hist) + 1), hist)


def brute_floor(train, val, n, V, T):
    logs = []
    for s in range(0, (len(val) - 1) // T * T, T):  # windows of T + 1 tokens, as train.py's
        for t in range(1, T + 1):
            hist = val[s:s + t]
            logs.append(-math.log(kn_prob(train, n, V, val[s + t], hist[-(n - 1):] if n > 1
                                          else [])))
    return sum(logs) / len(logs)


@pytest.fixture(scope="module")
def text():
    rng = np.random.default_rng(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran"]
    s = " ".join(rng.choice(words, size=120))
    return np.frombuffer(s.encode(), dtype=np.uint8).astype(np.int64)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_floor_equals_a_brute_force_count(text, n):
    train, val = text[:400], text[400:471]  # 70 targets: windows of 8 with a short last one cut
    V, T = 256, 8
    got = floors.floor(train, val, V, n, T)
    assert got == pytest.approx(brute_floor(list(train), list(val), n, V, T), rel=1e-12)


def test_kneser_ney_sums_to_one_over_the_vocabulary(text):
    train, V = list(text[:400]), 256
    for n, hist in itertools.product([1, 2, 3], [[116, 104], [32, 99], [7, 7]]):
        assert sum(kn_prob(train, n, V, w, hist) for w in range(V)) == pytest.approx(1, abs=1e-12)
    # the vectorized model too: every next token after one history
    hist = np.array([32, 116, 104], dtype=np.int64)
    rows = np.stack([np.concatenate([hist, [w]]) for w in range(V)])
    for n in (1, 2, 3, 4):
        total = sum(math.exp(-floors.floor(np.array(train), r, V, n, 3) * 3) /
                    math.exp(-floors.floor(np.array(train), r[:3], V, n, 2) * 2) for r in rows)
        assert total == pytest.approx(1, abs=1e-9)


def test_more_context_and_more_data_lower_the_floor(text):
    big = np.tile(text, 4)
    a = [floors.floor(big[:1600], big[1600:], 256, n, 16) for n in (1, 2, 3)]
    assert a[0] > a[1] > a[2]


def test_command_writes_the_floors_of_a_prepared_dataset(tmp_path):
    d = tmp_path / "data" / "tiny"
    d.mkdir(parents=True)
    rng = np.random.default_rng(1)
    rng.integers(0, 50, 5000).astype(np.uint16).tofile(d / "train.bin")
    rng.integers(0, 50, 700).astype(np.uint16).tofile(d / "val.bin")
    (d / "meta.json").write_text(json.dumps({"vocab_size": 256, "tokenizer": "bytes"}))
    out = tmp_path / "f.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "floors.py"),
                        f"--data_dir={tmp_path / 'data'}", "--dataset=tiny", "--train_tokens=4000",
                        "--context_size=64", "--max_order=3", f"--json={out}"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = json.loads(out.read_text())
    train = np.fromfile(d / "train.bin", dtype=np.uint16)[:4000]
    val = np.fromfile(d / "val.bin", dtype=np.uint16)
    assert got["train_tokens"] == 4000 and got["val_tokens_scored"] == 699 // 64 * 64
    assert got["floors"] == {str(n): round(floors.floor(train, val, 256, n, 64), 4)
                             for n in (1, 2, 3)}
    assert "1-gram" in r.stdout and "the first 4,000 bytes of train.bin" in r.stdout
    assert "commit" in got and "/tmp" not in json.dumps(got)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "floors.py"),
                        f"--data_dir={tmp_path / 'data'}", "--dataset=nothing"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.startswith("error: cannot read") and \
        len(r.stderr.splitlines()) == 1
    r = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "floors.py"),
                        f"--data_dir={tmp_path / 'data'}", "--dataset=tiny", "--max_order=-1"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr == "error: max_order must be >= 0 (0: the default " \
        "for the vocabulary), got -1\n"
