"""
Train the auto-regressive encoder-decoder (AED) model or the decoder-only GPT baseline.

One process (CPU, or one GPU):
$ python train.py config/cpu_aed_mse_possub.py
DDP on one node with 8 GPUs:
$ torchrun --standalone --nproc_per_node=8 train.py config/aed_mse_possub.py
DDP on 2 nodes with 8 GPUs each (run on both nodes, with node 0's address as the endpoint):
$ torchrun --nnodes=2 --nproc_per_node=8 --rdzv_id=aed --rdzv_backend=c10d \
    --rdzv_endpoint=10.0.0.1:29500 train.py config/aed_mse_possub.py
Two processes on this CPU (gloo), e.g. to check DDP without GPUs:
$ torchrun --standalone --nproc_per_node=2 train.py config/cpu_aed_mse_possub.py --device=cpu \
    --batch_size=4 --gradient_accumulation_steps=2   # the preset's 1 x 8 split over 2 processes

Any key below can be set by a config file (plain Python) and/or --key=value.
"""
import dataclasses
import fcntl
import json
import math
import os
import re
import signal
import statistics
import sys
import time
from contextlib import nullcontext
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import checkpoint
from checkpoint import CheckpointError
from configurator import ConfigError, check_device, check_type, collect_defaults, die, first_line, load_config
from model import ModelConfig, build_model

# -----------------------------------------------------------------------------
# defaults: the author's common settings (SPEC section 4)
# I/O
out_dir = 'out'        # checkpoints, log.jsonl and summary.json go here
init_from = 'scratch'  # 'scratch' or 'resume' (continue from out_dir/ckpt_last.pt)
overwrite = False      # True: a scratch run may replace the run already in out_dir (else it is refused)
est_interval = 500     # estimate train/val loss every this many steps, and at the end
est_steps = 200        # batches per split in each estimate
log_interval = 1       # print a line every this many steps (log.jsonl gets every step)
save_interval = 0      # also save ckpt_last.pt every this many steps (0: only at estimates and the end)
wandb_log = False      # wandb is imported only when this is on
wandb_project = 'aed'  # the wandb project of the run
wandb_run_name = ''    # '' -> the out_dir name
# data
data_dir = 'data'      # where prepare.py wrote the data
dataset = 'wikipedia'  # reads data_dir/dataset/{train,val}.bin (python prepare.py makes them)
train_tokens = 0       # train on the first this many tokens of train.bin only (0: all of it); val is unchanged
batch_size = 50        # sequences per micro-step per process
gradient_accumulation_steps = 16  # micro-steps per optimizer step, in total: split across DDP ranks
# AdamW and the lr schedule
lr = 9e-4              # peak learning rate
min_lr = 9e-5
warmup_iters = 300
lr_decay_iters = 700000  # cosine decay to min_lr by here: ~constant lr over 9k steps, as the author ran
decay_lr = True        # False: lr constant (no warm-up either)
beta1 = 0.9            # AdamW's betas
beta2 = 0.95
weight_decay = 0.1     # on weights with dim >= 2 only
grad_clip = 0.0        # clip the global grad norm at this value; 0 = off (the author's runs)
train_steps = 9000     # optimizer steps
# system
device = 'auto'        # 'auto' (cuda if available, else cpu), 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'auto'         # 'auto' (bfloat16 on cuda if supported, else float16; float32 elsewhere), or name one
compile = True         # torch.compile the model (the CPU presets turn it off: slower there, see README)
seed = 1337            # the init, the batches and dropout all follow from it
ddp_timeout = 600      # seconds a DDP rank waits in a collective (NCCL or gloo) before the run stops with an error
# model: every ModelConfig field of model.py is also a key, with ModelConfig's default
# (arch, vocab_size, context_size, n_embed, n_layer, n_head, dropout_rate, use_bias, the AED keys ...)
MODEL_KEYS = [f.name for f in dataclasses.fields(ModelConfig)]
DEFAULTS = collect_defaults(globals())
DEFAULTS.update({f.name: f.default for f in dataclasses.fields(ModelConfig)})
# -----------------------------------------------------------------------------


try:
    # --help lists every key, with the comments beside them here and in model.py's ModelConfig
    config = load_config(DEFAULTS, sys.argv[1:], sources=[__file__, sys.modules[ModelConfig.__module__].__file__])
except ConfigError as e:
    die(e)

