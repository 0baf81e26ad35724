"""
Train the auto-regressive encoder-decoder (AED) model or the decoder-only GPT baseline.

One process (CPU, or one GPU):
$ python train.py config/cpu_aed_mse_possub.py
DDP on one node with 8 GPUs (more nodes, and DDP on a CPU: docs/training.md):
$ torchrun --standalone --nproc_per_node=8 train.py config/aed_mse_possub.py
Any key below can be set by a config file (plain Python) and/or --key=value. What a run prints and
writes: docs/training.md; what survives a kill, a full disk or bad input: docs/robustness.md.
"""
from configurator import catch_signals
catch_signals()  # first (importing torch takes seconds): Ctrl-C or SIGTERM ends in one line

import functools
import json
import math
import os
import statistics
import sys
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from checkpoint import load, run_config
from configurator import ConfigError, die, first_line, resolve_device
from model import Transformer
from rundir import RunDir

print = functools.partial(print, flush=True)  # every line shows at once, in a log file too

# -----------------------------------------------------------------------------
# defaults: the author's common settings (docs/model.md, The author's settings)
# I/O
out_dir = 'out'        # checkpoints, log.jsonl and summary.json go here
init_from = 'scratch'  # 'scratch' or 'resume' (continue from out_dir/ckpt_last.pt)
overwrite = False      # True: a scratch run may replace the run in out_dir (else it is refused)
est_interval = 500     # estimate train/val loss every this many steps, and at the end
est_steps = 200        # batches of batch_size per split in each estimate
log_interval = 1       # print a line every this many steps (log.jsonl gets every step)
save_interval = 0      # also save ckpt_last.pt every this many steps (0: at estimates only)
# data
data_dir = 'data'      # where prepare.py wrote the data
dataset = 'wikipedia'  # reads data_dir/dataset/{train,val}.bin (python prepare.py makes them)
train_tokens = 0       # train on the first this many tokens of train.bin only (0: all of it)
batch_size = 50        # a step: batch_size x gradient_accumulation_steps sequences, all ranks
gradient_accumulation_steps = 16  # split across DDP ranks; not a step's forwards (micro_batch)
micro_batch = 200      # a step's forwards: fewest with at most this many rows (0: batch_size)
# model: every field of model.py's ModelConfig is a key too (arch, vocab_size, context_size, ...)
# AdamW optimizer
lr = 9e-4              # peak learning rate
beta1 = 0.9            # AdamW's betas
beta2 = 0.95
weight_decay = 0.1     # on weights with dim >= 2 only
grad_clip = 0.0        # clip the global grad norm at this value; 0 = off (the author's runs)
train_steps = 9000     # optimizer steps
# learning rate schedule
decay_lr = True        # False: lr constant (no warm-up either)
warmup_iters = 300
lr_decay_iters = 700000  # cosine decay to min_lr by here: ~constant over 9k steps (the author's)
min_lr = 9e-5
# DDP and system
ddp_timeout = 600      # seconds a DDP rank waits in a collective before the run stops
device = 'auto'        # 'auto' (cuda if available, else cpu), 'cpu', 'cuda', 'cuda:1', 'mps'
dtype = 'auto'         # 'auto' (bfloat16 on cuda if supported, else float16; float32 elsewhere)
compile = True         # torch.compile the model (the CPU presets turn it off: docs/performance.md)
compile_mode = 'auto'  # 'auto': reduce-overhead (CUDA graphs) on CUDA, else default
seed = 1337            # the init, the batches and dropout all follow from it
# -----------------------------------------------------------------------------
try:  # the keys above and ModelConfig's, from argv (--help lists them); a resume: the run's own
    # config, what this command changes in it, and its checkpoint
    config, model_config, ckpt, changes = run_config(globals(), sys.argv[1:])
    # every key a global, as nanoGPT's configurator does, as given (device 'auto', a None of
    # ModelConfig's): the run saves config, so a resume on other hardware works; model_config
    # holds the model's options resolved (n_decoder_layer None: n_layer)
    globals().update(config)
    device, device_type, dtype, autocast = resolve_device(device, dtype)
except ConfigError as e:
    die(e)
