"""experiments/floors.py against a brute-force count of the same models on tiny texts: tuples in
dicts, every formula of docs/data.md (Count-model floors) written out once more."""
import json
import math
import os
import subprocess
import sys
from collections import Counter, defaultdict

import numpy as np
import pytest

from conftest import ROOT
import floors


def brute_model(train, n, V, modified):
    """P(w | hist) of the order-n interpolated (or modified) Kneser-Ney model of train, hist its
    last n - 1 tokens or fewer (then the order len(hist) + 1 model, as near a window's start)."""
    train = [int(t) for t in train]
    levels = {}
    for k in range(1, n + 1):
        for top in (True, False) if k < n else (True,):
            if top:  # raw counts
                c = Counter(tuple(train[i:i + k]) for i in range(len(train) - k + 1))
            else:  # continuation counts: distinct (k+1)-grams' last k tokens
                c = Counter(g[1:] for g in {tuple(train[i:i + k + 1])
                                            for i in range(len(train) - k)})
            nr = [sum(1 for v in c.values() if v == r) for r in range(5)]
            Y = nr[1] / (nr[1] + 2 * nr[2]) if nr[1] else 0.5
            D = [0, Y, Y, Y]
            if modified:
                D = [0] + [r - (r + 1) * Y * nr[r + 1] / nr[r] if nr[r] else Y for r in (1, 2, 3)]
                if not all(0 < D[r] <= r for r in (1, 2, 3)):  # out of range: KenLM's fallback
                    D = [0, 0.5, 1.0, 1.5]
            total, gamma = defaultdict(float), defaultdict(float)
            for g, v in c.items():
                total[g[:-1]] += v
                gamma[g[:-1]] += D[min(v, 3)]
            levels[k, top] = c, D, total, gamma

    def p(w, hist):
        hist, prob = tuple(int(t) for t in hist), 1 / V
        for k in range(1, min(n, len(hist) + 1) + 1):
            c, D, total, gamma = levels[k, k == n]
            h = hist[len(hist) - k + 1:] if k > 1 else ()
            if total[h] > 0:
                v = c.get(h + (int(w),), 0)
                prob = (v - D[min(v, 3)] + gamma[h] * prob) / total[h]
        return prob
    return p


def brute_floor(train, val, n, V, T, modified):
    p, logs = brute_model(train, n, V, modified), []
    for s in range(0, (len(val) - 1) // T * T, T):  # windows of T + 1 tokens, as train.py's
        for t in range(1, T + 1):
            logs.append(-math.log(p(val[s + t], val[max(s, s + t - n + 1):s + t])))
    return sum(logs) / len(logs)


def words(seed, size):
    """Random words as bytes: long n-grams repeat, so high orders have counts above 1."""
    rng = np.random.default_rng(seed)
    w = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "its", "mat,"]
    return np.frombuffer(" ".join(rng.choice(w, size=size)).encode(), np.uint8).astype(np.int64)


@pytest.fixture(scope="module")
def text():
    return words(0, 200)


@pytest.mark.parametrize("modified", [False, True])
def test_floors_equal_a_brute_force_count_past_the_int64_keys(text, modified):
    # V = 256: V^(n+1) >= 2^62 from n = 7 on, where keys of sum x[i+m] V^(k-1-m) overflowed
    train, val = text[:600], text[600:721]  # 120 targets: windows of 12, a short last one cut
    V, T, n = 256, 12, 9
    got = floors.floors(train, val, V, n, T)['mkn' if modified else 'kn']
    want = [brute_floor(train, val, k, V, T, modified) for k in range(1, n + 1)]
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9)
    assert got[4] < got[1]  # the text repeats: longer histories help


@pytest.mark.parametrize("modified", [False, True])
def test_floors_of_a_large_vocabulary(modified):
    # GPT-2's vocabulary: V^(n+1) >= 2^62 from n = 3 on; ids spread over all of it
    V = 50257
    ids = np.random.default_rng(3).choice(V, 40, replace=False)
    x = ids[words(1, 120) % 40]
    train, val = x[:350], x[350:430]
    got = floors.floors(train, val, V, 5, 16)['mkn' if modified else 'kn']
    assert got == pytest.approx([brute_floor(train, val, k, V, 16, modified)
                                 for k in range(1, 6)], rel=1e-9, abs=1e-9)


