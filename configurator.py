"""
The one config parser shared by train.py, sample.py, bench.py, prepare.py and report.py.

    python train.py config/aed_mse_possub.py --batch_size=32 --lr=6e-4
    python bench.py --quick          # a boolean key alone means True (--no-quick: False)
    python train.py --help           # every key, its default and the comment beside it in the source

Each script keeps its defaults as plain variables at the top and calls
load_config(defaults, sys.argv[1:]). Positional arguments are config files:
plain Python, executed into a fresh namespace (not into the caller's globals);
every name a file defines must be a known key. A config file may start from
another with include('other.py') (a path relative to the including file):
the other file's keys are set at that point, and later lines override them.
`--key=value` arguments come after (or between) config files and win, in
order. Values are parsed with ast.literal_eval and fall back to the raw
string, so `--out_dir=out-aed`, `--lr=3e-4`, `--compile=False`,
`--cross_attn_n_head=None` and `--start=a=b` all work (the split is on the
first '='). `-h` or `--help` prints the script's docstring and every key,
then exits 0.

Types are checked against the default: an int is accepted where a float is
expected (and converted); a None default accepts None, bool, int, float or
str (ModelConfig validates those fields itself). Any mistake raises
ConfigError with a one-line message naming the nearest valid key; the scripts
turn it into `error: ...` on stderr and exit status 1 with die().
"""
import ast
import difflib
import io
import os
import re
import sys
import tokenize
import types

NONE_OK = (type(None), bool, int, float, str)


class ConfigError(Exception):
    pass


def die(msg, status=1):
    """Bad input or a failed run: one line on stderr, exit status 1 (or status), no traceback. Under torchrun
    every rank exits, but only rank 0 prints: the errors are the same on all ranks."""
    if int(os.environ.get('RANK', 0)) == 0:
        print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(status)


def first_line(e):
    """An exception as one line: its type and the first line of its message."""
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0] if s else ''}"


def nearest_key(key, keys):
    # always name one key: the closest by difflib's ratio, however far
    match = difflib.get_close_matches(key, list(keys), n=1, cutoff=0.0)
    return match[0] if match else None


def unknown_key_error(key, keys, where):
    near = nearest_key(key, keys)
    hint = f" (did you mean '{near}'?)" if near else ""
    return ConfigError(f"unknown config key '{key}' {where}{hint}")


def check_type(key, value, default, where):
    """Return value converted to the default's type, or raise ConfigError."""
    if default is None:
        if isinstance(value, NONE_OK):
            return value
        raise ConfigError(f"{key} {where}: expected None, bool, int, float or str, got {type(value).__name__} {value!r}")
    want = type(default)
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)  # ints are fine for floats: lr=1 means 1.0
    if want is int and isinstance(value, bool):
        pass  # bool is a subclass of int in Python; `--batch_size=True` is a mistake
    elif isinstance(value, want):
        return value
    raise ConfigError(f"{key} {where}: expected {want.__name__}, got {type(value).__name__} {value!r}")


def parse_value(raw, default):
    """Turn the text after '--key=' into a Python value."""
    if isinstance(default, str):
        # a str key keeps the text as typed, so --out_dir=2024 stays '2024',
        # but a quoted literal ('--start="hi"') is still unquoted
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return raw
        return value if isinstance(value, str) else raw
    if isinstance(default, bool) and raw.lower() in ("true", "false"):
        return raw.lower() == "true"  # accept --compile=false as well as False
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return raw  # e.g. --detach_type=ENCODER_OUT for a None default


MAX_INCLUDE_DEPTH = 8


