"""
The scripts' config parser (docs/training.md, Configs): config files are plain Python, --key=value
wins, types are checked against the defaults, a mistake is one line. And the one-line stop on a
signal while a script starts (docs/robustness.md).
"""
import ast
import contextlib
import difflib
import os
import re
import signal
import sys
import types

NONE_OK = (type(None), bool, int, float, str)
CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class ConfigError(Exception):
    pass


def say(line, file=None):
    if int(os.environ.get("RANK", 0)) == 0:  # rank 0 only: all ranks err alike
        print(line, file=file or sys.stderr, flush=True)


def die(msg, status=1):
    """One line on stderr, exit status, no traceback."""
    say(f"error: {msg}")
    sys.exit(status)


def stop(signum, line):
    """line on stderr, then exit 128 + signum, even if the write fails (`| tee`)."""
    try:
        say(line)
    finally:
        os._exit(128 + signum)


def catch_signals():
    """For train.py while it starts (rundir.RunDir.catch_signals takes over once the run has a
    folder): Ctrl-C or SIGTERM ends the process with one line, exit 128 + signum; a closed output
    pipe (`| head`) ends it quietly, as it ends cat."""
    for sig in SIGNALS:
        signal.signal(sig, lambda signum, frame: stop(
            signum, f"error: interrupted by {signal.Signals(signum).name} while starting"))
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)


def interrupt_on_signals():
    """For scripts of short ops: the first Ctrl-C or SIGTERM raises KeyboardInterrupt(signum), even
    where SIGINT started out ignored (`cmd &` in a script); a closed output pipe (`| head`) ends the
    script quietly, as it ends cat."""
    def interrupt(signum, frame):
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt(signum)
    for sig in SIGNALS:
        signal.signal(sig, interrupt)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)


def first_line(e):
    """An exception as one line: its type and the first line of its message."""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"


def unknown_key_error(key, keys, where):  # always a nearest key, however far
    script = getattr(sys.modules["__main__"], "__file__", None) or ""
    if script.endswith(".py") and re.search(rf"^{re.escape(key)} *=", open(script).read(), re.M):
        return ConfigError(f"unknown config key '{key}': {os.path.basename(script)} sets it below "
                           f"its keys, so it is not one (keys go above the '# ---' line)")
    near = difflib.get_close_matches(key, list(keys), 1, 0.0)[0]
    return ConfigError(f"unknown config key '{key}' {where} (did you mean '{near}'?)")


def check_type(key, value, default, where):
    """Return value converted to the default's type, or raise ConfigError."""
    want = NONE_OK if default is None else type(default)
    if want is float and type(value) is int:
        return float(value)  # ints are fine for floats: lr=1 means 1.0
    if isinstance(value, want) and not (want is int and isinstance(value, bool)):  # not True for 1
        return value
    names = "None, bool, int, float or str" if default is None else want.__name__
    raise ConfigError(f"{key} {where}: expected {names}, got {type(value).__name__} {value!r}")


def parse_value(raw, default):
    """The text after '--key=' as a Python value: a literal, else the text itself."""
    if isinstance(default, bool) and raw.lower() in ("true", "false"):
        return raw.lower() == "true"  # --compile=false as well as False
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return raw
    # a str key keeps the text as typed (--out_dir=2024 stays '2024'); a quoted literal is unquoted
    return raw if isinstance(default, str) and not isinstance(value, str) else value


def not_a_config_file(path):
    """The ConfigError for a path that is not a file, with the nearest file in config/."""
    name = os.path.basename(path) + ("" if path.endswith(".py") else ".py")
    near = difflib.get_close_matches(name, sorted(os.listdir(CONFIG_DIR)), n=1)
    hint = f" (did you mean {os.path.join(os.path.relpath(CONFIG_DIR), near[0])}?)" if near else ""
    return ConfigError(f"config file not found: {path}{hint}")