ddp = 'RANK' in os.environ  # DDP: torchrun sets RANK, LOCAL_RANK, WORLD_SIZE
rank, local_rank = int(os.environ.get('RANK', 0)), int(os.environ.get('LOCAL_RANK', 0))
world_size = int(os.environ.get('WORLD_SIZE', 1))
master = rank == 0  # rank 0 logs, estimates and saves
modes = ('auto', 'default', 'reduce-overhead', 'max-autotune-no-cudagraphs', 'max-autotune')
for keys, rule, ok in [  # what the type check cannot catch (a negative min_lr is gradient ascent)
        ('init_from', "be 'scratch' or 'resume'", lambda v: v in ('scratch', 'resume')),
        ('compile_mode', f"be one of {', '.join(modes)}", lambda v: v in modes),
        ('out_dir', 'not be empty', bool),
        ('lr batch_size gradient_accumulation_steps est_interval est_steps log_interval '
         'ddp_timeout', 'be > 0', lambda v: v > 0),
        ('lr min_lr weight_decay grad_clip', 'be finite', math.isfinite),
        ('train_steps save_interval seed warmup_iters train_tokens min_lr weight_decay grad_clip '
         'micro_batch', 'be >= 0', lambda v: v >= 0),
        ('beta1 beta2', 'be in [0, 1)', lambda v: 0 <= v < 1),
        ('lr_decay_iters', 'be > warmup_iters', lambda v: not decay_lr or v > warmup_iters),
        ('gradient_accumulation_steps', f'be divisible by the number of processes ({world_size})',
         lambda v: v % world_size == 0)]:
    for k in keys.split():
        if not ok(config[k]):
            die(f"{k} must {rule}, got {config[k]!r}")
# a step's forwards are not gradient_accumulation_steps of batch_size rows: they are the fewest
# of equal size with micro_batch rows at most (4 of 200 by default), for speed. The gradients are
# the same: each forward's loss is a mean over its rows, divided by micro_steps
rank_rows = gradient_accumulation_steps // world_size * batch_size  # a step's sequences per rank
micro_steps = 1  # forwards a step, per rank
while rank_rows % micro_steps or rank_rows // micro_steps > (micro_batch or batch_size):
    micro_steps += 1
forward_rows = rank_rows // micro_steps  # sequences a forward
if compile_mode == 'auto':  # CUDA graphs: ~3x faster steps for the author's (docs/gpu.md)
    compile_mode = 'reduce-overhead' if device_type == 'cuda' else 'default'
graphs = compile and compile_mode in ('reduce-overhead', 'max-autotune')  # CUDA graphs
if graphs and device_type != 'cuda':
    die(f"compile_mode {compile_mode} uses CUDA graphs: on CUDA only")
mark_step = torch.compiler.cudagraph_mark_step_begin if graphs else lambda: None  # CUDA graphs only
if ddp:
    if device_type == 'cuda':
        device = f'cuda:{local_rank}'
        torch.cuda.set_device(device)
    try:  # a rank that hangs or never shows up stops the others after ddp_timeout (gloo: 30 min)
        dist.init_process_group('nccl' if device_type == 'cuda' else 'gloo',
                                timeout=timedelta(seconds=ddp_timeout))
    except dist.DistError as e:
        die(f"DDP start-up failed on rank {rank}: {first_line(e)}")
tokens_per_step = gradient_accumulation_steps * batch_size * context_size  # all ranks together

# data: each split's memmap is opened once; batches are random offsets, with replacement
data_path = os.path.join(data_dir, dataset)
def open_split(split, limit=0):  # limit > 0: the first `limit` tokens only, none past them
    path = os.path.join(data_path, f'{split}.bin')
    if not os.path.isfile(path):  # the command that makes this dataset
        flags = {'wikipedia': '', 'wikipedia_bytes': ' --tokenizer=bytes'}.get(
            dataset, f' --input=<your text> --name={dataset}')
        if data_dir != 'data':
            flags += f' --data_dir={data_dir}'
        die(f"{path} not found: run python prepare.py{flags} (docs/data.md)")
    try:
        data = np.memmap(path, dtype=np.uint16, mode='r')
    except ValueError:  # an odd number of bytes, or none
        die(f"{path} is not uint16 token ids: {os.path.getsize(path)} bytes")
    if limit > len(data):
        die(f"train_tokens ({limit:,}) is more than {path} holds ({len(data):,})")
    if len(data[:limit or None]) < context_size + 2:
        die(f"train_tokens ({limit}) is too small for one batch (context_size + 2)" if limit
            else f"{path} has {len(data)} tokens, fewer than context_size + 2")
    return data[:limit or None]

train_data, val_data = open_split('train', train_tokens), open_split('val')
meta_path, meta = os.path.join(data_path, 'meta.json'), {}
if os.path.isfile(meta_path):  # prepare.py's record: the model's vocabulary must be the data's
    try:
        meta = json.load(open(meta_path))
        meta_vocab = meta.get('vocab_size', vocab_size)
    except (ValueError, AttributeError):
        die(f"{meta_path} is not prepare.py's record (a JSON object): run prepare.py again")
    if meta_vocab != vocab_size:
        advice = f"set --vocab_size={meta_vocab} (as config/bytes_*.py do)"
        if ckpt is not None:  # a resume keeps its vocabulary
            advice = f"the run in {out_dir} cannot continue on this data"
        die(f"{data_path} holds ids of a vocabulary of {meta_vocab}, but vocab_size is "
            f"{vocab_size}: {advice}")