ckpt = None
if config['init_from'] == 'resume':
    # the run continues as it was configured; what this command line sets explicitly wins
    # (e.g. --train_steps=20000), except the model's shape
    ckpt_path = os.path.join(config['out_dir'], 'ckpt_last.pt')
    if not os.path.isfile(ckpt_path):
        die(f"--init_from=resume: no checkpoint at {ckpt_path}")
    try:
        ckpt, _ = checkpoint.load(ckpt_path, ('model', 'optimizer', 'config', 'step', 'best_val_loss', 'rng'))
        saved = {k: check_type(k, v, DEFAULTS[k], f"in {ckpt_path}")
                 for k, v in ckpt['config'].items() if k in DEFAULTS}
        config = load_config(DEFAULTS, sys.argv[1:], base={**DEFAULTS, **saved})
    except (CheckpointError, ConfigError) as e:
        die(e)
    had = {k: saved.get(k, DEFAULTS[k]) for k in MODEL_KEYS}
    try:  # compare the models, not the spelling: n_decoder_layer=None and =n_layer are the same model
        same = ModelConfig(**had) == ModelConfig(**{k: config[k] for k in MODEL_KEYS})
    except (ValueError, TypeError):
        same = False  # a value the model refuses: the check below names the key
    for k in MODEL_KEYS:
        if config[k] != had[k] and not same:
            die(f"cannot change {k} when resuming: the checkpoint has {had[k]!r}, this run asks for {config[k]!r}")
    config['init_from'], config['out_dir'] = 'resume', os.path.dirname(ckpt_path)  # even if the folder moved
globals().update(config)

# value checks the type check cannot do
if init_from not in ('scratch', 'resume'):
    die(f"init_from must be 'scratch' or 'resume', got {init_from!r}")
if not out_dir:
    die("out_dir must not be empty (it is where the checkpoints and the log go)")
