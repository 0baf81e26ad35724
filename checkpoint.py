"""
Checkpoints: the dict train.py saves plus 'checksum', a SHA-256 of the rest, written atomically (as
every file of a run: replace()). load() refuses, in one line, a file a damage or a hand could have
made (docs/robustness.md).
"""
import contextlib
import dataclasses
import errno
import hashlib
import os
import shutil
import sys

import torch

from configurator import ConfigError, check_type, collect_defaults, load_config
from model import ModelConfig, Transformer

MODEL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelConfig)}


class CheckpointError(ConfigError):  # a one-line error too
    pass


def checksum(obj):
    """SHA-256 over nested dicts, lists, tensors (dtype, shape and bytes) and plain values."""
    h = hashlib.sha256()

    def walk(x):
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            h.update(f"tensor {t.dtype} {tuple(t.shape)}:".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy())  # raw bytes, whatever the dtype
        elif isinstance(x, (dict, list, tuple)):  # a dict as {k v k v}, a list or tuple as [v v]
            h.update(b"{" if isinstance(x, dict) else b"[")
            for v in ([y for kv in x.items() for y in kv] if isinstance(x, dict) else x):
                walk(v)
            h.update(b"}" if isinstance(x, dict) else b"]")
        else:
            h.update(f"{type(x).__name__} {x!r};".encode())
    walk(obj)
    return h.hexdigest()


def nonfinite(named):
    """The names of the values (numbers or tensors) holding a NaN or an inf; one device sync."""
    named = [(k, t) for k, v in named if (t := torch.as_tensor(v)).is_floating_point()]
    flags = [torch.isfinite(t).all().to(named[0][1].device) for _, t in named]
    return [k for (k, _), ok in zip(named, torch.stack(flags).tolist() if flags else []) if not ok]


def write_error(path, e):
    """An OSError from writing path as one line; a full disk names the file system that is full."""
    if e.errno not in (errno.ENOSPC, errno.EDQUOT):
        return f"cannot write {path}: {e.strerror or e}"
    mount = os.path.abspath(os.path.dirname(path))
    while not os.path.ismount(mount):
        mount = os.path.dirname(mount)
    return f"no space left on {mount} while saving {path}"


def replace(path, make):
    """make(tmp) creates path.tmp, renamed over path: a kill leaves the old file or the new. On a
    failure path.tmp goes (not to keep a disk full); an OSError becomes a CheckpointError."""
    tmp = path + '.tmp'
    try:
        make(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):  # never created, or the directory is read-only
            os.remove(tmp)
        cause = e  # torch.save raises its own RuntimeError: the OSError is its context
        while cause is not None and not isinstance(cause, OSError):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        raise CheckpointError(write_error(path, cause)) from None


def atomic_write(path, write):
    """Write a file through write(f) (binary), atomically, fsynced before the rename."""
    def make(tmp):
        with open(tmp, 'wb') as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    replace(path, make)


def save(ckpt, path):
    ckpt = dict(ckpt, checksum=checksum(ckpt))
    atomic_write(path, lambda f: torch.save(ckpt, f))


def link(src, dst):
    """dst as src, atomically: a hard link (save() replaces src, never rewrites it), else a copy."""
    def make(tmp):
        try:
            os.link(src, tmp)
        except OSError:  # a file system without hard links (or a leftover tmp: copied over)
            shutil.copyfile(src, tmp)
    if not (os.path.exists(dst) and os.path.samefile(src, dst)):  # (renaming onto itself: nothing)
        replace(dst, make)