def read_config_file(path, defaults):
    """Run a config file in a fresh namespace: the {key: value} it set, type-checked."""
    if not os.path.isfile(path):
        raise not_a_config_file(path)

    def include(name):  # sets the other file's keys here; its path is relative to this file's
        other = os.path.join(os.path.dirname(path), name)
        if not os.path.isfile(other):
            raise ConfigError(f"{path}: include({name!r}): {not_a_config_file(other)}")
        namespace.update(read_config_file(other, defaults))

    namespace = {"include": include}
    try:
        with open(path, encoding="utf-8") as f:
            exec(compile(f.read(), path, "exec"), namespace)
    except ConfigError:
        raise  # from an include: it names its file already
    except SyntaxError as e:
        raise ConfigError(f"{path}:{e.lineno}: syntax error: {e.msg}") from None
    except Exception as e:  # a config file that raises is bad input, not a crash
        raise ConfigError(f"{path}: {type(e).__name__}: {e}") from None
    values = {}
    for name, value in namespace.items():  # not __builtins__, _helpers, modules nor include
        if name.startswith("_") or isinstance(value, types.ModuleType) or value is include:
            continue
        if name not in defaults:
            raise unknown_key_error(name, defaults, f"in {path}")
        values[name] = check_type(name, value, defaults[name], f"in {path}")
    return values


def load_config(defaults, argv, base=None, sources=None, shown=None):
    """Apply argv's config files and --key=value, in order, to a copy of base (default: defaults).
    -h or --help: print help_text of the keys shown (default: all) and exit 0."""
    if "-h" in argv or "--help" in argv:
        try:
            say(help_text({k: defaults[k] for k in shown or defaults},
                          sources or [sys.modules["__main__"].__file__]), sys.stdout)
        except BrokenPipeError:  # `--help | head`: the reader has what it wanted
            os._exit(0)
        sys.exit(0)
    config = dict(defaults if base is None else base)
    for arg in argv:
        if not arg.startswith("--"):
            config.update(read_config_file(arg, defaults))
            continue
        key, eq, raw = arg[2:].partition("=")
        key = key.replace("-", "_")  # --batch-size=8 works too
        if not eq and isinstance(defaults.get(key), bool):
            config[key] = True  # a boolean key alone: --quick means --quick=True
        elif not eq and key.startswith("no_") and isinstance(defaults.get(key[3:]), bool):
            config[key[3:]] = False  # --no-quick means --quick=False
        elif key not in defaults:
            raise unknown_key_error(key, defaults, "on the command line")
        elif not eq:
            raise ConfigError(f"expected --{key}=value, got '{arg}' (only a boolean key can stand "
                              f"alone)")
        else:
            config[key] = check_type(key, parse_value(raw, defaults[key]), defaults[key],
                                     f"(from {arg})")
    return config


def key_comments(path):
    """{name: comment} from a file's first line `name = value  # comment` of each name."""
    comments = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if m := re.match(r"\s*(\w+)\s*(?::[^=]*)?=(?!=)[^#]*#\s*(.*)", line):
                comments.setdefault(m[1], m[2].rstrip())
    return comments


def help_text(defaults, sources):
    """The script's docstring, then every key, its default and its comment (the first source's,
    else a later one's)."""
    comments = {k: v for path in reversed(sources) for k, v in key_comments(path).items()}
    lines = [(sys.modules["__main__"].__doc__ or "").strip("\n"), "",
             "Keys and their defaults (--key=value; a boolean key alone means True, --no-key "
             "False):"]
    for key, value in defaults.items():
        line = f"  {key} = {value!r}"
        lines.append(f"{line:36s}  # {comments[key]}" if key in comments else line)
    return "\n".join(lines)


def collect_defaults(namespace):
    """A script's config keys: its public int/float/bool/str/None globals."""
    return {k: v for k, v in namespace.items() if not k.startswith("_") and isinstance(v, NONE_OK)}


def resolve_device(device, dtype):
    """(device, device_type, dtype, autocast context) on this machine, 'auto' resolved as train.py's
    keys say; on CUDA, float32 matmuls in TF32."""
    if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", device):
        raise ConfigError(f"device must be auto, cpu, cuda, cuda:N or mps, got {device!r}")
    if dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise ConfigError(f"dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
    import torch  # here, after the checks: prepare.py and report.py never need it
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device_type = device.split(":")[0]
    if device_type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device cuda asked for, but torch sees no CUDA GPU (use --device=cpu)")
    if device_type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matmuls
        dtype = dtype.replace("auto", "bfloat16" if torch.cuda.is_bf16_supported() else "float16")
    dtype = dtype.replace("auto", "float32")
    autocast = (contextlib.nullcontext() if dtype == "float32"  # (a disabled autocast still casts)
                else torch.autocast(device_type, getattr(torch, dtype)))
    return device, device_type, dtype, autocast