if dtype not in ('auto', 'float32', 'bfloat16', 'float16'):
    die(f"dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
try:
    check_device(device)
except ConfigError as e:
    die(e)
for k in ('batch_size', 'gradient_accumulation_steps', 'est_interval', 'est_steps', 'log_interval'):
    if config[k] < 1:
        die(f"{k} must be >= 1, got {config[k]}")
for k in ('train_steps', 'save_interval', 'seed', 'warmup_iters', 'train_tokens', 'min_lr', 'weight_decay',
          'grad_clip'):
    if config[k] < 0:  # a negative min_lr is gradient ascent, a negative weight decay pushes weights up
        die(f"{k} must be >= 0, got {config[k]}")
for k in ('lr', 'ddp_timeout'):
    if config[k] <= 0:
        die(f"{k} must be > 0, got {config[k]}")
for k in ('beta1', 'beta2'):
    if not 0 <= config[k] < 1:
        die(f"{k} must be in [0, 1), got {config[k]}")
if decay_lr and lr_decay_iters <= warmup_iters:
    die(f"lr_decay_iters ({lr_decay_iters}) must be > warmup_iters ({warmup_iters})")
try:
    model_config = ModelConfig(**{k: config[k] for k in MODEL_KEYS})
except (ValueError, TypeError) as e:
    die(f"model config: {e}")

# DDP: torchrun sets RANK, LOCAL_RANK, WORLD_SIZE
ddp = int(os.environ.get('RANK', -1)) != -1
rank, local_rank, world_size = 0, 0, 1
if ddp:
    rank, local_rank, world_size = (int(os.environ[k]) for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE'))
master = rank == 0  # rank 0 logs, evaluates and saves
if device == 'auto':
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
device_type = 'cuda' if device.startswith('cuda') else device.split(':')[0]
if device_type == 'cuda' and not torch.cuda.is_available():
    die("device cuda asked for, but torch sees no CUDA GPU (use --device=cpu)")
if ddp and gradient_accumulation_steps % world_size:
    die(f"gradient_accumulation_steps ({gradient_accumulation_steps}) must be divisible by the "
        f"number of processes ({world_size}); e.g. divide batch_size and multiply gradient_accumulation_steps "
        f"by the same factor")


def interrupted(signum, frame):
    # Ctrl-C or SIGTERM: stop now, without saving (a save under way finishes first). Every file is written
    # atomically, so this is as safe as a kill -9 at any moment; a save here could not be (the signal may land
    # in the middle of an optimizer step)
    for sig in (signal.SIGINT, signal.SIGTERM):  # the first signal decides: more of them (a kill that reaches a
        signal.signal(sig, signal.SIG_IGN)       # script and its job) must not break the exit with a traceback
    name = signal.Signals(signum).name
    if 'step' not in globals():  # the training loop has not started
        die(f"interrupted by {name} before the first step", 128 + signum)
    hint = f": continue with --init_from=resume --out_dir={out_dir}" if saved_step is not None else ""
    die(f"interrupted by {name} at step {step}; {last_saved()}{hint}", 128 + signum)


if ddp:  # torchrun's SIGINT/SIGTERM kill its workers at once (a rank inside a collective would run no handler)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
else:
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)

# out_dir (rank 0's): one run at a time, and a scratch run never replaces a run by accident
if master:
    try:
        os.makedirs(out_dir, exist_ok=True)
        lock_file = open(os.path.join(out_dir, '.lock'), 'a+')
    except OSError as e:
        die(f"cannot write in out_dir {out_dir}: {e.strerror}")
    try:
        # held for the life of the process; the kernel releases it however the process ends (kill -9 too)
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock_file.seek(0)
        die(f"{out_dir} is in use by another train.py (pid {lock_file.read().strip() or '?'}): "
            f"one run per out_dir at a time")
    lock_file.truncate(0)
    lock_file.write(f"{os.getpid()}\n")
    lock_file.flush()
    held = [f for f in ('ckpt_last.pt', 'log.jsonl') if os.path.exists(os.path.join(out_dir, f))]
    if init_from == 'scratch' and held and not overwrite:
        die(f"{out_dir} already holds a run ({' and '.join(held)}): continue it with --init_from=resume, "
            f"or start over and replace it with --overwrite=True")
    stale = ['ckpt_last.pt.tmp', 'ckpt_best.pt.tmp', 'summary.json.tmp']  # a killed run's (we hold the lock)
    if init_from == 'scratch':  # --overwrite=True: the old run goes now, so a kill before the first save mixes nothing
        stale += ['ckpt_last.pt', 'ckpt_best.pt', 'summary.json', 'log.jsonl']
    for f in stale:
        if os.path.exists(os.path.join(out_dir, f)):
            os.remove(os.path.join(out_dir, f))
    if init_from == 'resume' and os.path.isfile(os.path.join(out_dir, 'log.jsonl')):
        # a kill (or a full disk) mid-write can leave a torn last line: cut it, or the resumed run's
        # first record would be glued to it
        with open(os.path.join(out_dir, 'log.jsonl'), 'rb+') as f:
            torn = len(f.read().rpartition(b'\n')[2])
            if torn:
                f.truncate(f.tell() - torn)
                print(f"log.jsonl: dropped its torn last line ({torn} bytes)", flush=True)

if ddp:
    if sys.platform == 'linux':
        # torchrun starts each worker in a session of its own, so after a kill -9 of torchrun the workers
        # would train on alone: have the kernel SIGKILL this one when its parent dies. SIGKILL, not SIGTERM:
        # a rank blocked in a collective runs no signal handler. (Saves are atomic: a kill is safe anytime.)
        import ctypes
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if device_type == 'cuda':
        device = f'cuda:{local_rank}'
        torch.cuda.set_device(device)
    # a rank that hangs (or never shows up) makes the others fail after ddp_timeout (gloo's own default: 30
    # min, silent); it must outlast rank 0's estimate + save (+ compile), which the other ranks wait for
    try:
        dist.init_process_group(backend='nccl' if device_type == 'cuda' else 'gloo',
                                timeout=timedelta(seconds=ddp_timeout))
    except dist.DistError as e:  # e.g. a rank that never showed up
        die(f"DDP start-up failed on rank {rank}: {first_line(e)}")
micro_steps = gradient_accumulation_steps // world_size  # per rank
tokens_per_step = gradient_accumulation_steps * batch_size * context_size  # all ranks together

if dtype == 'auto':
    if device_type == 'cuda':
        dtype = 'bfloat16' if torch.cuda.is_bf16_supported() else 'float16'
    else:
        dtype = 'float32'
ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
autocast = nullcontext() if dtype == 'float32' else torch.autocast(device_type=device_type, dtype=ptdtype)
# fp16 needs loss scaling; bf16 and fp32 do not (the scaler is then a no-op)
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == 'float16'))
if device_type == 'cuda':
    torch.set_float32_matmul_precision('high')  # TF32 matmuls
    torch.backends.cudnn.allow_tf32 = True