def read_config_file(path, defaults, depth=0):
    """Execute a config file in a fresh namespace; return {key: value} it set, type-checked against defaults.
    The file may call include('other.py'), which sets other.py's keys (relative to this file's folder) there."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    with open(path, encoding="utf-8") as f:
        source = f.read()

    def include(name):
        other = os.path.join(os.path.dirname(path), name)
        if not os.path.isfile(other):
            raise ConfigError(f"{path}: include({name!r}): config file not found: {other}")
        if depth >= MAX_INCLUDE_DEPTH:
            raise ConfigError(f"{path}: include({name!r}): includes nested more than {MAX_INCLUDE_DEPTH} deep "
                              f"(does a file include itself?)")
        namespace.update(read_config_file(other, defaults, depth + 1))

    namespace = {"include": include}
    try:
        exec(compile(source, path, "exec"), namespace)
    except ConfigError:
        raise  # from an include: it names its file already
    except SyntaxError as e:
        raise ConfigError(f"{path}:{e.lineno}: syntax error: {e.msg}") from None
    except Exception as e:  # a config file that raises is bad input, not a crash
        raise ConfigError(f"{path}: {type(e).__name__}: {e}") from None
    values = {}
    for name, value in namespace.items():
        # skip dunders (exec adds __builtins__), _private helpers, imported modules and include itself
        if name.startswith("_") or isinstance(value, types.ModuleType) or value is include:
            continue
        if name not in defaults:
            raise unknown_key_error(name, defaults, f"in {path}")
        values[name] = check_type(name, value, defaults[name], f"in {path}")
    return values


def load_config(defaults, argv, base=None, sources=None):
    """Apply config files and --key=value overrides in argv, in order, to a copy of
    base (default: defaults). Types are checked against defaults. With -h or --help in
    argv, print help_text(defaults, sources) and exit 0; sources are the files whose
    comments describe the keys (default: the running script)."""
    if "-h" in argv or "--help" in argv:
        if int(os.environ.get("RANK", 0)) == 0:
            print(help_text(defaults, sources or [sys.modules["__main__"].__file__]), flush=True)
        sys.exit(0)
    config = dict(defaults if base is None else base)
    for arg in argv:
        if arg.startswith("--"):
            key, eq, raw = arg[2:].partition("=")
            key = key.replace("-", "_")  # --batch-size=8 works too
            if not eq and isinstance(defaults.get(key), bool):
                config[key] = True  # a boolean key alone: --quick means --quick=True
                continue
            if not eq and key.startswith("no_") and isinstance(defaults.get(key[3:]), bool):
                config[key[3:]] = False  # --no-quick means --quick=False
                continue
            if key not in defaults:
                raise unknown_key_error(key, defaults, "on the command line")
            if not eq:
                raise ConfigError(f"expected --{key}=value, got '{arg}' (only a boolean key can stand alone)")
            value = parse_value(raw, defaults[key])
            config[key] = check_type(key, value, defaults[key], f"(from {arg})")
        else:
            config.update(read_config_file(arg, defaults))
    return config


def key_comments(path):
    """{name: comment} from the lines `name = value  # comment` of a Python file (also `name: type = value`
    and `name=value,  # comment` inside a call): the first such line of each name."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    lines = source.splitlines()
    comments = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):  # real comments: not a '#' in a string
        if tok.type == tokenize.COMMENT:
            m = re.match(r"\s*(\w+)\s*(:[^=]*)?=(?!=)", lines[tok.start[0] - 1])
            if m and m.group(1) not in comments:
                comments[m.group(1)] = tok.string.lstrip("#").strip()
    return comments


def help_text(defaults, sources):
    """The first source's docstring (as written), then every key with its default and the comment beside it
    in sources."""
    with open(sources[0], encoding="utf-8") as f:
        source = f.read()
    body = ast.parse(source).body
    doc = ""
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        doc = ast.get_source_segment(source, body[0]).strip("\"'rRuU")  # the raw text: keeps its \ continuations
    comments = {}
    for path in reversed(sources):  # where two sources describe a key, the first wins
        comments.update(key_comments(path))
    lines = [doc.strip("\n"), "", "Keys and their defaults (--key=value; a boolean key alone means True, --no-key False):"]
    for key, value in defaults.items():
        line = f"  {key} = {value!r}"
        lines.append(f"{line:36s}  # {comments[key]}" if key in comments else line)
    return "\n".join(lines)
def check_device(device):
    """The device names train.py and sample.py take: raise ConfigError for anything else."""
    if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", device):
        raise ConfigError(f"device must be auto, cpu, cuda, cuda:N or mps, got {device!r}")


def collect_defaults(namespace):
    """The config keys of a script: its public module-level int/float/bool/str/None variables.
    Call as collect_defaults(globals()) right after the defaults block."""
    return {k: v for k, v in namespace.items()
            if not k.startswith("_") and isinstance(v, NONE_OK)}
