"""
A run's out_dir and what keeps it safe (docs/robustness.md), for train.py:

    catch_signals()  # first: Ctrl-C or SIGTERM at any moment (start-up, a long op) ends the run with one line
    config, ckpt, changes = resume_config(out_dir, defaults, argv)  # --init_from=resume
    run = RunDir(out_dir, ckpt, overwrite)  # one run per out_dir; a scratch run never replaces one by accident
    run.start(train_steps, tokens_per_step, **facts)  # log.jsonl's first record; a resume repairs what a kill cut
    run.log_step(step, ...); run.estimate(step, est); run.save(step, model, optimizer, scaler); run.summary(step)

Files are written to NAME.tmp, fsynced and renamed (the log is append-only): a kill leaves the old file or the
new one. torch is imported where it is used: train.py imports this module before torch.
"""
import atexit
import fcntl
import json
import math
import os
import signal
import statistics
import sys
import threading
import time

from configurator import ConfigError, check_type, die, load_config

_saving = threading.Lock()  # held while a checkpoint is written: a signal waits for it
_run = None  # the RunDir whose step and checkpoint a signal's message names
_wakeup = None  # where Python's C-level signal handler writes the signal's number


def catch_signals():
    """SIGINT and SIGTERM end the process at once with one line, exit status 128 + the signal. A Python handler
    runs only between bytecodes, after a long torch op or a DDP collective returns (minutes, for a config too big
    for the machine); a thread reading the wakeup pipe runs at once."""
    global _wakeup
    if 'RANK' in os.environ and sys.platform == 'linux':  # a torchrun worker, started with setsid: it would
        import ctypes  # train on alone after a kill -9 of torchrun, so the kernel kills it with its parent
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # prctl(PR_SET_PDEATHSIG, SIGKILL)
    first = _wakeup is None  # the thread: once per process
    if first:
        r, _wakeup = os.pipe()
        os.set_blocking(_wakeup, False)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: None)  # a Python handler, so that the C-level one writes the pipe
    signal.set_wakeup_fd(_wakeup)
    if first:  # started last: a signal before it waits in the pipe
        threading.Thread(target=_stop_on_signal, args=(r,), daemon=True).start()


def _stop_on_signal(r):
    signum = 0
    while signum not in (signal.SIGINT, signal.SIGTERM):
        signum = os.read(r, 1)[0]
    name = signal.Signals(signum).name
    with _saving:  # a save under way finishes first, so the message names the step really saved
        if int(os.environ.get('RANK', 0)) == 0:  # under torchrun, which passes the signal on: rank 0 speaks
            where = f"at step {_run.step}; {_run.last_saved()}" if _run else "while starting"
            print(f"error: interrupted by {name} {where}", file=sys.stderr, flush=True)
        os._exit(128 + signum)


def provenance():
    """Where a run runs: the code (git commit, and whether the tree had changes), the software, the
    hardware. Enough to tell two runs of the same config apart when their numbers differ
    (docs/training.md, What reproduces): threads and the instruction set of torch's CPU kernels (AVX2,
    AVX512) each change float sums."""
    import platform
    import subprocess
    import torch
    def git(*args):
        try:
            return subprocess.run(['git', *args], capture_output=True, text=True, timeout=10,
                                  cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            return None
    commit = git('rev-parse', 'HEAD')
    cpu = platform.processor() or platform.machine()
    try:
        with open('/proc/cpuinfo') as f:
            cpu = next((line.split(':', 1)[1].strip() for line in f if line.startswith('model name')), cpu)
    except OSError:
        pass
    return {'commit': commit, 'tree_changed': bool(git('status', '--porcelain', '--untracked-files=no'))
            if commit else None, 'python': platform.python_version(), 'threads': torch.get_num_threads(),
            'cpu': cpu, 'cpu_isa': torch.backends.cpu.get_cpu_capability(), 'cpu_count': os.cpu_count()}


def _unclaim(out_dir, created):
    """At exit: an out_dir that holds only our .lock (a run refused at start) is removed again."""
    try:
        if os.listdir(out_dir) == ['.lock']:
            os.remove(os.path.join(out_dir, '.lock'))
            if created:
                os.rmdir(out_dir)
    except OSError:
        pass


def duration(s):
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.1f} min" if s < 90 * 60 else f"{s / 3600:.1f} h"