# data: each split's memmap is opened once; batches are random offsets, with replacement
def open_split(split, limit=0):
    # limit > 0: the first `limit` tokens only (train_tokens, the data-constrained regime); nothing past them is
    # ever read, not even by the id check
    path = os.path.join(data_dir, dataset, f'{split}.bin')
    if not os.path.isfile(path):
        die(f"{path} not found: run python prepare.py")
    size = os.path.getsize(path)
    if size % 2:
        die(f"{path} has an odd number of bytes ({size}): not a file of uint16 token ids, or a truncated one")
    if size < 2 * (context_size + 2):
        die(f"{path} has {size // 2} tokens, fewer than context_size + 2 = {context_size + 2}")
    if limit > size // 2:
        die(f"train_tokens ({limit:,}) is more than {path} holds ({size // 2:,})")
    if limit and limit < context_size + 2:
        die(f"train_tokens ({limit}) is too small for one batch: needs at least context_size + 2 = {context_size + 2}")
    data = np.memmap(path, dtype=np.uint16, mode='r')
    if limit:
        data = data[:limit]  # still a memmap
    # once, here: an id past the embedding table would otherwise be an IndexError steps later
    # (one pass over the file: memory speed once cached, which training needs anyway)
    if int(data.max()) >= vocab_size:
        die(f"{path} holds token id {int(data.max())}, but vocab_size is {vocab_size}: data and model disagree")
    return data


train_data, val_data = open_split('train', train_tokens), open_split('val')


def epochs(step):
    return step * tokens_per_step / len(train_data)  # passes over the training tokens, on average


meta_path = os.path.join(data_dir, dataset, 'meta.json')
if os.path.isfile(meta_path):
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        die(f"cannot read {meta_path}: {getattr(e, 'strerror', None) or e}")
    if not isinstance(meta, dict):
        die(f"{meta_path}: expected a JSON object as prepare.py writes it, got a {type(meta).__name__}")
    meta_vocab = meta.get('vocab_size')
    if isinstance(meta_vocab, int) and meta_vocab > vocab_size:
        die(f"{meta_path} says vocab_size {meta_vocab}, more than the model's vocab_size {vocab_size}")


# the loss as the author computed it on GPUs, full (B, T, vocab) logits and F.cross_entropy, which torch.compile
# fuses; on CPU, the chunked cross-entropy: the same value, without the logits in memory (bench.py: faster there).
# On an H100 the chunked one's ~60 small chunks a micro-step left the GPU waiting on Python (README, "On a GPU").
full_logits = device_type != 'cpu'


def get_batch(data, ix):
    # ix: (B,) start offsets -> x, y: (B, T) int64, y shifted by one
    rows = torch.from_numpy(data[ix[:, None] + np.arange(context_size + 1)].astype(np.int64))  # (B, T+1)
    x, y = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
    if device_type == 'cuda':
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


def train_offsets(step):
    # the step's whole batch is a function of (seed, step) and each rank takes its own rows: ranks
    # draw different batches, N ranks see exactly what 1 process accumulating N times would see,
    # and a resumed run draws exactly the batches the uninterrupted run would have drawn
    rng = np.random.default_rng([seed, 0, step])
    ix = rng.integers(0, len(train_data) - context_size, size=(gradient_accumulation_steps, batch_size))
    return ix[rank * micro_steps:(rank + 1) * micro_steps]  # (micro_steps, B)


def est_offsets(split_id, data):
    # the same est_steps batches at every estimate, so estimates differ only by the model
    rng = np.random.default_rng([seed, 1, split_id])
    return rng.integers(0, len(data) - context_size, size=(est_steps, batch_size))