def test_modified_kneser_ney_uses_three_discounts(text):
    train = text[:600]
    counts = np.unique(train[:-2] * 65536 + train[1:-1] * 256 + train[2:], return_counts=True)[1]
    n = [np.sum(counts == r) for r in range(5)]
    Y = n[1] / (n[1] + 2 * n[2])
    kn, mkn = floors.discounts(counts, False), floors.discounts(counts, True)
    assert list(kn) == pytest.approx([0, Y, Y, Y])
    assert list(mkn) == pytest.approx([0, 1 - 2 * Y * n[2] / n[1], 2 - 3 * Y * n[3] / n[2],
                                       3 - 4 * Y * n[4] / n[3]])
    assert len(set(mkn[1:])) == 3


def test_modified_kneser_ney_is_never_infinite(text):
    """A discount estimated at or below 0 once left a history no back-off mass: in "ababababc" the
    bigram ab counts 4, ba 3, bc 1 (n1..n4 = 1, 0, 1, 1), so D3+ = 3 - 4 * 1 * 1 / 1 = -1, and "a",
    seen only before b (4 times), gave an unseen "c" probability 0: the floor was inf. Such an
    order takes 0.5, 1, 1.5 (KenLM's fallback) and every seen history keeps mass."""
    train = np.frombuffer(b"ababababc", np.uint8).astype(np.int64)
    val = np.frombuffer(b"acabc", np.uint8).astype(np.int64)
    counts = np.unique(train[:-1] * 256 + train[1:], return_counts=True)[1]
    assert list(floors.discounts(counts, True)) == [0, 0.5, 1.0, 1.5]
    got = floors.floors(train, val, 256, 2, 4)['mkn']
    assert all(math.isfinite(v) for v in got)
    assert got == pytest.approx([brute_floor(train, val, k, 256, 4, True) for k in (1, 2)],
                                rel=1e-9)
    for x, n in ((train, 2), (text[:600], 9)):  # every order, raw and continuation counts
        grams = floors.Grams(x, n, 256)
        for k in range(1, n + 1):
            for top in (True, False) if k < n else (True,):
                level = grams.level(k, top, True)
                assert (level.gamma[level.total > 0] > 0).all()
                seen, D = level.counts > 0, level.discount
                assert ((D[seen] > 0) & (D[seen] <= np.minimum(level.counts[seen], 3))).all()


@pytest.mark.parametrize("modified", [False, True])
def test_kneser_ney_sums_to_one_over_the_vocabulary(text, modified):
    train, V = text[:600], 256
    for n, hist in [(1, []), (3, [116, 104]), (5, [32, 99, 97, 116]), (8, list(text[:7])),
                    (8, [7, 7, 7, 7, 7, 7, 7])]:
        p = brute_model(train, n, V, modified)
        assert sum(p(w, hist) for w in range(V)) == pytest.approx(1, abs=1e-12)
    grams = floors.Grams(train, 8, V)  # the sampler's distribution: the brute force's, summing to 1
    for x in (list(text[:9]), list(text[:3]), [7, 7, 7, 7, 7, 7, 7, 7]):
        p, want = floors.next_probs(grams, x, 8), brute_model(train, 8, V, False)
        assert p.sum() == pytest.approx(1, abs=1e-12)
        assert p == pytest.approx([want(w, x[-7:]) for w in range(V)], rel=1e-9, abs=1e-15)


def test_more_context_and_more_data_lower_the_floor(text):
    big = np.tile(text, 4)
    a = floors.floors(big[:2400], big[2400:], 256, 3, 16)['kn']
    assert a[0] > a[1] > a[2]
    small = floors.floors(big[:300], big[2400:], 256, 3, 16)['kn']
    assert small[2] > a[2]


def test_sample_is_seeded_and_follows_the_counts(text):
    x = floors.sample(text, 256, 6, b"the ", 80, seed=5)
    assert x == floors.sample(text, 256, 6, b"the ", 80, seed=5) and len(x) == 84
    assert x != floors.sample(text, 256, 6, b"the ", 80, seed=6)
    said = bytes(x).decode(errors="replace").split()[:-1]  # the last word may be cut
    known = set(bytes(list(text)).decode().split())
    assert sum(w in known for w in said) >= 0.8 * len(said) > 8  # words of the text, mostly