tokenizer = 'bytes' if meta.get('tokenizer') == 'bytes' else 'gpt2'  # sample.py decodes with it

def get_batch(data, ix):  # ix: (B,) start offsets -> x, y: (B, T) int64, y shifted by one
    rows = torch.from_numpy(data[ix[:, None] + np.arange(context_size + 1)].astype(np.int64))
    if rows.max() >= vocab_size:  # here, not an IndexError in the model (a device assert on CUDA)
        die(f"{data_path} holds token id {rows.max()}, but vocab_size is {vocab_size}")
    x, y = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
    if device_type == 'cuda':
        x, y = x.pin_memory(), y.pin_memory()
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

def train_offsets(step):
    # a step's batch depends on (seed, step) only, each rank taking its own rows: N ranks see what
    # one process accumulating N times sees, and a resumed run draws what an uninterrupted one would
    rng = np.random.default_rng([seed, 0, step])
    ix = rng.integers(0, len(train_data) - context_size, gradient_accumulation_steps * batch_size)
    return ix.reshape(world_size, micro_steps, forward_rows)[rank]

def est_starts(split_id, data):  # the same batches at every estimate: only the model differs
    rng = np.random.default_rng([seed, 1, split_id])
    return rng.integers(0, len(data) - context_size, est_steps * batch_size)
est_batches = {'train': (train_data, est_starts(0, train_data)),
               'val': (val_data, est_starts(1, val_data))}
# all of val.bin in consecutive windows: the same tokens for every seed and run
whole_val = (val_data, np.arange((len(val_data) - 1) // context_size) * context_size)

# model init: the same weights on every rank (the same seed, or checkpoint)
torch.manual_seed(seed)
model = raw_model = Transformer(model_config).to(device)  # raw: uncompiled
# rank 0 takes out_dir (one run at a time); a signal or a lost DDP rank now waits for a save
run = RunDir(out_dir, ckpt, overwrite, master)
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == 'float16'))  # a no-op but with fp16
optimizer = model.configure_optimizers(weight_decay, lr, (beta1, beta2), device_type)
params = [p for p in model.parameters() if p.requires_grad]  # a frozen one gets no gradient
if graphs:  # kept .grad buffers, zeroed in place: a CUDA graph's memory is never a .grad
    for p in params:
        p.grad = torch.zeros_like(p)
start_step = run.step
# RNG for dropout: a seed per rank and start step, so ranks drop different units; rank 0 then
# restores the saved state, so a single-process resume is exact (other ranks draw afresh)
torch.manual_seed(int(np.random.SeedSequence([seed, 2, rank, start_step]).generate_state(1)[0]))
if ckpt is not None:
    model.load_state_dict(ckpt['model'])  # checkpoint.load checked every shape
    try:
        optimizer.load_state_dict(ckpt['optimizer'])
    except (ValueError, KeyError, TypeError) as e:  # a fork changed what trains
        master and print(f"warning: the optimizer state does not fit ({first_line(e)}): AdamW "
                         f"starts afresh", file=sys.stderr)
    if ckpt['scaler']:  # empty when saved without fp16
        scaler.load_state_dict(ckpt['scaler'])
    if master:
        torch.set_rng_state(ckpt['rng']['torch'])
        if device_type == 'cuda' and ckpt['rng']['cuda'] is not None:
            torch.cuda.set_rng_state(ckpt['rng']['cuda'])
    del ckpt  # free the loaded tensors

# MFU on CUDA, against an H100's dense bf16 peak: on other GPUs a figure to compare runs by
gpu = torch.cuda.get_device_name(device) if device_type == 'cuda' else None
flops_per_step = raw_model.flops_per_token() * tokens_per_step
if master:  # the header first: a slow start (compiling, a config too big) is never silent
    print(f"{arch} model, {raw_model.get_num_params():,} params | {tokens_per_step:,} "
          f"tokens/step (batch {batch_size} x context {context_size} x accumulation "
          f"{gradient_accumulation_steps}, {micro_steps} forward(s) of {forward_rows}) | "
          f"{len(train_data):,} train tokens{'' if train_tokens else ' (all)'} of "
          f"{data_path} | {world_size} process(es), {device}, {dtype}, "
          f"compile {compile_mode if compile else 'off'}"
          f"{f' | {gpu}, MFU of 989 TFLOP/s' if gpu else ''}")
    if init_from == 'resume':
        print(f"resuming from {os.path.join(out_dir, 'ckpt_last.pt')} at step {start_step}"
              + "".join(f"; {k}: {old!r} -> {new!r}" for k, old, new in changes))
        if start_step >= train_steps:
            print(f"finished at step {start_step}: --train_steps=N (N > {start_step}) trains on")