def get_lr(step):
    # the author's schedule (SPEC section 4), with step 0-based: linear warm-up, then cosine decay to min_lr
    # at lr_decay_iters; both count step + 1 (nanoGPT's warm-up, (step + 1) / (warmup_iters + 1), is up
    # to 0.33% lower)
    if not decay_lr:
        return lr
    if step + 1 < warmup_iters:
        return lr * (step + 1) / warmup_iters
    if step + 1 > lr_decay_iters:
        return min_lr
    ratio = (step + 1 - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


# peak dense tensor FLOP/s per GPU as (bf16/fp16, tf32); MFU is shown only for GPUs listed here
GPU_PEAK_FLOPS = [
    (r'H100.*PCIe', 756e12, 378e12), (r'H100|H200|GH200', 989e12, 495e12),
    (r'A100', 312e12, 156e12), (r'L40S', 362e12, 183e12), (r'\bL40\b', 181e12, 90.5e12),
    (r'\bL4\b', 121e12, 60e12), (r'A6000', 155e12, 77e12), (r'RTX 4090', 165e12, 83e12),
    (r'RTX 3090', 71e12, 36e12), (r'V100', 125e12, None), (r'\bT4\b', 65e12, None),
]


def gpu_peak_flops():
    if device_type != 'cuda':
        return None, 'n/a on cpu'
    name = torch.cuda.get_device_name(device)
    for pattern, half, tf32 in GPU_PEAK_FLOPS:
        if re.search(pattern, name):
            peak = tf32 if dtype == 'float32' else half
            return peak, f"{name}, peak {peak / 1e12:.0f} TFLOP/s {dtype}" if peak else f"{name}: no {dtype} peak known"
    return None, f"{name}: peak unknown, MFU not shown"


# model
torch.manual_seed(seed)  # the same init on every rank (DDP also broadcasts rank 0's weights)
model = build_model(model_config)
if ckpt is not None:
    model.load_state_dict(ckpt['model'])  # checkpoint.load checked every shape
model.to(device)
raw_model = model  # the uncompiled, unwrapped module: attributes, state_dict, generate
optimizer = model.configure_optimizers(weight_decay, lr, (beta1, beta2), device_type)
start_step, best_val_loss, elapsed_before = 0, float('inf'), 0.0
best_step, last_est, saved_step = None, {}, None  # the best estimate's step, the last estimate, ckpt_last.pt's step
if ckpt is not None:
    try:
        optimizer.load_state_dict(ckpt['optimizer'])
    except (ValueError, KeyError, TypeError) as e:
        die(f"{ckpt_path}: its optimizer state does not fit the model ({first_line(e)})")
    if ckpt.get('scaler'):
        scaler.load_state_dict(ckpt['scaler'])
    start_step, best_val_loss, elapsed_before = ckpt['step'], ckpt['best_val_loss'], ckpt.get('elapsed', 0.0)
    best_step, last_est, saved_step = ckpt.get('best_step'), ckpt.get('last_est', {}), start_step

peak_flops, peak_note = gpu_peak_flops()
flops_per_step = raw_model.flops_per_token() * tokens_per_step
if master:  # the header first: a slow start (compiling, or hardware too slow for the config) is never silent
    print(f"{model_config.arch} model, {raw_model.get_num_params():,} params | {tokens_per_step:,} tokens/step "
          f"(batch {batch_size} x context {context_size} x accumulation {gradient_accumulation_steps}) | "
          f"{len(train_data):,} train tokens{'' if train_tokens else ' (all)'} | "
          f"{world_size} process(es), {device}, {dtype}, compile {'on' if compile else 'off'} | "
          f"mfu: {peak_note}", flush=True)
    if init_from == 'resume':
        print(f"resuming from {os.path.join(out_dir, 'ckpt_last.pt')} at step {start_step} "
              f"(best val loss {best_val_loss:.4f})", flush=True)

if compile:
    if master:
        print("compiling the model with torch.compile: about a minute (--compile=False skips it)", flush=True)
    t0 = time.time()
    model = torch.compile(model)
    try:
        # compile now, on one batch, so a compiler failure falls back to eager mode instead of
        # killing the run, and compile time stays out of the step timings
        X, Y = get_batch(train_data, est_offsets(0, train_data)[0])
        with autocast:
            _, loss = model(X, Y, return_logits=full_logits)
        scaler.scale(loss).backward()
        optimizer.zero_grad(set_to_none=True)
        if master:
            print(f"compiled in {time.time() - t0:.1f} s", flush=True)
    except Exception as e:
        optimizer.zero_grad(set_to_none=True)
        torch._dynamo.reset()
        model = raw_model
        if master:
            print(f"warning: torch.compile failed ({first_line(e)}); training in eager mode "
                  f"(--compile=False skips the attempt)", file=sys.stderr, flush=True)
eval_model = model  # rank 0 evaluates without the DDP wrapper
if ddp:
    model = DDP(model, device_ids=[local_rank] if device_type == 'cuda' else None)

# RNG for dropout: rank 0 restores the saved state, so a single-process resume is exact
seed_seq = np.random.SeedSequence([seed, 2, rank, start_step])
torch.manual_seed(int(seed_seq.generate_state(1)[0]))
if ckpt is not None and master:
    torch.set_rng_state(ckpt['rng']['torch'])
    if device_type == 'cuda' and ckpt['rng'].get('cuda') is not None:
        torch.cuda.set_rng_state(ckpt['rng']['cuda'])
del ckpt  # free the loaded tensors


@torch.no_grad()
def estimate_loss():
    # eval-mode cross-entropy (no dropout, no embedding loss) over est_steps batches per split
    out = {}
    eval_model.eval()
    for split_id, (split, data) in enumerate((('train', train_data), ('val', val_data))):
        offsets = est_offsets(split_id, data)
        losses = torch.zeros(est_steps, device=device)
        for k in range(est_steps):
            X, Y = get_batch(data, offsets[k])
            with autocast:
                _, loss = eval_model(X, Y, return_logits=full_logits)
            losses[k] = loss.float()
        out[split] = losses.mean().item()
    eval_model.train()
    return out


def save_checkpoint(step, also_best):
    global saved_step
    # a step with a finite loss can still leave NaN/inf weights or Adam moments (an overflowing update):
    # never save those, or they would replace the last good checkpoint
    tensors = list(raw_model.state_dict().items())
    tensors += [(f'{name} ({k})', v) for name, p in raw_model.named_parameters() for k, v in optimizer.state[p].items()]
    bad = checkpoint.nonfinite(tensors)
    if bad:
        stop(f"{len(bad)} of {len(tensors)} weight and optimizer tensors are not finite (e.g. {bad[0]})", step)
    ckpt = {
        'model': raw_model.state_dict(),
        'optimizer': optimizer.state_dict(),
        'scaler': scaler.state_dict(),
        'config': run_config,
        'step': step,
        'best_val_loss': best_val_loss,
        'best_step': best_step,  # with last_est: what a resume at this step needs to repair ckpt_best.pt and summary.json
        'last_est': last_est,
        'elapsed': elapsed(),
        'rng': {'torch': torch.get_rng_state(),
                'cuda': torch.cuda.get_rng_state() if device_type == 'cuda' else None},
    }
    path = os.path.join(out_dir, 'ckpt_last.pt')
    # Ctrl-C and SIGTERM wait for the save (a second or so) and its bookkeeping: their message then names
    # the step that is really in ckpt_last.pt
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        checkpoint.save(ckpt, path)  # atomic: a kill or a full disk mid-write leaves the old file intact
        saved_step = step
        if also_best:
            checkpoint.link(path, os.path.join(out_dir, 'ckpt_best.pt'))
    except CheckpointError as e:
        die(f"{e}; stopped at step {step}: {last_saved()}")
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def last_saved():
    if saved_step is None:
        return "no checkpoint was saved yet"
    return f"the last checkpoint, {os.path.join(out_dir, 'ckpt_last.pt')}, is from step {saved_step}"


def peak_gpu_memory_mib():  # the most memory this process's tensors have held on its GPU (None on CPU)
    return round(torch.cuda.max_memory_allocated(device) / 2 ** 20) if device_type == 'cuda' else None


def write_summary(status, step, last_est):
    summary = {
        'status': status, 'step': step, 'train_steps': train_steps,
        'best_val_loss': best_val_loss if best_val_loss < float('inf') else None,
        'final_train_loss': last_est.get('train'), 'final_val_loss': last_est.get('val'),
        'params': raw_model.get_num_params(), 'tokens_seen': step * tokens_per_step,
        'train_tokens': len(train_data), 'epochs': round(epochs(step), 4),
        'wall_time_s': round(elapsed(), 1), 'world_size': world_size, 'device': device,
        'dtype': dtype, 'compiled': eval_model is not raw_model, 'torch': torch.__version__,
        'gpu': torch.cuda.get_device_name(device) if device_type == 'cuda' else None,
        'peak_gpu_memory_mib': peak_gpu_memory_mib(), 'config': run_config,
    }
    try:
        checkpoint.atomic_write(os.path.join(out_dir, 'summary.json'),
                                lambda f: f.write(json.dumps(summary, indent=2).encode()))
    except CheckpointError as e:
        die(f"{e}; stopped at step {step}: {last_saved()}")


def log_record(rec):
    try:
        log_file.write((json.dumps(rec) + '\n').encode())  # unbuffered: one write() per record
    except OSError as e:
        die(f"cannot write {log_file.name}: {e.strerror}; stopped at step {rec['step']}: {last_saved()}")


def stop(msg, step):
    # a NaN/inf loss or weights: nothing is saved, so ckpt_last.pt stays what it was (checked when saved)
    if master:
        log_record({'type': 'stop', 'step': step, 'reason': msg})
        write_summary('stopped: ' + msg, step, last_est)
    die(f"{msg} at step {step}; stopped without saving: {last_saved()}")


run_config = dict(config)  # as given (device 'auto' stays 'auto'), so a resume on other hardware works
t_start = time.time()
def elapsed():
    return elapsed_before + time.time() - t_start


def duration(s):
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.1f} min" if s < 90 * 60 else f"{s / 3600:.1f} h"