def resume_config(out_dir, defaults, argv):
    """(config, ckpt, [(key, old, new)]): the run's config as saved, with what argv sets on top (e.g.
    --train_steps=20000), except the model's shape."""
    from checkpoint import MODEL_KEYS, load
    from model import ModelConfig
    path = os.path.join(out_dir, 'ckpt_last.pt')
    if not os.path.isfile(path):
        raise ConfigError(f"--init_from=resume: no checkpoint at {path} (" + (
            "the run there stopped before its first save: start it over with --overwrite=True instead)"
            if os.path.isfile(os.path.join(out_dir, 'log.jsonl')) else "is out_dir right?)"))
    ckpt, _ = load(path, ('model', 'optimizer', 'scaler', 'config', 'step', 'best_val_loss', 'best_step',
                          'last_est', 'elapsed', 'rng'))
    saved = dict(defaults, **{k: check_type(k, v, defaults[k], f"in {path}") for k, v in ckpt['config'].items()
                              if k in defaults})
    config = dict(load_config(defaults, argv, base=saved), init_from='resume', out_dir=out_dir)
    try:  # compare the models, not the spelling: n_decoder_layer=None and =n_layer are the same model
        same = ModelConfig(**{k: saved[k] for k in MODEL_KEYS}) == ModelConfig(**{k: config[k] for k in MODEL_KEYS})
    except (ValueError, TypeError):
        same = False  # a value the model refuses: the check below names the key
    for k in MODEL_KEYS:
        if config[k] != saved[k] and not same:
            raise ConfigError(f"cannot change {k} when resuming: the checkpoint has {saved[k]!r}, "
                              f"this run asks for {config[k]!r}")
    return config, ckpt, [(k, saved[k], v) for k, v in config.items() if v != saved[k] and k != 'init_from']