if compile and start_step < train_steps:  # (a finished run takes no step)
    if master:
        print("compiling the model in the first step: about a minute (--compile=False skips it)")
    model = torch.compile(model, mode=compile_mode, dynamic=False)  # B static (estimates differ)

@torch.no_grad()
def mean_ce(m, data, starts):
    # eval-mode cross-entropy (no dropout, no other loss term) of the windows at starts (N,)
    total = 0.0
    m.eval()
    for i in range(0, len(starts), batch_size):
        X, Y = get_batch(data, starts[i:i + batch_size])
        mark_step()
        with autocast:
            total += m(X, Y, return_logits=False)[2]['ce'].float() * len(X)
    m.train()
    return total.item() / len(starts)

def get_lr(step):
    # the author's schedule (docs/model.md), step 0-based: linear warm-up, then cosine decay to
    # min_lr at lr_decay_iters; both count step + 1 (nanoGPT's warm-up is up to 0.33% lower)
    if not decay_lr:
        return lr
    if step + 1 < warmup_iters:
        return lr * (step + 1) / warmup_iters
    if step + 1 > lr_decay_iters:
        return min_lr
    ratio = (step + 1 - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)

run.start(train_steps, tokens_per_step, train_tokens=len(train_data), world_size=world_size,
          device=device, dtype=dtype, params=raw_model.get_num_params(),
          compiled=model is not raw_model, gpu=gpu, torch=torch.__version__, config=config)

def checkpoint():  # what a resume needs, beside the step, best and clock RunDir.save adds
    rng = {'torch': torch.get_rng_state(),
           'cuda': torch.cuda.get_rng_state() if device_type == 'cuda' else None}
    return {'model': raw_model.state_dict(), 'optimizer': optimizer.state_dict(),
            'scaler': scaler.state_dict(), 'config': config, 'rng': rng, 'tokenizer': tokenizer}

def duration(s):
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.1f} min" if s < 90 * 60 else f"{s / 3600:.1f} h"

def forecast(step):  # after 10 steps, once: a slow config shows early
    per_step = statistics.median(step_times[1:])
    n_est = sum(s % est_interval == 0 or s == train_steps for s in range(step, train_steps + 1))
    rest = per_step * (train_steps - step) + (est_s or 0.0) * n_est  # est_s: None until timed
    return (f"expected: {per_step * 1000:,.0f} ms/step (median of steps 2-10), ~{duration(rest)} "
            f"for the {train_steps - step:,} steps and {n_est} estimate(s) left: the whole run "
            f"~{duration(run.clock(step)['time'] + rest)}")