if master:
    # a fresh run starts a fresh log; a resumed one appends (records after a 'resume' record
    # supersede earlier ones with the same or later step)
    log_file = open(os.path.join(out_dir, 'log.jsonl'), 'ab' if init_from == 'resume' else 'wb', buffering=0)
    log_record({'type': 'resume' if init_from == 'resume' else 'start', 'step': start_step,
                'train_tokens': len(train_data), 'world_size': world_size, 'device': device, 'dtype': dtype,
                'config': run_config})
    if init_from == 'resume':
        # a kill right after the save at start_step left what follows it undone: redo it, so that a resumed
        # run leaves the files an uninterrupted one would (ckpt_best.pt, then summary.json)
        if best_step == start_step:
            try:
                checkpoint.link(os.path.join(out_dir, 'ckpt_last.pt'), os.path.join(out_dir, 'ckpt_best.pt'))
            except CheckpointError as e:
                die(e)
        write_summary('finished' if start_step >= train_steps else 'running', start_step, last_est)
    if wandb_log:
        try:
            import wandb
        except ImportError:
            die("wandb_log=True needs wandb: pip install wandb")
        wandb.init(project=wandb_project, name=wandb_run_name or os.path.basename(os.path.abspath(out_dir)),
                   config=run_config, resume='allow')