def expected_shapes(model_config):
    # shapes only, built on meta: no memory, however large the config
    try:
        with torch.device('meta'):
            model = Transformer(model_config)
    except Exception as e:  # a fork's __init__ that reads a value (.item(), numpy): on the CPU
        if 'meta' not in str(e):  # (an overflowing size, say: no build on the CPU either)
            raise
        model = Transformer(model_config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def load(path, keys=('model', 'config')):
    """Read and check a checkpoint: (ckpt, its ModelConfig). keys: what the caller needs in it."""
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror or e}") from None
    except Exception as e:  # unpickling, zip and storage errors all mean the same thing here
        raise CheckpointError(f"cannot read {path}: not a checkpoint written by train.py, or a "
                              f"damaged one ({type(e).__name__})") from None
    missing = [k for k in (*keys, 'checksum') if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise CheckpointError(f"{path} lacks {', '.join(missing)}: not a complete checkpoint of "
                              f"train.py")
    if ckpt.pop('checksum') != checksum(ckpt):
        raise CheckpointError(f"{path} is damaged: its contents do not match its checksum")
    sd, config = ckpt['model'], ckpt['config']
    if not isinstance(config, dict) or not isinstance(sd, dict) \
            or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{path} is not a checkpoint written by train.py (no config or "
                              f"weights dict)")
    try:
        c = model_config_of(config)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: invalid model config: {e}") from None
    # a block holds a tensor at least: a config claiming more blocks than the file has tensors
    # is refused at once (even on meta, building it would take long)
    if (n := c.n_layer + (c.n_decoder_layer or 0)) > len(sd):
        raise CheckpointError(f"{path}: its config asks for {n} blocks, more than the file's "
                              f"{len(sd)} tensors")
    shapes = expected_shapes(c)  # the config against the weights
    for k in {**shapes, **sd}:  # the model's order, then what only the file holds
        got, needed = tuple(sd[k].shape) if k in sd else 'missing', shapes.get(k, 'none')
        if got != needed:
            raise CheckpointError(f"{path} was written by a model without a change made to "
                                  f"model.py since: {k} is {got} in the file, this model needs "
                                  f"{needed}")
    if bad := nonfinite(sd.items()):
        raise CheckpointError(f"{path}: {len(bad)} of {len(sd)} weight tensors hold NaN or inf "
                              f"(e.g. {bad[0]}): the run had diverged when this was saved")
    return ckpt, c


def model_config_of(config):  # a field the run's config lacks (it is older) takes its default
    return ModelConfig(**{k: config[k] for k in MODEL_DEFAULTS if k in config})


def run_config(namespace, argv):
    """(config, model_config, ckpt, [(key, old, new)]) of train.py: its keys (namespace's public
    int, float, bool, str and None globals) and ModelConfig's, set by argv's config files and
    --key=value; a resume's come from its checkpoint (resume_config), else ckpt is None."""
    defaults = collect_defaults(namespace)
    if clash := defaults.keys() & MODEL_DEFAULTS:  # else one default would hide the other
        raise ConfigError(f"{clash.pop()} is both a train.py key and a ModelConfig field")
    defaults.update(MODEL_DEFAULTS)
    sources = [namespace['__file__'], sys.modules['model'].__file__]  # of --help's comments
    config, ckpt, changes = load_config(defaults, argv, sources=sources), None, []
    try:  # a value ModelConfig refuses, here or in resume_config: one line
        if config['init_from'] == 'resume':
            config, ckpt, changes = resume_config(defaults, argv, config['out_dir'])
        return config, model_config_of(config), ckpt, changes
    except (ValueError, TypeError) as e:
        raise ConfigError(f"model config: {e}") from None


def resume_config(defaults, argv, out_dir):
    """(config, ckpt, changes) of a resume: the config saved in out_dir/ckpt_last.pt with what argv
    sets on top (e.g. --train_steps=20000) but the model, that checkpoint, what argv changed."""
    path = os.path.join(out_dir, 'ckpt_last.pt')
    if not os.path.isfile(path):
        raise ConfigError(f"--init_from=resume: no checkpoint at {path} (is out_dir right?)")
    ckpt, _ = load(path, ('model', 'optimizer', 'scaler', 'config', 'step', 'best_val_loss',
                          'best_step', 'last_est', 'elapsed', 'rng'))
    saved = dict(defaults, **{k: check_type(k, v, defaults[k], f"in {path}")
                              for k, v in ckpt['config'].items() if k in defaults})
    config = dict(load_config(defaults, argv, base=saved), init_from='resume', out_dir=out_dir)
    # the model stays; another spelling of it is no change (n_decoder_layer None and = n_layer)
    if model_config_of(config) != model_config_of(saved):
        k = next(k for k in MODEL_DEFAULTS if config[k] != saved[k])
        raise ConfigError(f"cannot change {k} when resuming: the checkpoint has {saved[k]!r}, "
                          f"this run asks for {config[k]!r}")
    changes = [(k, saved[k], v) for k, v in config.items() if v != saved[k] and k != 'init_from']
    return config, ckpt, changes