def run_floors(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "floors.py"), *args],
                          capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS='1'))


def test_command_writes_the_floors_of_a_prepared_dataset(tmp_path):
    d = tmp_path / "data" / "tiny"
    d.mkdir(parents=True)
    rng = np.random.default_rng(1)
    rng.integers(0, 50, 5000).astype(np.uint16).tofile(d / "train.bin")
    rng.integers(0, 50, 700).astype(np.uint16).tofile(d / "val.bin")
    (d / "meta.json").write_text(json.dumps({"vocab_size": 256, "tokenizer": "bytes"}))
    out = tmp_path / "f.json"
    r = run_floors(f"--data_dir={tmp_path / 'data'}", "--dataset=tiny", "--train_tokens=4000",
                   "--context_size=64", f"--json={out}")
    assert r.returncode == 0, r.stderr
    got = json.loads(out.read_text())
    train = np.fromfile(d / "train.bin", dtype=np.uint16)[:4000]
    val = np.fromfile(d / "val.bin", dtype=np.uint16)
    assert got["train_tokens"] == 4000 and got["val_tokens_scored"] == 699 // 64 * 64
    want = floors.floors(train, val, 256, 8, 64)  # order 8: the default for bytes
    assert got["floors"] == {str(n): round(v, 4) for n, v in enumerate(want['kn'], 1)}
    assert got["floors_mkn"] == {str(n): round(v, 4) for n, v in enumerate(want['mkn'], 1)}
    assert "modified Kneser-Ney" in got["method_mkn"]
    assert r.stdout == (f"Count-model floors (experiments/floors.py) from the first 4,000 bytes of "
                        f"train.bin, on all of val.bin: interpolated Kneser-Ney "
                        + ", ".join(f"{n}-gram {v:.3f}" for n, v in got["floors"].items())
                        + f"; modified Kneser-Ney 8-gram {got['floors_mkn']['8']:.3f}.\n")
    assert "commit" in got and "/tmp" not in json.dumps(got)
    r = run_floors(f"--data_dir={tmp_path / 'data'}", "--dataset=tiny", "--sample=20",
                   "--start=ab", "--max_order=3")
    assert r.returncode == 0 and r.stdout.startswith("ab") and len(r.stdout) >= 22
    r = run_floors(f"--data_dir={tmp_path / 'data'}", "--dataset=nothing")
    assert r.returncode == 1 and r.stderr.startswith("error: cannot read") and \
        len(r.stderr.splitlines()) == 1
    r = run_floors(f"--data_dir={tmp_path / 'data'}", "--dataset=tiny", "--max_order=-1")
    assert r.returncode == 1 and r.stderr == "error: max_order must be >= 0 (0: the default " \
        "for the vocabulary), got -1\n"
    r = run_floors(f"--data_dir={tmp_path / 'data'}", "--dataset=tiny", "--sample=-5")
    assert r.returncode == 1 and r.stderr.startswith("error: sample must be >= 0") and \
        len(r.stderr.splitlines()) == 1


def test_help_lists_only_the_keys_it_reads_and_a_run_config_still_loads():
    r = run_floors("--help")
    keys = [line.split()[0] for line in r.stdout.split("Keys and their defaults")[1].splitlines()
            if line.startswith("  ")]
    assert r.returncode == 0 and keys == ["dataset", "data_dir", "train_tokens", "context_size",
                                          "max_order", "json", "sample", "start", "seed"]
    assert "# where prepare.py wrote the data" in r.stdout and "n_embed" not in r.stdout
    # a run's config sets train.py's other keys too: read, not refused
    r = run_floors(os.path.join(ROOT, "config", "bytes_baseline.py"), "--data_dir=/nonexistent")
    assert r.returncode == 1 and r.stderr.startswith("error: cannot read /nonexistent/")
    r = run_floors("--n_embedd=3")
    assert r.returncode == 1 and "unknown config key 'n_embedd'" in r.stderr