# training loop
step, est_s, step_times = start_step, None, []
while True:
    # estimate and save at step boundaries; a resumed run already did both at start_step
    fresh = master and (step != start_step or init_from == 'scratch')
    if fresh and (step % est_interval == 0 or step == train_steps):
        t0 = time.time()
        est = {split: mean_ce(model, *batches) for split, batches in est_batches.items()}
        est_s = time.time() - t0
        improved = run.estimate(step, est)  # logged, the best kept; a non-finite one stops the run
        print(f"step {step}: estimate train ce {est['train']:.4f}, val ce {est['val']:.4f}"
              f"{' (best)' if improved else ''} [{est_s:.1f} s]")
        run.save(step, checkpoint(), best=improved)  # atomic; refuses NaN
    elif fresh and save_interval and step % save_interval == 0:
        run.save(step, checkpoint())
    if step >= train_steps:
        break

    lr_now = get_lr(step)
    for group in optimizer.param_groups:  # a group may carry its own scale (a fork's)
        group['lr'] = lr_now * group.get('lr_scale', 1.0)
    t0 = time.time()
    sums = {}  # the loss and its parts (ce, emb, a fork's own), each summed over micro-steps
    data_s = 0.0  # time spent fetching batches: logged, so a slow data path shows
    for ix in train_offsets(step):  # micro_steps forwards of forward_rows sequences (see above)
        t_data = time.time()
        X, Y = get_batch(train_data, ix)
        data_s += time.time() - t_data
        mark_step()  # a new forward: CUDA graphs may reuse memory
        with autocast:
            _, loss, parts = model(X, Y, return_logits=False)  # the loss alone: no logits kept
        # the same gradients two ways (tests/test_step.py): .backward() as nanoGPT (faster), or
        # under CUDA graphs added in one op (AccumulateGrad can fail or corrupt them); there a
        # parameter the loss does not reach gets zeros, not None (AdamW's weight decay moves it)
        if graphs:
            torch._foreach_add_([p.grad for p in params], torch.autograd.grad(
                scaler.scale(loss / micro_steps), params, materialize_grads=True))
        else:
            scaler.scale(loss / micro_steps).backward()
        for k, v in {'loss': loss.detach(), **parts}.items():
            sums[k] = sums.get(k, 0.0) + v.float()
    # one tensor: one all-reduce, one wait for the device; zip below matches it back to the keys
    # (the same keys in the same order on every rank: forward's parts)
    stats = torch.stack(list(sums.values()))
    # DDP without its wrapper: the mean of the ranks' gradients in one all-reduce, outside the
    # compiled model, so a CUDA graph can hold the whole step (docs/training.md)
    if ddp:
        grads = [p.grad for p in params if p.grad is not None]  # None alike on every rank
        flat = torch.cat([g.flatten() for g in grads]).div_(world_size)
        dist.all_reduce(flat)
        for g, mean in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(mean.view_as(g))
        dist.all_reduce(stats)  # every rank sees the same numbers, so all stop together on NaN
    means = {k: v / (micro_steps * world_size) for k, v in zip(sums, stats.tolist())}
    if not math.isfinite(means['loss']):  # on every rank: the numbers are all-reduced
        run.stop(step, "the training loss is not finite")
    if grad_clip > 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(raw_model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=not graphs)
    if device_type == 'cuda':
        torch.cuda.synchronize()  # honest step times
    dt = time.time() - t0
    step += 1
    run.step = step  # the step a signal or a lost rank stops at (RunDir's stop names it)
    if not master:  # rank 0 alone logs
        continue
    step_times.append(dt)
    tok_s = tokens_per_step / dt
    mfu = flops_per_step / dt / world_size / 989e12 if gpu else None
    record = {'type': 'step', 'step': step, **means, 'emb': means.get('emb'), 'lr': lr_now,
              'ms': round(dt * 1000, 2), 'data_ms': round(data_s * 1000, 3),
              'tok_s': round(tok_s, 1), 'mfu': mfu, **run.clock(step)}
    run.log(record)
    if step % log_interval == 0 or step == train_steps:
        terms = "" if 'emb' not in means else (  # the loss the optimizer sees, and its parts
            f" (ce {means['ce']:.4f} + {model_config.embedding_loss_coeff:g} x emb "
            f"{means['emb']:.3e})")
        print(f"step {step}/{train_steps} | loss {means['loss']:.4f}{terms} | lr {lr_now:.2e} "
              f"| epoch {record['epochs']:.2f} | {dt * 1000:.0f} ms | {tok_s:,.0f} tok/s"
              f"{f' | mfu {mfu * 100:.1f}%' if mfu else ''}")
    if len(step_times) == 10 and step < train_steps:
        print(forecast(step))

# the last and the best model on all of val.bin (eager); a finished run that resumes has its scores
if master and step >= train_steps and not run.whole:
    two = run.best_step not in (None, step)  # a best model other than the last
    n_tokens = len(whole_val[1]) * context_size
    print(f"scoring {'the last and the best model' if two else 'the model'} on all of val.bin "
          f"({n_tokens:,} tokens)")
    last = best = mean_ce(raw_model, *whole_val)
    if two:  # the training is over: raw_model takes the best weights
        try:
            raw_model.load_state_dict(load(os.path.join(out_dir, 'ckpt_best.pt'))[0]['model'])
        except ConfigError as e:  # (a CheckpointError)
            die(e)
        best = mean_ce(raw_model, *whole_val)
    run.finish(step, last, best, n_tokens)  # logged, and in summary.json
    print(f"all of val.bin ({n_tokens:,} tokens): ce {last:.4f} at the end, {best:.4f} at the best "
          f"estimate (step {run.best_step})")
if master:
    mem = f", peak GPU memory {torch.cuda.max_memory_allocated(device) >> 20:,} MiB" if gpu else ""
    clock = run.clock(step)
    print(f"done: {step} steps, {clock['tokens']:,} tokens, best val {run.best_val_loss:.4f}, "
          f"{clock['time']:.0f} s{mem}; sample: python sample.py --out_dir={out_dir}")
if ddp:
    dist.barrier()  # rank 0 may still be estimating and saving: tearing gloo down under it aborts
    dist.destroy_process_group()