class RunDir:
    def __init__(self, out_dir, ckpt=None, overwrite=False, master=True):
        """ckpt: the checkpoint a resume starts from, None for a scratch run. Only rank 0 (master) writes."""
        global _run
        _run, self.dir, self.master, self.started, self.step_times = self, out_dir, master, None, []
        self.step, self.saved_step, self.best_val_loss, self.best_step, self.last_est, self.elapsed_before = \
            (ckpt['step'], ckpt['step'], ckpt['best_val_loss'], ckpt['best_step'], ckpt['last_est'], ckpt['elapsed']) \
            if ckpt else (0, None, float('inf'), None, {}, 0.0)
        self.saved_tokens = ckpt.get('tokens') if ckpt else None  # tokens seen, whatever the batch was before
        self.whole = {}  # the last and the best model's ce on all of val.bin, at the end
        if master:
            self._claim(ckpt is None, overwrite)

    def path(self, name):
        return os.path.join(self.dir, name)

    def _claim(self, scratch, overwrite):
        created = not os.path.isdir(self.dir)
        try:
            os.makedirs(self.dir, exist_ok=True)
            self.lock = open(self.path('.lock'), 'a+')
        except OSError as e:
            die(f"cannot write in out_dir {self.dir}: {e.strerror}")
        try:  # held for the life of the process: the kernel drops it however the process ends, kill -9 too
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.lock.seek(0)
            die(f"{self.dir} is in use by another train.py (pid {self.lock.read().strip() or '?'}): "
                f"one run per out_dir at a time")
        atexit.register(_unclaim, self.dir, created)  # refused before its log: no out_dir left
        self.lock.truncate(0)
        self.lock.write(f"{os.getpid()}\n")
        self.lock.flush()
        log = self.path('log.jsonl')
        if scratch and not overwrite and os.path.exists(self.path('ckpt_last.pt')):
            die(f"{self.dir} already holds a run (ckpt_last.pt): train into a new --out_dir=..., "
                f"continue it with --init_from=resume, or replace it with --overwrite=True")
        if scratch and not overwrite and os.path.exists(log):
            with open(log, 'rb') as f:  # a log with steps but no checkpoint: someone deleted it, ask
                if b'"type": "step"' in f.read():
                    die(f"{self.dir} already holds a run (log.jsonl) with no checkpoint to resume: "
                        f"train into a new --out_dir=..., or replace it with --overwrite=True")
            print(f"{self.dir} holds a run stopped before its first checkpoint: starting it over", flush=True)
        stale = ['ckpt_last.pt.tmp', 'ckpt_best.pt.tmp', 'summary.json.tmp']  # a killed run's (we hold the lock)
        if scratch:  # --overwrite=True: the old run goes now, so a kill before the first save mixes nothing
            stale += ['ckpt_last.pt', 'ckpt_best.pt', 'summary.json', 'log.jsonl']
        for f in stale:
            if os.path.exists(self.path(f)):
                os.remove(self.path(f))
        if not scratch and os.path.isfile(log):  # cut a torn last line, or the first new record would be glued to it
            with open(log, 'rb+') as f:
                torn = len(f.read().rpartition(b'\n')[2])
                if torn:
                    f.truncate(f.tell() - torn)
                    print(f"log.jsonl: dropped its torn last line ({torn} bytes)", flush=True)

    def start(self, train_steps, tokens_per_step, **facts):
        """Start the clock and the log: a 'start' record (a fresh log) or a 'resume' record (appended: the records
        after it supersede those of the same or a later step), with facts, which every summary.json repeats.
        A resume redoes what a kill right after the last save cut off (the ckpt_best.pt link, summary.json)."""
        from checkpoint import CheckpointError, link
        self.train_steps, self.tokens_per_step, self.facts = train_steps, tokens_per_step, facts
        self.start_step, self.start_tokens = self.step, self.saved_tokens or self.step * tokens_per_step
        self.started = time.time()
        if self.master:
            resume = self.saved_step is not None
            self.log_file = open(self.path('log.jsonl'), 'ab' if resume else 'wb', buffering=0)
            self.log({'type': 'resume' if resume else 'start', 'step': self.step, **facts})
            if resume and self.best_step == self.step:
                try:
                    link(self.path('ckpt_last.pt'), self.path('ckpt_best.pt'))
                except CheckpointError as e:
                    die(e)
            if resume:
                self.summary(self.step)

    def elapsed(self):
        return self.elapsed_before + (time.time() - self.started if self.started else 0.0)

    def tokens(self, step):  # a resume may change the tokens a step
        return self.start_tokens + (step - self.start_step) * self.tokens_per_step

    def epochs(self, step):  # passes over the training tokens
        return self.tokens(step) / self.facts['train_tokens']

    def log(self, rec):
        from checkpoint import write_error
        try:
            self.log_file.write((json.dumps(rec) + '\n').encode())  # unbuffered: one write() per record
        except OSError as e:
            die(f"{write_error(self.log_file.name, e)}; stopped at step {rec['step']}: {self.last_saved(advice=False)}")

    def log_step(self, step, **rec):
        self.step = step
        if self.master:
            self.log({'type': 'step', 'step': step, **rec, 'tokens': self.tokens(step),
                      'epochs': self.epochs(step), 'time': round(self.elapsed(), 2)})

    def estimate(self, step, est, **more):
        """Log a loss estimate {'train': ce, 'val': ce}: True if its val loss is the best so far."""
        if not all(math.isfinite(v) for v in est.values()):
            self.stop(f"loss estimate is not finite ({est})", step)
        improved = est['val'] < self.best_val_loss
        if improved:
            self.best_val_loss, self.best_step = est['val'], step
        self.last_est = est
        self.log({'type': 'est', 'step': step, **est, 'best_val': self.best_val_loss,
                  'tokens': self.tokens(step), 'epochs': self.epochs(step), 'time': round(self.elapsed(), 2),
                  **more})
        return improved

    def whole_val(self, step, last, best, n_tokens):
        """The end of a run: the last and the best model's ce on all of val.bin, logged and in summary.json."""
        self.whole = {'whole_val_last': last, 'whole_val_best': best, 'whole_val_tokens': n_tokens}
        self.log({'type': 'whole_val', 'step': step, 'best_step': self.best_step, **self.whole})
        self.summary(step)

    def save(self, step, model, optimizer, scaler, best=False):
        """ckpt_last.pt: the model, optimizer and RNG states and the run's bookkeeping; ckpt_best.pt a hard link to
        it if best. Non-finite weights or Adam moments (an overflowing update, whatever the loss said) stop the run
        instead: they would replace the last good checkpoint."""
        from checkpoint import CheckpointError, link, nonfinite, save
        import torch
        cuda = self.facts['device'].startswith('cuda')
        ckpt = {'model': model.state_dict(), 'optimizer': optimizer.state_dict(), 'scaler': scaler.state_dict(),
                'config': self.facts['config'], 'step': step, 'best_val_loss': self.best_val_loss,
                'best_step': self.best_step, 'last_est': self.last_est, 'elapsed': self.elapsed(),
                'tokens': self.tokens(step),
                'rng': {'torch': torch.get_rng_state(), 'cuda': torch.cuda.get_rng_state() if cuda else None}}
        tensors = list(ckpt['model'].items()) + [(f"optimizer state {k} of parameter {i}", v)
                                                  for i, s in ckpt['optimizer']['state'].items() for k, v in s.items()]
        bad = nonfinite(tensors)
        if bad:
            self.stop(f"{len(bad)} of {len(tensors)} weight and optimizer tensors are not finite (e.g. {bad[0]})", step)
        with _saving:
            try:
                save(ckpt, self.path('ckpt_last.pt'))  # atomic: a kill or a full disk leaves the old file intact
                self.saved_step = step
                if best:
                    link(self.path('ckpt_last.pt'), self.path('ckpt_best.pt'))
            except CheckpointError as e:
                die(f"{e}; stopped at step {step}: {self.last_saved()}")

    def summary(self, step, status=None):
        from checkpoint import CheckpointError, atomic_write
        import torch
        device = self.facts['device']
        summary = {'status': status or ('finished' if step >= self.train_steps else 'running'), 'step': step,
                   'train_steps': self.train_steps, 'final_train_loss': self.last_est.get('train'),
                   'final_val_loss': self.last_est.get('val'),
                   'best_val_loss': self.best_val_loss if self.best_val_loss < float('inf') else None,
                   'tokens_seen': self.tokens(step), 'epochs': round(self.epochs(step), 4),
                   **self.whole, 'wall_time_s': round(self.elapsed(), 1), **self.facts, 'peak_gpu_memory_mib':
                   round(torch.cuda.max_memory_allocated(device) / 2 ** 20) if device.startswith('cuda') else None}
        try:
            atomic_write(self.path('summary.json'), lambda f: f.write(json.dumps(summary, indent=2).encode()))
        except CheckpointError as e:
            die(f"{e}; stopped at step {step}: {self.last_saved()}")

    def stop(self, reason, step):
        """A NaN/inf: stop on every rank, without saving, so ckpt_last.pt stays the last good one."""
        if self.master:
            self.log({'type': 'stop', 'step': step, 'reason': reason})
            self.summary(step, 'stopped: ' + reason)
        die(f"{reason} at step {step}; stopped without saving: {self.last_saved(advice=False)}")

    def expect(self, step, dt, est_s, est_interval):
        """After this process's first step, and after ten from their median: the time the rest will take (est_s:
        an estimate's), so that hardware too slow for the config shows at once."""
        self.step_times.append(dt)
        if not self.master or len(self.step_times) not in (1, 10) or step >= self.train_steps:
            return
        per_step = statistics.median(self.step_times[1:]) if len(self.step_times) > 1 else dt
        n_est = self.train_steps // est_interval - (step - 1) // est_interval + (self.train_steps % est_interval != 0)
        rest = per_step * (self.train_steps - step) + (est_s or 0.0) * n_est
        ests = f" and {n_est} estimate(s) of ~{duration(est_s)}" if est_s is not None else ""
        print(f"expected: {per_step * 1000:,.0f} ms/step "
              f"({'the first step' if len(self.step_times) == 1 else 'median of steps 2-10'}), so ~{duration(rest)} "
              f"for the {self.train_steps - step:,} steps left{ests}: the whole run ~{duration(self.elapsed() + rest)}",
              flush=True)

    def last_saved(self, advice=True):
        """The last checkpoint (or none yet), and with advice how to go on from it."""
        if self.saved_step is None:
            return "no checkpoint was saved yet" + (" (the same command starts the run over)" if advice else "")
        return (f"the last checkpoint, {self.path('ckpt_last.pt')}, is from step {self.saved_step}"
                + (f": continue with --init_from=resume --out_dir={self.dir}" if advice else ""))