# training loop
step = start_step
step_times, est_s = [], None  # for the expected time of the run
while True:
    # estimate and save at step boundaries; a resumed run already did both at start_step
    if master and (step != start_step or init_from == 'scratch'):
        if step % est_interval == 0 or step == train_steps:
            t0 = time.time()
            last_est = estimate_loss()
            est_s = time.time() - t0
            if not all(math.isfinite(v) for v in last_est.values()):
                stop(f"loss estimate is not finite ({last_est})", step)
            improved = last_est['val'] < best_val_loss
            best_val_loss = min(best_val_loss, last_est['val'])
            best_step = step if improved else best_step
            print(f"step {step}: train loss {last_est['train']:.4f}, val loss {last_est['val']:.4f}"
                  f"{' (best)' if improved else ''} [{time.time() - t0:.1f} s]", flush=True)
            rec = {'type': 'est', 'step': step, 'train': last_est['train'], 'val': last_est['val'],
                   'best_val': best_val_loss, 'tokens': step * tokens_per_step, 'epochs': epochs(step),
                   'time': round(elapsed(), 2)}
            if model_config.arch == 'aed' and model_config.embedding_loss_type != 'NONE':
                # on one fixed training batch (no RNG drawn: the run stays what it was): is the loss still teaching?
                X, _ = get_batch(train_data, est_offsets(0, train_data)[0])
                rec['emb_diag'] = raw_model.embedding_loss_diagnostics(X)
            log_record(rec)
            if wandb_log:
                wandb.log({'step': step, 'est/train': last_est['train'], 'est/val': last_est['val']})
            save_checkpoint(step, also_best=improved)
            write_summary('finished' if step >= train_steps else 'running', step, last_est)
        elif save_interval and step % save_interval == 0:
            save_checkpoint(step, also_best=False)
    if step >= train_steps:
        break

    lr_now = get_lr(step)
    for group in optimizer.param_groups:
        group['lr'] = lr_now
    t0 = time.time()
    offsets = train_offsets(step)
    stats = torch.zeros(4, device=device)  # summed over micro-steps: loss, ce, embedding loss, #embedding losses
    data_s = 0.0  # time spent fetching batches: logged, so a slow data path shows
    for micro in range(micro_steps):
        t_data = time.time()
        X, Y = get_batch(train_data, offsets[micro])
        data_s += time.time() - t_data
        # DDP: all-reduce the gradients on the last micro-step only
        sync = model.no_sync() if ddp and micro < micro_steps - 1 else nullcontext()
        with sync:
            with autocast:
                _, loss = model(X, Y, return_logits=full_logits)
            scaler.scale(loss / micro_steps).backward()
        stats[0] += loss.detach().float()
        stats[1] += raw_model.last_ce.float()
        if raw_model.last_embedding_loss is not None:
            stats[2] += raw_model.last_embedding_loss.float()
            stats[3] += 1
    if ddp:
        dist.all_reduce(stats)  # every rank sees the same numbers, so all stop together on NaN
    loss_v, ce_v, emb_sum, emb_n = stats.tolist()
    n = micro_steps * world_size
    loss_v, ce_v, emb_v = loss_v / n, ce_v / n, (emb_sum / emb_n if emb_n else None)
    if not math.isfinite(loss_v):
        stop(f"training loss is {loss_v}", step)
    if grad_clip > 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(raw_model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    if device_type == 'cuda':
        torch.cuda.synchronize()  # honest step times
    dt = time.time() - t0
    step += 1

    if master:
        tok_s = tokens_per_step / dt
        mfu = flops_per_step / dt / world_size / peak_flops if peak_flops else None
        log_record({'type': 'step', 'step': step, 'loss': loss_v, 'ce': ce_v, 'emb': emb_v, 'lr': lr_now,
                    'ms': round(dt * 1000, 2), 'data_ms': round(data_s * 1000, 3), 'tok_s': round(tok_s, 1), 'mfu': mfu,
                    'tokens': step * tokens_per_step, 'epochs': epochs(step), 'time': round(elapsed(), 2)})
        if step % log_interval == 0 or step == train_steps:
            emb_txt = f" | emb {emb_v:.3e}" if emb_v is not None else ""
            mfu_txt = f" | mfu {mfu * 100:.1f}%" if mfu is not None else ""
            print(f"step {step}/{train_steps} | loss {loss_v:.4f} | ce {ce_v:.4f}{emb_txt} | lr {lr_now:.2e} | "
                  f"epoch {epochs(step):.2f} | {dt * 1000:.0f} ms | {tok_s:,.0f} tok/s{mfu_txt}", flush=True)
            if wandb_log:
                wandb.log({'step': step, 'train/loss': loss_v, 'train/ce': ce_v, 'train/emb': emb_v, 'lr': lr_now,
                           'tok_s': tok_s, 'mfu': mfu})
        step_times.append(dt)
        if len(step_times) in (1, 10) and step < train_steps:
            # the time the rest will take, from the first step and then from the median of steps 2-10: on hardware
            # too slow for the config the user knows at once
            per_step = statistics.median(step_times[1:]) if len(step_times) > 1 else dt
            n_est = train_steps // est_interval - (step - 1) // est_interval + (train_steps % est_interval != 0)
            rest = per_step * (train_steps - step) + (est_s or 0.0) * n_est
            est_txt = f" and {n_est} estimate(s) of ~{duration(est_s)}" if est_s is not None else ""
            print(f"expected: {per_step * 1000:,.0f} ms/step "
                  f"({'the first step' if len(step_times) == 1 else 'median of steps 2-10'}), so "
                  f"~{duration(rest)} for the {train_steps - step:,} steps left{est_txt}: "
                  f"the whole run ~{duration(elapsed() + rest)}", flush=True)

if master:
    mem_txt = f", peak GPU memory {peak_gpu_memory_mib():,} MiB" if device_type == 'cuda' else ""
    print(f"done: {step} steps, {step * tokens_per_step:,} tokens, best val loss {best_val_loss:.4f}, "
          f"{elapsed():.0f} s{mem_txt}; checkpoints in {out_dir}", flush=True)
    log_file.close()
if ddp:
    dist.barrier()  # rank 0 may still be estimating and saving: tearing gloo down under it aborts
    dist.destroy_process_group()
