"""
Checkpoints, shared by train.py (save, resume) and sample.py (load).

A checkpoint is the dict train.py saves (model, optimizer, scaler, config, step, best_val_loss, ...) plus
'checksum', a SHA-256 of everything else in it. save() writes it atomically; load() hands it back only
after the checks a damaged or hostile file could fail, each a one-line CheckpointError naming the file:
torch.load(weights_only=True) unpickles nothing but tensors and plain values, the checksum catches a
flipped byte, and the config is checked against the saved tensors' shapes on the meta device (no memory)
before anyone builds the model it describes. Weights that hold a NaN or inf are refused too: such a file
is never a model worth sampling from or resuming.
"""
import dataclasses
import hashlib
import os
import shutil

import torch

from model import ModelConfig, build_model

MODEL_KEYS = [f.name for f in dataclasses.fields(ModelConfig)]


class CheckpointError(Exception):
    pass


def checksum(obj):
    """SHA-256 over a checkpoint's nested dicts, lists, tensors (dtype, shape and bytes) and plain values."""
    h = hashlib.sha256()

    def walk(x):
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            h.update(f"tensor {t.dtype} {tuple(t.shape)}:".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy())  # raw bytes, whatever the dtype (bf16 too)
        elif isinstance(x, dict):
            h.update(b"{")
            for k, v in x.items():
                walk(k)
                walk(v)
            h.update(b"}")
        elif isinstance(x, (list, tuple)):
            h.update(b"[")
            for v in x:
                walk(v)
            h.update(b"]")
        else:
            h.update(f"{type(x).__name__} {x!r};".encode())

    walk(obj)
    return h.hexdigest()


def nonfinite(named_tensors):
    """Names of the tensors that hold a NaN or an inf; one device sync for all of them."""
    named = [(k, t) for k, t in named_tensors if t.is_floating_point()]
    if not named:
        return []
    flags = [torch.isfinite(t).all() for _, t in named]
    ok = torch.stack([f.to(flags[0].device) for f in flags]).tolist()  # Adam's step counts may sit on the CPU
    return [k for (k, _), good in zip(named, ok) if not good]


def replace(path, make):
    """make(tmp) creates path.tmp, which is then renamed over path: a kill at any moment leaves the old file
    or the new one, never a mix. If anything fails (a full disk, a read-only directory, an interrupt),
    path.tmp is removed, so it cannot keep the disk full; an OSError becomes a one-line CheckpointError."""
    tmp = path + '.tmp'
    try:
        make(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.remove(tmp)
        except OSError:
            pass  # never created, or the directory is read-only
        if isinstance(e, OSError):
            raise CheckpointError(f"cannot write {path}: {e.strerror or e}") from None
        raise


def atomic_write(path, write):
    """Write a file through write(f) (binary), atomically, fsynced before the rename."""
    def make(tmp):
        with open(tmp, 'wb') as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    replace(path, make)


def save(ckpt, path):
    """Write ckpt (a dict) to path with its checksum, atomically."""
    ckpt = dict(ckpt, checksum=checksum(ckpt))
    atomic_write(path, lambda f: torch.save(ckpt, f))


def link(src, dst):
    """Make dst the same file as src, atomically: a hard link (no second write), else a copy. src is later
    replaced by save(), never rewritten in place, so dst stays a snapshot."""
    if os.path.exists(dst) and os.path.samefile(src, dst):
        return  # linked already; and rename() of one link over another of the same file does nothing at all
    def make(tmp):
        try:
            os.link(src, tmp)
        except OSError:  # a file system without hard links (or a leftover tmp: copied over)
            shutil.copyfile(src, tmp)
    replace(dst, make)


def expected_shapes(model_config):
    with torch.device('meta'):  # shapes only: no memory, however large the config
        return {k: tuple(v.shape) for k, v in build_model(model_config).state_dict().items()}


def load(path, keys=('model', 'config')):
    """Read and check a checkpoint; return (ckpt, its ModelConfig). keys: what the caller needs in it.
    Config keys the file lacks (written before a key existed) take ModelConfig's defaults, like a resume."""
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=True)
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror or e}") from None
    except Exception as e:  # unpickling, zip and storage errors all mean the same thing here
        raise CheckpointError(f"cannot read {path}: not a checkpoint written by train.py, or a damaged one "
                              f"({type(e).__name__})") from None
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path} is not a checkpoint written by train.py")
    missing = [k for k in keys if k not in ckpt]
    if missing:
        raise CheckpointError(f"{path} lacks {', '.join(missing)}: not a complete checkpoint of train.py")
    stored = ckpt.pop('checksum', None)  # absent in files written before checksums: nothing to verify
    if stored is not None and stored != checksum(ckpt):
        raise CheckpointError(f"{path} is damaged: its contents do not match the checksum stored in it")
    sd, config = ckpt['model'], ckpt['config']
    if not isinstance(config, dict) or not isinstance(sd, dict) \
            or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{path} is not a checkpoint written by train.py (no config or weights dict)")
    try:
        model_config = ModelConfig(**{k: config[k] for k in MODEL_KEYS if k in config})
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: invalid model config: {e}") from None

    # the config against the weights, before building anything. The tensor count grows by the same number
    # per layer, so a config claiming thousands of layers is refused without building them even on meta
    one, two = (len(expected_shapes(dataclasses.replace(model_config, n_layer=n))) for n in (1, 2))
    count = one + (model_config.n_layer - 1) * (two - one)
    if count != len(sd):
        raise CheckpointError(f"{path}: its config (n_layer={model_config.n_layer}) means {count} weight "
                              f"tensors, the file holds {len(sd)}")
    for k, shape in expected_shapes(model_config).items():
        if k not in sd:
            raise CheckpointError(f"{path}: its config needs a tensor {k}, the file has none")
        if tuple(sd[k].shape) != shape:
            raise CheckpointError(f"{path}: {k} is {tuple(sd[k].shape)} in the file, but its config "
                                  f"(n_embed={model_config.n_embed}, vocab_size={model_config.vocab_size}, "
                                  f"context_size={model_config.context_size}) needs {shape}")
    bad = nonfinite(sd.items())
    if bad:
        raise CheckpointError(f"{path}: {len(bad)} of {len(sd)} weight tensors hold NaN or inf (e.g. {bad[0]}): "
                              f"the run had diverged when this was saved")
    return ckpt, model_config
