"""
Speed and memory of the whole pipeline, measured on this machine:
  1. training steps: GPT and AED at matched size, eager and compiled
  2. generation: without the KV cache, with it, and with it and the compiled one-token step
  3. data loading from the memmap, as a share of a training step (read from train.py's own log)
  4. prepare.py's tokenization against tiktoken's encode_ordinary_batch with all cores
  5. peak memory of a training step
  6. (params, only when asked for) parameters and FLOPs per token of each config/ file (meta device)
  7. (step, only when asked for; made for a GPU) the author's training step in variants: compile
     mode x micro-batch split x gradient accumulation, each with a gradient check, peak memory and
     a profile of one step, within a time budget (see bench_step; --dry: its flow on CPU)
Prints a table and writes the figures as JSON (out_json).

    python bench.py                     # sections 1-5; docs/performance.md says how long, on what
    python bench.py --sections=memory   # some sections (train,generate,data,prepare,memory,step)
    python bench.py --quick             # half a minute: a check of the plumbing
    python bench.py --sections=step     # on a GPU: the author's step in variants (docs/gpu.md)
    python bench.py --sections=params   # each config's params and FLOPs/token (seconds, no timing)
    python bench.py config/bytes_baseline.py config/bytes_aed_mse_possub.py --repeats=30

Config files (train.py's, as train.py reads them) replace the train section's presets: each one's
optimizer step is timed as train.py runs it (its batch, micro-batch split, dtype, compile, dropout),
interleaved, with its median ms/step and its ratio to the first config's. A train.py key given as
--key=value (--n_layer=1) applies to every config; with config files, sections defaults to train.

Timings on a shared machine are noisy: variants that are compared are run interleaved, one step of
each in turn, and the median is reported, so their ratio is measured under the same conditions. Run
it on an idle machine: with another process on one of the 2 cores, 2 OpenMP threads wait on each
other and every figure can be many times worse. Uncached generation is timed at every 8th length
(see uncached_lengths), and the memory probes fork from a server that imported torch once.
"""

import glob
import json
import multiprocessing
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from checkpoint import atomic_write, model_config_of
from configurator import (ConfigError, collect_defaults, die, first_line, load_config,
                          resolve_device, unknown_key_error)
from engine import Engine
from model import ModelConfig, Transformer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "experiments"))
from report import train_defaults  # noqa: E402 (train.py's keys, read from its source)

# -----------------------------------------------------------------------------
quick = False  # a check of the plumbing in seconds: small models at batch 1, nothing compiled
device = "auto"  # 'auto' (cuda if available), 'cpu', 'cuda'
repeats = 0  # timed runs per measurement (generation: a third as many); 0: 3 with quick, else 5
out_json = "bench.json"
sections = "train,generate,data,prepare,memory"  # parts to run, comma-separated (step: when named)
step_models = "aed,gpt"  # step: the author's models (config/aed_mse_possub.py, config/baseline.py)
step_budget = 380  # step: seconds from the start; a variant that would end past them is skipped
step_steps = 5  # step: timed optimizer steps a variant
step_prewarm = True  # step: child processes compile the later variants while the first compiles
dry = False  # step: its flow on CPU, 2-block models, torch.compile's eager backend (a logic check)
step_worker = ""  # (internal: a prewarm child compiles these STEP_PLAN variants and exits)
# -----------------------------------------------------------------------------
defaults = collect_defaults(globals())
config_files, config_overrides, configs = [], [], []  # the train section's, when files are given

# nanoGPT's train.py on its reference config here: 4 layers, 128 wide, 4 heads, GPT-2 vocab,
# batch 16 x 128
NANOGPT_REF = dict(arch="gpt", n_layer=4, n_embed=128, n_head=4, context_size=128)
QUICK_BATCH = 1  # quick: the small models' batch (16 otherwise), a check of the plumbing
SMALL_AED = dict(arch="aed", n_layer=2, n_embed=128, n_head=4, context_size=128,
                 embedding_loss_type="MSE", embedding_loss_coeff=8.0,
                 sub_pos_embed_to_decoder="YES_NO_LN")
# the author's two headline models (docs/model.md, The author's runs)
AUTHOR_GPT = dict(arch="gpt", n_layer=26, n_embed=160, n_head=10, context_size=200)
AUTHOR_AED = dict(arch="aed", n_layer=13, n_embed=150, n_head=5, cross_attn_n_head=10,
                  context_size=200, embedding_loss_type="MSE", embedding_loss_coeff=8.0,
                  detach_type="ENCODER_OUT", embedding_ln_type="INIT", use_ln_on_encoder_out=True,
                  sub_pos_embed_to_decoder="YES_NO_LN")


def machine():
    if device_type == "cuda":
        name = torch.cuda.get_device_name()
    else:
        name = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                name = next(line.split(":", 1)[1].strip() for line in f
                            if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
    return {"device": device_type, "name": name, "threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version()}


def sync():
    if device_type == "cuda":
        torch.cuda.synchronize()


def interleaved_times(fns, n, warm_up=1):
    """Seconds of each call of each fn in fns (a dict), running one call of each in turn, n rounds,
    after warm_up calls of each."""
    times = {name: [] for name in fns}
    for name, fn in fns.items():
        for _ in range(warm_up):
            fn()  # (and compilation)
    for _ in range(n):
        for name, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
    return times


def interleaved(fns, n, warm_up=1):
    """Median seconds of each fn in fns, timed as interleaved_times does."""
    return {name: statistics.median(ts) for name, ts in interleaved_times(fns, n, warm_up).items()}


def matmul_peak():
    """FLOP/s of a large matmul in the training dtype: the ceiling a training step can approach."""
    # quick and dry check the plumbing: a small matmul will do
    n = 8192 if device_type == "cuda" else 512 if quick or dry else 2048
    dt = torch.float32 if device_type == "cpu" else torch.bfloat16
    a, b = torch.randn(n, n, device=device, dtype=dt), torch.randn(n, n, device=device, dtype=dt)
    a @ b  # warm-up
    best = float("inf")
    # a peak is the best this machine can do: the fastest run, not the median
    for _ in range(max(5, repeats)):
        sync()
        t0 = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def train_step_fn(model_kwargs, batch_size, compiled=False):
    """A closure running one optimizer step as train.py does (forward, backward, AdamW step)."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**model_kwargs)).to(device)
    optimizer = model.configure_optimizers(0.1, 9e-4, (0.9, 0.95), device_type)
    raw = model
    if compiled:
        model = torch.compile(model)
    T, V = raw.config.context_size, raw.config.vocab_size
    x = torch.randint(0, V, (batch_size, T), device=device)
    y = torch.randint(0, V, (batch_size, T), device=device)

    def step():
        with autocast():
            _, loss, _ = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, raw


def save_results():
    atomic_write(out_json, lambda f: f.write(json.dumps(results, indent=1).encode()))


def autocast():
    if device_type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def bench_train():
    rows = []
    peak = results["matmul_peak_flops"]

    def record(label, kwargs, batch_size, seconds, raw):
        tokens = batch_size * raw.config.context_size
        flops = raw.flops_per_token() * tokens / seconds
        rows.append({"run": label, "params": raw.get_num_params(),
                     "batch": f"{batch_size}x{raw.config.context_size}",
                     "ms_per_step": 1000 * seconds, "tokens_per_s": tokens / seconds,
                     "flops_per_s": flops, "share_of_matmul_peak": flops / peak,
                     "flops_per_token": raw.flops_per_token()})
        print(f"  {label:40s} {1000 * seconds:8.0f} ms/step {tokens / seconds:9.0f} tok/s "
              f"{flops / peak:6.1%} of peak", flush=True)

    def pair(name, tag, aed_label, gpt_label):
        ra, rg = (next(r for r in rows if r["run"] == aed_label),
                  next(r for r in rows if r["run"] == gpt_label))
        ratio = {"pair": f"{name} {tag}",
                 "time_ratio_aed_over_gpt": ra["ms_per_step"] / rg["ms_per_step"],
                 "flops_ratio_aed_over_gpt": ra["flops_per_token"] / rg["flops_per_token"],
                 "params_aed": ra["params"], "params_gpt": rg["params"]}
        results.setdefault("aed_vs_gpt", []).append(ratio)
        print(f"  AED/GPT {name} {tag}: time ratio {ratio['time_ratio_aed_over_gpt']:.2f}, "
              f"FLOPs ratio {ratio['flops_ratio_aed_over_gpt']:.2f}", flush=True)

    # (a) the nanoGPT reference config, eager and compiled; and the small AED, eager and compiled,
    # against it (the small pair's GPT is ours on this config): all in one interleaved group, each
    # model built once
    bs = QUICK_BATCH if quick else 16
    print(f"training, nanoGPT's reference config (4 x 128, 4 heads, batch {bs} x 128) and the "
          "small AED (2 + 2 x 128):", flush=True)
    variants = {"ours, eager": (NANOGPT_REF, {}),
                "ours, torch.compile": (NANOGPT_REF, dict(compiled=True)),
                "AED small eager": (SMALL_AED, {}),
                "AED small compiled": (SMALL_AED, dict(compiled=True))}
    if quick:
        del variants["ours, torch.compile"], variants["AED small compiled"]
    fns, raws = {}, {}
    for label, (kw, opts) in variants.items():
        fns[label], raws[label] = train_step_fn(kw, bs, **opts)
    for label, s in interleaved(fns, repeats).items():
        record(label, variants[label][0], bs, s, raws[label])
    for tag, ours in (("eager", "ours, eager"), ("compiled", "ours, torch.compile")):
        # the small pair's GPT: the same model, step and timings as ours on the reference config
        if ours in fns:
            rows.append(dict(next(r for r in rows if r["run"] == ours), run=f"GPT small {tag}"))
            pair("small", tag, f"AED small {tag}", f"GPT small {tag}")
    # (b) AED vs GPT at the author's ~16M sizes, batch cut for CPU time, eager
    if not quick:
        bs = 4 if device_type == "cpu" else 50
        print(f"training, AED vs GPT, author 16M, eager (batch {bs} x 200):", flush=True)
        fa, ra = train_step_fn(AUTHOR_AED, bs)
        fg, rg = train_step_fn(AUTHOR_GPT, bs)
        t = interleaved({"aed": fa, "gpt": fg}, repeats)
        record("AED author 16M eager", AUTHOR_AED, bs, t["aed"], ra)
        record("GPT author 16M eager", AUTHOR_GPT, bs, t["gpt"], rg)
        pair("author 16M", "eager", "AED author 16M eager", "GPT author 16M eager")
    results["train"] = rows


def read_train_config(path):
    """train.py's config from the file at path and config_overrides, checked as train.py checks
    what a step uses; a mistake raises ConfigError."""
    c = load_config(train_defaults(), [path, *config_overrides])
    try:
        model_config_of(c)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{path}: model config: {e}") from None
    for k in ("batch_size", "gradient_accumulation_steps"):
        if c[k] < 1:
            raise ConfigError(f"{path}: {k} must be > 0, got {c[k]}")
    modes = ("auto", "default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
    if c["compile_mode"] not in modes:
        raise ConfigError(f"{path}: compile_mode must be one of {', '.join(modes)}, "
                          f"got {c['compile_mode']!r}")
    dev_type = resolve_device(c["device"], c["dtype"])[1]
    if c["compile"] and c["compile_mode"] in ("reduce-overhead", "max-autotune") \
            and dev_type != "cuda":
        raise ConfigError(f"{path}: compile_mode {c['compile_mode']} uses CUDA graphs: on a CUDA "
                          f"device only")
    return c


def config_step_fn(c):
    """(step, info, warm-up steps): step is a closure running one optimizer step of train.py's
    config c as train.py runs it (model.Transformer, configure_optimizers, its micro-batch split,
    dtype, compile and dropout, .backward() or under CUDA graphs autograd.grad into kept .grad
    tensors, the loss sums read back), on random token ids already on the device: data loading is
    left out (the data section: ~0.02% of a step). The threads are torch's, as in train.py
    (OMP_NUM_THREADS)."""
    dev, dev_type, dtype, amp = resolve_device(c["device"], c["dtype"])
    rows = c["gradient_accumulation_steps"] * c["batch_size"]  # one process: no DDP split
    n_micro = next(n for n in range(1, rows + 1)
                   if rows % n == 0 and rows // n <= (c["micro_batch"] or c["batch_size"]))
    mode = c["compile_mode"]
    if mode == "auto":
        mode = "reduce-overhead" if dev_type == "cuda" else "default"
    graphs = c["compile"] and mode in ("reduce-overhead", "max-autotune")
    torch.manual_seed(c["seed"])
    raw = Transformer(model_config_of(c)).to(dev)
    optimizer = raw.configure_optimizers(c["weight_decay"], c["lr"], (c["beta1"], c["beta2"]),
                                         dev_type)
    scaler = torch.amp.GradScaler(dev_type, enabled=dtype == "float16")
    model = torch.compile(raw, mode=mode, dynamic=False) if c["compile"] else raw
    params = [p for p in raw.parameters() if p.requires_grad]
    if graphs:
        for p in params:
            p.grad = torch.zeros_like(p)
    g = torch.Generator().manual_seed(c["seed"])
    batches = [tuple(torch.randint(0, c["vocab_size"], (rows // n_micro, c["context_size"]),
                                   generator=g).to(dev) for _ in range(2)) for _ in range(n_micro)]
    mark_step = torch.compiler.cudagraph_mark_step_begin if graphs else lambda: None
    emb = raw.config.arch == "aed" and raw.config.embedding_loss_type != "NONE"

    def step():
        stats = torch.zeros(3, device=dev)
        for x, y in batches:
            mark_step()
            with amp:
                _, loss, parts = model(x, y, return_logits=False)
            if graphs:
                torch._foreach_add_([p.grad for p in params], torch.autograd.grad(
                    scaler.scale(loss / n_micro), params, materialize_grads=True))
            else:
                scaler.scale(loss / n_micro).backward()
            stats[0] += loss.detach().float()
            stats[1] += parts["ce"].float()
            if emb:
                stats[2] += parts["emb"].float()
        stats.tolist()  # train.py reads the sums every step: a wait for the device
        if c["grad_clip"] > 0.0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, c["grad_clip"])
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=not graphs)
        if dev_type == "cuda":
            torch.cuda.synchronize(dev)

    info = {"arch": c["arch"], "params": raw.get_num_params(), "device": dev, "dtype": dtype,
            "compile": mode if c["compile"] else "off", "dropout_rate": c["dropout_rate"],
            "batch": f"{c['batch_size']}x{c['context_size']}",
            "gradient_accumulation_steps": c["gradient_accumulation_steps"],
            "micro_steps": n_micro, "micro_batch": rows // n_micro,
            "tokens_per_step": rows * c["context_size"], "flops_per_token": raw.flops_per_token()}
    return step, info, 3 if graphs else 1  # CUDA graphs: recorded in the warm-up, then replayed


def bench_configs():
    """The training step of each config file given (config_files, with config_overrides on each),
    interleaved: each one's median ms/step and its ratio to the first config's."""
    fns, infos, warm_up = {}, {}, 1
    for path, c in zip(config_files, configs):
        n = sum(label.split(" (")[0] == path for label in fns)
        label = path if n == 0 else f"{path} ({n + 1})"  # a config twice: an A/A noise check
        fns[label], infos[label], w = config_step_fn(c)
        warm_up = max(warm_up, w)
    print(f"training step of each config, interleaved, {repeats} steps each after {warm_up} "
          f"warm-up(s), {torch.get_num_threads()} thread(s):", flush=True)
    print(f"  {'config':40s} {'params':>10s} {'batch':>9s} {'ms/step':>9s} {'q1-q3':>15s} "
          f"{'tok/s':>8s} {'/ first':>7s} {'paired':>7s}", flush=True)
    rows, first, times = [], None, interleaved_times(fns, repeats, warm_up)
    ref = next(iter(times.values()))
    for label, ts in times.items():
        ms = sorted(1000 * t for t in ts)
        # the median of the per-round ratios: a round's steps share the load of its moment
        paired = statistics.median(t / t0 for t, t0 in zip(ts, ref))
        median = statistics.median(ms)
        q1, _, q3 = statistics.quantiles(ms, n=4) if len(ms) > 1 else (median,) * 3
        info = infos[label]
        first = first or median
        tok_s = info["tokens_per_step"] / (median / 1000)
        row = {"config": label, **info, "steps": repeats, "ms_per_step": median, "ms_q1": q1,
               "ms_q3": q3, "ms_min": ms[0], "ms_max": ms[-1], "tokens_per_s": tok_s,
               "share_of_matmul_peak": info["flops_per_token"] * tok_s
               / results["matmul_peak_flops"], "ratio_to_first": median / first,
               "ratio_to_first_paired": paired, "ms_steps": [round(1000 * t, 3) for t in ts]}
        rows.append(row)
        print(f"  {label:40s} {info['params']:10,} {info['batch']:>9s} {median:9.1f} "
              f"{f'{q1:.1f}-{q3:.1f}':>15s} {tok_s:8.0f} {row['ratio_to_first']:7.3f} "
              f"{paired:7.3f}", flush=True)
    results["train_configs"] = rows


# the step section's variants, in order of value: (model, micro-batches of a step's sequences,
# compile mode, accumulation). 'backward' is .backward() through AccumulateGrad with the logits
# returned, each model's gradient reference; 'grad' is train.py's under CUDA graphs (autograd.grad
# into the kept .grad tensors, one foreach add, no logits). One micro-batch of 800 needs ~85 GB:
# left out.
STEP_PLAN = [("gpt", 16, "default", "backward"), ("gpt", 16, "reduce-overhead", "grad"),
             ("gpt", 4, "reduce-overhead", "grad"), ("aed", 16, "default", "backward"),
             ("aed", 4, "reduce-overhead", "grad"), ("aed", 16, "reduce-overhead", "grad"),
             ("gpt", 16, "default", "grad"), ("aed", 16, "default", "grad"),
             ("gpt", 4, "default", "grad"), ("aed", 4, "default", "grad"),
             ("gpt", 8, "reduce-overhead", "grad"), ("aed", 8, "reduce-overhead", "grad"),
             ("gpt", 16, "max-autotune-no-cudagraphs", "grad"),
             ("aed", 16, "max-autotune-no-cudagraphs", "grad")]
GRAD_WRONG = 5e-2  # relative gradient error that marks a variant wrong (bf16 rounding: ~1e-3)
# the first kind whose keys a kernel's name holds (cuDNN's attention is named ..._sm90_flash_...)
KERNEL_KINDS = {"triton": ("triton_",), "attention": ("flash", "fmha", "cudnn", "attention"),
                "gemm": ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90_", "sm80_"),
                "optimizer": ("multi_tensor", "adam", "foreach"),
                "memcpy/memset": ("memcpy", "memset", "Memcpy", "Memset")}


def kernel_kind(name):
    return next((k for k, keys in KERNEL_KINDS.items() if any(s in name for s in keys)), "other")


def step_label(variant):
    name, n_micro, mode, accumulate = variant
    return (f"{name} {n_micro}x{step_n_sequences // n_micro} {mode}"
            + (" .backward()" if accumulate == "backward" else ""))


class Step:
    """One optimizer step of a variant: the same fixed random sequences and initial weights in every
    variant of a model, each micro-batch's loss / n_micro, bf16 autocast on CUDA, fused AdamW, the
    stats train.py sums; batches already on the device. dry: a 2-block model, eager backend."""

    def __init__(self, variant):
        name, self.n, mode, self.accumulate = variant
        kw = AUTHOR_GPT if name == "gpt" else AUTHOR_AED
        if dry:
            kw = dict(kw, n_layer=2 if name == "gpt" else 1, vocab_size=512, context_size=16)
        torch.manual_seed(0)
        self.raw = Transformer(ModelConfig(**kw)).to(device)
        self.params = list(self.raw.parameters())
        self.optimizer = self.raw.configure_optimizers(0.1, 9e-4, (0.9, 0.95), device_type)
        self.model = torch.compile(self.raw, **({"backend": "eager"} if dry else {"mode": mode}))
        g = torch.Generator().manual_seed(1)
        x, y = (torch.randint(0, self.raw.config.vocab_size, (step_n_sequences,
                                                               kw["context_size"]), generator=g)
                for _ in range(2))
        self.batches = [(a.to(device), b.to(device)) for a, b in zip(x.chunk(self.n),
                                                                    y.chunk(self.n))]
        self.tokens = x.numel()
        if self.accumulate == "grad":  # train.py's: kept, zeroed in place
            for p in self.params:
                p.grad = torch.zeros_like(p)
        self.grads = [p.grad for p in self.params]
        self.stats = torch.zeros(2, device=device)

    def accumulate_grads(self):
        for x, y in self.batches:
            torch.compiler.cudagraph_mark_step_begin()
            with autocast():
                _, loss, parts = self.model(x, y, return_logits=self.accumulate == "backward")
            if self.accumulate == "backward":
                (loss / self.n).backward()
            else:
                torch._foreach_add_(self.grads, torch.autograd.grad(
                    loss / self.n, self.params, materialize_grads=True))
            self.stats[0] += loss.detach().float()
            self.stats[1] += parts["ce"].float()

    def zero(self):
        self.optimizer.zero_grad(set_to_none=self.accumulate == "backward")
        self.stats.zero_()

    def step(self):
        self.accumulate_grads()
        self.optimizer.step()
        self.zero()

    def grad_vector(self):
        return torch.cat([torch.zeros(p.numel()) if p.grad is None else p.grad.cpu().flatten()
                          for p in self.params]).float()


def profile_step(st):
    """A torch.profiler summary of one step: the share of it the GPU is busy, time by kernel kind,
    kernels (on CPU: operator calls) per micro-batch, host time per launch."""
    from torch.profiler import ProfilerActivity, profile, record_function
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device_type == "cuda" else [])
    with tempfile.TemporaryDirectory() as tmp:
        with profile(activities=acts) as prof:
            with record_function("bench_step"):
                t0 = time.perf_counter()
                st.step()
                host = time.perf_counter() - t0  # until the last launch returns
                sync()  # in the window: every kernel of the step ends in it
        prof.export_chrome_trace(os.path.join(tmp, "trace.json"))
        with open(os.path.join(tmp, "trace.json")) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    window = next(e for e in events
                  if e["name"] == "bench_step" and e.get("cat") == "user_annotation")
    w0, w1 = window["ts"], window["ts"] + window["dur"]
    inside = [e for e in events if w0 <= e["ts"] <= w1]
    if device_type == "cuda":
        kernels = [e for e in inside if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        launches = [e for e in inside if e.get("cat") in ("cuda_runtime", "cuda_driver")
                    and "Launch" in e["name"]]
    else:
        kernels = launches = [e for e in inside if e.get("cat") == "cpu_op"]
    busy, end, kinds = 0.0, 0.0, {}
    for e in sorted(kernels, key=lambda e: e["ts"]):  # the union of the kernels' intervals
        busy += max(0.0, e["ts"] + e["dur"] - max(e["ts"], end))
        end = max(end, e["ts"] + e["dur"])
        kind = kernel_kind(e["name"])
        kinds[kind] = kinds.get(kind, 0.0) + e["dur"] / 1e3
    return {"step_ms": window["dur"] / 1e3, "busy_share": busy / window["dur"],
            "ms_by_kind": {k: round(v, 3) for k, v in sorted(kinds.items())},
            "kernels_per_micro_batch": len(kernels) / st.n,
            "launch_call_us": statistics.mean(e["dur"] for e in launches) if launches else None,
            "host_us_per_launch": 1e6 * host / len(launches) if launches else None}


def run_variant(variant, refs, after_first_pass=lambda: None):
    name, n_micro, mode, accumulate = variant
    row = {"variant": step_label(variant), "model": name, "micro_batches": n_micro,
           "mode": mode, "accumulation": accumulate}
    torch._dynamo.reset()  # each variant compiles afresh (or loads from the on-disk cache)
    if device_type == "cuda":
        from torch._inductor.cudagraph_trees import reset_cudagraph_trees
        reset_cudagraph_trees()  # the last variant's CUDA graphs and their memory pool
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    st = Step(variant)
    t0 = time.perf_counter()
    st.accumulate_grads()
    sync()
    row["first_pass_s"] = time.perf_counter() - t0  # compiling, or loading the compiled code
    after_first_pass()
    for _ in range(2):  # CUDA graphs: recorded, then replayed; checked at the initial weights
        st.zero()
        st.accumulate_grads()
    g = st.grad_vector()
    row["grad_finite"] = bool(torch.isfinite(g).all())
    if accumulate == "backward" and n_micro == 16 and mode == "default":
        refs[name], row["grad_reference"] = g, True
    elif name in refs:
        row["grad_rel_err"] = ((g - refs[name]).norm() / refs[name].norm()).item()
    row["grad_ok"] = row["grad_finite"] and row.get("grad_rel_err", 0.0) <= GRAD_WRONG
    st.zero()
    for _ in range(2):  # warm-up
        st.step()
    sync()
    times, hosts = [], []
    for _ in range(step_steps):
        t0 = time.perf_counter()
        st.step()
        hosts.append(time.perf_counter() - t0)
        sync()
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    flops = st.raw.flops_per_token() * st.tokens / seconds
    row.update(ms_per_step=1000 * seconds, ms_min=1000 * min(times), ms_max=1000 * max(times),
               host_ms=1000 * statistics.median(hosts), tokens_per_s=st.tokens / seconds,
               share_of_matmul_peak=flops / results["matmul_peak_flops"])
    if device_type == "cuda":
        row["mfu_h100"] = flops / 989e12
        row["peak_memory_mib"] = torch.cuda.max_memory_allocated() / 2 ** 20
    try:
        row["profile"] = profile_step(st)
    except Exception as e:  # a failed profile must not lose the timing
        row["profile"] = {"error": first_line(e)}
    return row


def prewarm(variants):
    """Child processes compile variants into Inductor's on-disk cache while this one compiles the
    first: one for each of the next 3 (model, split), its modes in turn (3: the GPU's memory)."""
    groups = {}
    for i, v in variants[1:]:
        groups.setdefault(v[:2], []).append(str(i))
    env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS=str(max(1, (os.cpu_count() or 4) // 4)))
    return [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--sections=step",
                              f"--dry={dry}", f"--step_worker={','.join(ids)}"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)  # its own group: stopped with its compilers
            for ids in list(groups.values())[:3]]


def step_worker_main():
    """A prewarm child: compile the given variants (three passes: CUDA graphs record), then exit."""
    for i in step_worker.split(","):
        torch._dynamo.reset()
        st = Step(STEP_PLAN[int(i)])
        for _ in range(3):
            st.accumulate_grads()
            st.zero()
        sync()
        del st


def bench_step():
    """The author's step (config/baseline.py, config/aed_mse_possub.py: 800 sequences of 200 tokens)
    in the variants of STEP_PLAN, in that order, within step_budget seconds; each with its gradients
    checked against the model's step as it was, its time, peak memory and a profile of one step.
    The JSON is written after every variant; what would end past the budget is skipped, listed."""
    deadline = t_start + step_budget
    variants = [(i, v) for i, v in enumerate(STEP_PLAN) if v[0] in step_models.split(",")]
    rows, refs, skipped = [], {}, []
    results["step"], results["step_skipped"] = rows, skipped
    workers = []

    def wait_for_workers():  # before timing: the children would share the GPU and the cores
        t0 = time.time()
        for p in workers:
            try:
                p.wait(timeout=max(1.0, deadline - 150 - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        results["step_prewarm"] = {"children": len(workers), "waited_s": time.time() - t0,
                                   "stopped": sum(p.returncode < 0 for p in workers)}

    seen = {}  # seconds a variant of (model, mode) took: the next one's estimate
    for k, (i, v) in enumerate(variants):
        guess = 5 if dry else (130 if k == 0 or not workers else 40) * (1.3 if v[0] == "aed" else 1)
        if time.time() + seen.get((v[0], v[2]), guess) > deadline:
            skipped.append(step_label(v))
            print(f"  skipped (would end past step_budget): {step_label(v)}", flush=True)
            continue
        if k == 0 and step_prewarm and len(variants) > 1:
            workers = prewarm(variants)
        t0 = time.time()
        try:
            row = run_variant(v, refs, wait_for_workers if k == 0 else lambda: None)
        except Exception as e:  # out of memory, a failed compile: recorded, the next one runs
            row = {"variant": step_label(v), "model": v[0], "error": first_line(e)}
            if device_type == "cuda":
                torch.cuda.empty_cache()
        if k == 0 and workers and "step_prewarm" not in results:  # the first failed early
            wait_for_workers()
        waited = results["step_prewarm"]["waited_s"] if k == 0 and workers else 0.0
        seen[(v[0], v[2])] = row["seconds"] = time.time() - t0 - waited
        rows.append(row)
        save_results()
        if "error" in row:
            print(f"  {row['variant']:38s} {row['error']}", flush=True)
            continue
        p = row["profile"]
        err = row.get("grad_rel_err")
        print(f"  {row['variant']:38s} {row['ms_per_step']:7.0f} ms/step "
              f"{row['tokens_per_s']:9.0f} tok/s; grad "
              + ("reference" if row.get("grad_reference") else "unchecked" if err is None
                 else f"{err:.1e}")
              + ("" if row["grad_ok"] else " WRONG")
              + (f"; peak {row['peak_memory_mib']:,.0f} MiB" if "peak_memory_mib" in row else "")
              + ("" if "error" in p else f"; busy {p['busy_share']:.0%}, "
                 f"{p['kernels_per_micro_batch']:.0f} kernels/micro-batch")
              + f"; first pass {row['first_pass_s']:.1f} s", flush=True)


def bench_params():
    """Each config/ file's model, built on the meta device: its parameters as the author counts them
    (the tied wte once, no wpe), without the embedding table (what scaling laws count), and training
    FLOPs per token."""
    defaults, rows = train_defaults(), []
    root = os.path.dirname(os.path.abspath(__file__))
    print(f"  {'config':28s} {'blocks':>7s} {'width':>5s} {'params':>11s} "
          f"{'non-embedding':>13s} {'FLOPs/token':>12s}")
    for path in sorted(glob.glob(os.path.join(root, "config", "*.py"))):
        if path.endswith("_common.py"):  # included by the others, not a run
            continue
        c = load_config(defaults, [path])
        with torch.device("meta"):
            m = Transformer(model_config_of(c))
        blocks = (f"{m.config.n_layer}+{m.config.n_decoder_layer}" if c["arch"] == "aed"
                  else f"{m.config.n_layer}")
        row = {"config": os.path.basename(path), "arch": c["arch"], "blocks": blocks,
               "n_embed": c["n_embed"], "params": m.get_num_params(),
               "non_embedding_params": m.get_num_params() - c["vocab_size"] * c["n_embed"],
               "flops_per_token": m.flops_per_token()}
        rows.append(row)
        print(f"  {row['config']:28s} {blocks:>7s} {c['n_embed']:5d} {row['params']:11,} "
              f"{row['non_embedding_params']:13,} {row['flops_per_token']:12,}", flush=True)
    results["params"] = rows


def weight_read_ms(n_elements, batch):
    """ms for a (batch x 150) @ (150 x n/150) fp32 matmul: reading that many weights once, the least
    a one-token step of a model with n_elements parameters can cost at this batch, since it must
    read every weight."""
    w = torch.randn(n_elements // 150, 150, device=device)
    x = torch.randn(batch, 150, device=device)
    return 1000 * interleaved({"matvec": lambda: torch.nn.functional.linear(x, w)},
                              3 * repeats)["matvec"]


UNCACHED_STRIDE = 8


def uncached_lengths(n_tokens):
    """The lengths at which one uncached token is timed, standing for generating n_tokens after a
    1-token prompt (lengths 1..n_tokens). An uncached token runs the model over every token so far,
    so its cost grows about linearly with the length: every UNCACHED_STRIDE-th length, in the middle
    of its stride (their mean is the mean of all), gives the same mean cost in a fraction of the
    time (all 199 of a 16M model at batch 8: ~40 s)."""
    if n_tokens < UNCACHED_STRIDE:
        return list(range(1, n_tokens + 1))
    # 4, 12, ..., 196 for 199 tokens
    return list(range(UNCACHED_STRIDE // 2, n_tokens + 1, UNCACHED_STRIDE))


def bench_generate():
    """ms per new token from a 1-token prompt until the context (200; quick: 64) is full: without
    the cache, with it (eager), and with it and the compiled decode step (Engine(compile=True); not
    in quick mode). The uncached figure is the mean over every UNCACHED_STRIDE-th position."""
    rows = []
    configs = ([("AED", SMALL_AED), ("GPT", NANOGPT_REF)] if quick
               else [("AED", AUTHOR_AED), ("GPT", AUTHOR_GPT)])
    modes = ("uncached", "cached") if quick else ("uncached", "cached", "compiled")
    for name, kw in configs:
        kw = dict(kw, context_size=64 if quick else 200)  # quick: the plumbing, in seconds
        torch.manual_seed(0)
        model = Transformer(ModelConfig(**kw)).to(device).eval()
        n_weights = sum(p.numel() for p in model.parameters())
        for batch in (1, 8):
            idx = torch.zeros(batch, 1, dtype=torch.long, device=device)
            new = kw["context_size"] - 1
            compile_s, engine = None, Engine(model)
            if "compiled" in modes:
                t0 = time.perf_counter()
                engine = Engine(model, compile=True)
                engine.generate(idx, 3)  # the first one-token step compiles (per batch size)
                compile_s = time.perf_counter() - t0
            compiled_step = engine.compiled_step

            def per_token(mode, n_tokens):
                """Seconds per token of generating n_tokens after idx."""
                engine.compiled_step = compiled_step if mode == "compiled" else None
                if mode == "uncached":  # one token at each of uncached_lengths: see there
                    lengths = uncached_lengths(n_tokens)
                    total = 0.0
                    for n in lengths:
                        t0 = time.perf_counter()
                        engine.generate(prompt[:, :n], 1, kv_cache=False)
                        sync()
                        total += time.perf_counter() - t0
                    return total / len(lengths)
                t0 = time.perf_counter()
                engine.generate(idx, n_tokens)
                sync()
                return (time.perf_counter() - t0) / n_tokens

            # token ids do not change the cost
            prompt = torch.zeros(batch, new, dtype=torch.long, device=device)
            for mode in modes:  # a short warm-up
                per_token(mode, 5)
            times = {mode: [] for mode in modes}
            for _ in range(max(1, round(repeats / 3))):  # interleaved; 2 rounds by default
                for mode in modes:
                    times[mode].append(per_token(mode, new))
            ms = {mode: 1000 * statistics.median(t) for mode, t in times.items()}
            floor = weight_read_ms(n_weights, batch)
            # what the fixed-shape cache holds, and each step reads in full: keys and values of
            # every slot
            cache_mb = (2 * len(model.attention_layers) * batch * kw["context_size"] * kw["n_embed"]
                        * 4 / 1e6)
            row = {"model": name, "params": model.get_num_params(), "batch": batch,
                   "new_tokens": new, "weights_mb": 4 * n_weights / 1e6, "kv_cache_mb": cache_mb,
                   "ms_per_token_weight_read": floor,
                   "compile_s": compile_s, **{f"ms_per_token_{m}": v for m, v in ms.items()},
                   **{f"speedup_{m}": ms["uncached"] / ms[m] for m in modes if m != "uncached"},
                   "speedup_bound": ms["uncached"] / floor}
            rows.append(row)
            print(f"  {name} ({row['params']:,} params) batch {batch}: ms/token "
                  + ", ".join(f"{m} {v:.2f}" for m, v in ms.items())
                  + f"; reading the {row['weights_mb']:.0f} MB of weights once {floor:.2f}"
                  + f"; KV cache {cache_mb:.0f} MB"
                  + (f"; compile {compile_s:.0f} s" if compile_s else ""), flush=True)
    results["generate"] = rows


def run(cmd):
    """Run cmd; exit with the last line of its stderr if it fails."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines()[-1] if p.stderr.strip()
                else f"exit code {p.returncode}")
        die(f"{' '.join(cmd[1:3])} failed: {last}")


def bench_data():
    """Data loading's share of a training step, from the data_ms train.py logs for every step."""
    import prepare

    prepare.prepare(log=lambda msg: None)  # the default data (a few seconds)
    with tempfile.TemporaryDirectory() as tmp:
        # the real train.bin; a val.bin of its first 2,048 tokens (one batch of 15 windows), so
        # that train.py's score on all of val.bin at the end costs a second, not most of the section
        data = os.path.join(tmp, "data", "wikipedia")
        os.makedirs(data)
        os.symlink(os.path.abspath(os.path.join("data", "wikipedia", "train.bin")),
                   os.path.join(data, "train.bin"))
        with open(os.path.join("data", "wikipedia", "val.bin"), "rb") as f:
            with open(os.path.join(data, "val.bin"), "wb") as g:
                g.write(f.read(2 * 2048))  # uint16
        steps = 2 + repeats if quick else 8  # the first 2 are not timed (warm-up)
        bs = QUICK_BATCH if quick else 16
        cmd = [sys.executable, "train.py", f"--out_dir={tmp}/out", f"--data_dir={tmp}/data",
               "--arch=gpt", "--n_layer=4", "--n_embed=128", "--n_head=4", "--context_size=128",
               f"--batch_size={bs}", "--gradient_accumulation_steps=1", f"--train_steps={steps}",
               f"--est_interval={10 * steps}", "--est_steps=1", "--compile=False",
               f"--device={device_type}"]
        run(cmd)
        with open(os.path.join(tmp, "out", "log.jsonl")) as f:
            recs = [json.loads(line) for line in f]
    recs = [r for r in recs if r.get("type") == "step"][2:]  # skip warm-up steps
    data_ms = statistics.median(r["data_ms"] for r in recs)
    step_ms = statistics.median(r["ms"] for r in recs)
    row = {"data_ms_per_step": data_ms, "step_ms": step_ms, "share": data_ms / step_ms,
           "batches_per_s": 1000 / data_ms if data_ms > 0 else float("inf")}
    results["data"] = row
    print(f"  data loading {data_ms:.2f} ms of a {step_ms:.0f} ms step ({row['share']:.2%}); "
          f"{row['batches_per_s']:.0f} batches/s ({bs} x 128)", flush=True)


def bench_prepare():
    """prepare() against tiktoken's encode_ordinary_batch with all cores, on the same text: the
    default Wikipedia corpus, repeated to be long enough to time (quick: a quarter of it). Peak
    RSS is the whole prepare.py process's."""
    import prepare
    from tokenizer import get_encoding

    with open(prepare.wikipedia_text(), encoding="utf-8") as f:
        text = f.read()
    text = text[:len(text) // 4] if quick else text * 4  # quick: the plumbing, in a second
    docs = text.split(prepare.EOT)
    mb = len(text.encode("utf-8")) / 1e6
    enc = get_encoding()
    tk, pr = [], []
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "wiki.txt")
        with open(src, "w", encoding="utf-8") as f:
            f.write(text)
        for _ in range(1 if quick else 3):  # interleaved
            t0 = time.perf_counter()
            enc.encode_ordinary_batch(docs, num_threads=os.cpu_count())
            tk.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            prepare.prepare(src, "bench", data_dir=tmp, log=lambda msg: None)
            pr.append(time.perf_counter() - t0)
        # the child reports its own VmHWM: ru_maxrss would include this process's memory, inherited
        # by fork
        probe = ("import atexit, re, runpy, sys; atexit.register(lambda: print('VmHWM', "
                 "re.search(r'VmHWM:\\s+(\\d+)', "
                 "open('/proc/self/status').read()).group(1), file=sys.stderr)); "
                 "sys.argv = sys.argv[1:]; "
                 "runpy.run_path('prepare.py', run_name='__main__')")
        p = subprocess.run([sys.executable, "-c", probe, "prepare.py", f"--input={src}",
                            "--name=bench", f"--data_dir={tmp}"], capture_output=True, text=True,
                           cwd=os.path.dirname(os.path.abspath(__file__)))
        if p.returncode != 0:
            die(f"prepare.py failed: {p.stderr.strip().splitlines()[-1]}")
        peak_mb = int(p.stderr.split("VmHWM")[-1]) / 1024  # KB -> MB
    row = {"mb": mb, "prepare_mb_per_s": mb / statistics.median(pr),
           "tiktoken_batch_mb_per_s": mb / statistics.median(tk), "prepare_peak_rss_mb": peak_mb}
    row["ratio"] = row["prepare_mb_per_s"] / row["tiktoken_batch_mb_per_s"]
    results["prepare"] = row
    print(f"  prepare() {row['prepare_mb_per_s']:.1f} MB/s on {mb:.0f} MB "
          f"(reading, splitting, encoding, writing) vs "
          f"encode_ordinary_batch {row['tiktoken_batch_mb_per_s']:.1f} MB/s: {row['ratio']:.2f}x; "
          f"prepare.py peak RSS {row['prepare_peak_rss_mb']:.0f} MB", flush=True)


def _memory_probe(kwargs, batch_size, queue):
    # runs in a fresh process, forked from a server process that has only imported this file (and so
    # torch): its peak RSS above the memory held before the step is this step's alone
    global device, device_type
    device = device_type = "cpu"
    torch.set_num_threads(1)
    step, _ = train_step_fn(kwargs, batch_size)
    # the model, optimizer and batch are in memory; the step's peak is extra
    before = proc_status_mb("VmRSS")
    step()
    step()
    queue.put(proc_status_mb("VmHWM") - before)


def proc_status_mb(field):
    """VmRSS (now) or VmHWM (peak) of this process in MB, from /proc (Linux). Unlike ru_maxrss,
    VmHWM starts afresh at exec, so a child's figure does not include its parent's memory."""
    with open("/proc/self/status") as f:
        kb = next(line.split()[1] for line in f if line.startswith(field + ":"))
    return int(kb) / 1024


def bench_memory():
    rows = []
    bs = QUICK_BATCH if quick else 16
    configs = [("GPT small", NANOGPT_REF, bs), ("AED small", SMALL_AED, bs)]
    if not quick:
        configs += [("GPT author 16M", AUTHOR_GPT, 4), ("AED author 16M", AUTHOR_AED, 4)]
    for name, kw, bs in configs:
        row = {"model": name, "batch": f"{bs}x{kw['context_size']}"}
        if device_type == "cuda":
            step, _ = train_step_fn(kw, bs)
            step()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            step()
            row["step_mb"] = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
        else:
            # a fresh process, one thread: peak RSS is per process (forked from a server that
            # imported torch)
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(["__main__"])
            queue = ctx.Queue()
            p = ctx.Process(target=_memory_probe, args=(kw, bs, queue))
            p.start()
            p.join()
            if p.exitcode != 0:
                die(f"the memory probe for {name} failed (exit code {p.exitcode})")
            row["step_mb"] = queue.get()
        rows.append(row)
        print(f"  {name} ({row['batch']}): step peak {row['step_mb']:.0f} MB", flush=True)
    results["memory"] = rows


def split_argv(argv):
    """(bench.py's own options, config files, their --key=value): a train.py key that is not
    bench.py's (--n_layer=1) goes to every config; --device, a key of both, to both."""
    train = train_defaults()
    help_asked = "-h" in argv or "--help" in argv  # load_config prints it, whatever else is there
    own, files, overrides = [], [], []
    for arg in argv:
        if not arg.startswith("-"):
            files.append(arg)
            continue
        key = arg.lstrip("-").partition("=")[0].replace("-", "_")
        if key.startswith("no_") and key not in defaults and key not in train:
            key = key[3:]  # --no-compile
        if key not in train and key not in defaults and not help_asked:
            raise unknown_key_error(key, {**defaults, **train}, "on the command line")
        if key in train:
            overrides.append(arg)
        if key not in train or key in defaults:
            own.append(arg)
    return own, files, overrides


if __name__ == "__main__":
    try:
        argv, config_files, config_overrides = split_argv(sys.argv[1:])
        stray = [a for a in config_overrides if a not in argv]  # --device alone is bench's
        if stray and not config_files:
            raise ConfigError(f"{stray[0]} sets a key of the config files to time (train.py's): "
                              f"give config files, e.g. python bench.py config/bytes_baseline.py")
        # config files: the train section times them alone, unless --sections says otherwise
        base = dict(defaults, sections="train") if config_files else None
        globals().update(load_config(defaults, argv, base=base))
        if config_files and "train" not in sections.split(","):
            raise ConfigError("config files are timed in the train section: add train to "
                              "--sections")
        configs = [read_train_config(path) for path in config_files]
        if configs:
            device = configs[0]["device"]  # the matmul peak and machine(): the first config's
        unknown = set(sections.split(",")) - {"train", "generate", "data", "prepare", "memory",
                                              "step", "params"}
        if unknown:
            raise ConfigError(f"unknown section(s) {', '.join(sorted(unknown))}: "
                              f"choose from train,generate,data,prepare,memory,step,params")
        # bench times bf16 on CUDA, float32 on CPU
        device, device_type, _, _ = resolve_device(device, "auto")
        if device_type not in ("cpu", "cuda"):
            raise ConfigError(f"bench.py runs on cpu or cuda, not {device!r}")
        if dry:
            device, device_type = "cpu", "cpu"
        if "step" in sections.split(",") and device_type != "cuda" and not dry:
            raise ConfigError("the step section times the author's step on a GPU: --dry runs its "
                              "flow on CPU with tiny models")
        step_n_sequences = 16 if dry else 800
        if set(step_models.split(",")) - {"aed", "gpt"}:
            raise ConfigError(f"step_models must be aed, gpt or aed,gpt, got {step_models!r}")
    except ConfigError as e:
        die(e)
    repeats = repeats or (3 if quick else 5)
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if step_worker:
        sys.exit(step_worker_main())
    results = {"machine": machine(), "quick": quick}
    print(f"machine: {results['machine']}", flush=True)
    t_start = time.time()
    if sections != "params":  # nothing is timed there
        results["matmul_peak_flops"] = matmul_peak()
        print(f"matmul peak: {results['matmul_peak_flops'] / 1e9:.0f} GFLOP/s "
              f"({'fp32' if device_type == 'cpu' else 'bf16'})", flush=True)
    for section in sections.split(","):
        print(f"== {section}", flush=True)
        t0 = time.time()
        {"train": bench_configs if configs else bench_train, "generate": bench_generate,
         "data": bench_data, "prepare": bench_prepare, "memory": bench_memory, "step": bench_step,
         "params": bench_params}[section]()
        results.setdefault("section_seconds", {})[section] = round(time.time() - t0, 1)
        print(f"  ({section}: {time.time() - t0:.0f} s)", flush=True)
    results["seconds"] = time.time() - t_start
    save_results()
    print(f"done in {results['seconds']:.0f} s; figures in {out_json}")
