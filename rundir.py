"""
A run's out_dir, kept safe for train.py (docs/robustness.md): the lock, log.jsonl, summary.json,
the saves and the stop. Each file but the append-only log is written whole or not at all.
"""
import contextlib
import fcntl
import json
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import threading
import time
import weakref

import torch

from checkpoint import CheckpointError, atomic_write, link, nonfinite, save, write_error
from configurator import SIGNALS, die, stop

STOP_SIGNALS = (*SIGNALS, signal.SIGPIPE)  # SIGPIPE: the output's reader has gone (`| tee` closed)


def provenance():
    """The git commit (and if its .py files changed), the software, the hardware: what tells apart
    two runs of one config whose numbers differ (docs/training.md)."""
    def git(*args):
        try:
            return subprocess.run(['git', *args], capture_output=True, text=True, timeout=10,
                                  cwd=os.path.dirname(__file__) or '.').stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            return None
    commit, cpu = git('rev-parse', 'HEAD'), platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open('/proc/cpuinfo') as f:
        cpu = next((ln.split(':', 1)[1].strip() for ln in f if ln.startswith('model name')), cpu)
    # the code's files only: a study's script rewrites its committed tables as it goes
    changed = bool(git('status', '--porcelain', '--untracked-files=no', '--', '*.py')) if commit \
        else None
    return {'commit': commit, 'tree_changed': changed, 'python': platform.python_version(),
            'threads': torch.get_num_threads(), 'cpu': cpu,
            # the instruction set of torch's CPU kernels (AVX2, AVX512): it changes float sums
            'cpu_isa': torch.backends.cpu.get_cpu_capability(), 'cpu_count': os.cpu_count()}


def _stop_on_signal(run, r):  # the signal thread; it holds the run weakly (a test's process
    while (signum := os.read(r, 1)[0]) not in STOP_SIGNALS:  # runs several, one after another)
        pass
    run()._stop(signum)


class RunDir:
    def __init__(self, out_dir, ckpt=None, overwrite=False, master=True):
        """ckpt: the checkpoint a resume starts from (None: a scratch run). Only rank 0 writes. From
        here on a signal or a lost DDP rank stops the run (catch_signals)."""
        self.dir, self.master, self.started = out_dir, master, None
        self.saving = threading.Lock()  # held while a checkpoint or summary.json is written
        c = ckpt or {}
        self.step, self.saved_step = c.get('step', 0), c.get('step')
        self.best_step, self.last_est = c.get('best_step'), c.get('last_est', {})
        self.best_val_loss = c.get('best_val_loss', float('inf'))
        self.elapsed_before = c.get('elapsed', 0.0)
        self.saved_tokens = c.get('tokens')  # tokens seen, whatever the batch was before
        self.whole = {}  # the last and the best model's ce on all of val.bin, at the end
        if master:
            self._claim(ckpt is None, overwrite)
        self.catch_signals()

    def path(self, name):
        return os.path.join(self.dir, name)

    def _claim(self, scratch, overwrite):
        try:
            os.makedirs(self.dir, exist_ok=True)
            self.lock = open(self.path('.lock'), 'a+')
        except OSError as e:
            die(f"cannot write in out_dir {self.dir}: {e.strerror}")
        try:  # held for the life of the process: the kernel drops it however the process ends
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.lock.seek(0)
            pid = self.lock.read().strip() or '?'
            die(f"{self.dir} is in use by another train.py (pid {pid})")
        self.lock.truncate(0)
        print(os.getpid(), file=self.lock, flush=True)
        log = self.path('log.jsonl')
        if scratch and not overwrite and os.path.exists(self.path('ckpt_last.pt')):
            die(f"{self.dir} already holds a run (ckpt_last.pt): train into a new --out_dir=..., "
                f"continue it with --init_from=resume, or replace it with --overwrite=True")
        if scratch:  # the old run's files too, so a kill before the first save mixes nothing
            for f in ('ckpt_last.pt', 'ckpt_best.pt', 'summary.json', 'log.jsonl'):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self.path(f))
        if not scratch and os.path.isfile(log):  # a torn last line would glue onto the next record
            with open(log, 'rb+') as f:
                torn = len(f.read().rpartition(b'\n')[2])
                if torn:
                    f.truncate(f.tell() - torn)
                    print(f"log.jsonl: dropped its torn last line ({torn} bytes)", flush=True)

    def start(self, train_steps, tokens_per_step, **facts):
        """Start the clock and the log: a 'start' record, or a 'resume' record whose later records
        supersede those of the same or a later step; facts go into every summary.json. A resume
        redoes what a kill just after the last save cut off: the link ckpt_best.pt, summary.json."""
        self.train_steps, self.tokens_per_step = train_steps, tokens_per_step
        self.facts = {**facts, **provenance()}
        self.start_step = self.step
        self.start_tokens = self.saved_tokens or self.step * tokens_per_step
        self.started = time.time()
        if not self.master:
            return
        resume = self.saved_step is not None
        self.log_file = open(self.path('log.jsonl'), 'ab' if resume else 'wb', buffering=0)
        self.log({'type': 'resume' if resume else 'start', 'step': self.step, **self.facts})
        if not resume:
            return
        if self.best_step == self.step:
            self._write(self.step, link, self.path('ckpt_last.pt'), self.path('ckpt_best.pt'))
        if self.step >= train_steps:  # finished: its summary.json (scores, wall time) stands
            with contextlib.suppress(OSError, ValueError, KeyError), \
                    open(self.path('summary.json')) as f:
                old = json.load(f)
                if old['step'] == self.step and old['status'] == 'finished':
                    self.whole = {k: v for k, v in old.items() if k.startswith('whole_val')}
                    return
        self.summary(self.step)

    def elapsed(self):
        return self.elapsed_before + (time.time() - self.started if self.started else 0.0)

    def tokens(self, step):  # a resume may change the tokens a step
        return self.start_tokens + (step - self.start_step) * self.tokens_per_step

    def epochs(self, step):  # passes over the training tokens
        return self.tokens(step) / self.facts['train_tokens']

    def log(self, rec):
        try:
            self.log_file.write((json.dumps(rec) + '\n').encode())  # unbuffered: one write() each
        except OSError as e:
            die(f"{write_error(self.log_file.name, e)}; stopped at step {rec['step']}: "
                f"{self.last_saved(advice=False)}")

    def clock(self, step):  # what every step and estimate record says of where the run is
        return {'tokens': self.tokens(step), 'epochs': self.epochs(step),
                'time': round(self.elapsed(), 2)}

    def estimate(self, step, est):
        """Record an estimate ({'train': ce, 'val': ce}) of step's model: logged, kept as the last
        and, if its val is the lowest yet, the best. True if it is the best; a non-finite estimate
        stops the run."""
        if not all(map(math.isfinite, est.values())):
            self.stop(step, f"an estimate is not finite ({est})")
        improved = est['val'] < self.best_val_loss
        if improved:
            self.best_val_loss, self.best_step = est['val'], step
        self.last_est = est
        self.log({'type': 'est', 'step': step, **est, 'best_val': self.best_val_loss,
                  **self.clock(step)})
        return improved

    def finish(self, step, last, best, n_tokens):
        """The last and the best model's ce on all of val.bin (n_tokens), at the end."""
        self.whole = {'whole_val_last': last, 'whole_val_best': best, 'whole_val_tokens': n_tokens}
        self.log({'type': 'whole_val', 'step': step, 'best_step': self.best_step, **self.whole})
        self.summary(step)

    def save(self, step, ckpt, best=False):
        """ckpt, with the run's step, best and clock, to ckpt_last.pt, and ckpt_best.pt a hard link
        to it if best. Non-finite weights or Adam moments (an overflowing update) stop the run."""
        ckpt = dict(ckpt, step=step, best_val_loss=self.best_val_loss, best_step=self.best_step,
                    last_est=self.last_est, elapsed=self.elapsed(), tokens=self.tokens(step))
        named = [*ckpt['model'].items()]  # the model's tensors
        for i, state in ckpt['optimizer']['state'].items():  # AdamW's moments of parameter i
            named += [(f"optimizer state {k} of parameter {i}", v) for k, v in state.items()]
        if bad := nonfinite(named):
            self.stop(step, f"{bad[0]} is not finite ({len(bad)} of {len(named)})")
        with self.saving:
            self._write(step, save, ckpt, self.path('ckpt_last.pt'))
            self.saved_step = step
            if best:
                self._write(step, link, self.path('ckpt_last.pt'), self.path('ckpt_best.pt'))
        self.summary(step)

    def _write(self, step, write, *args):
        try:
            write(*args)
        except CheckpointError as e:  # a full disk, a read-only out_dir: the last one is intact
            with contextlib.suppress(SystemExit):  # on record where the few bytes still fit
                self.record_stop(step, str(e))
            die(f"{e}; stopped at step {step}: {self.last_saved()}")

    def summary(self, step, status=None, locked=False):
        device = self.facts['device']
        best = self.best_val_loss if self.best_val_loss < float('inf') else None
        gpu_mib = round(torch.cuda.max_memory_allocated(device) / 2**20) if 'cuda' in device \
            else None
        summary = {'status': status or ('finished' if step >= self.train_steps else 'running'),
                   'step': step, 'train_steps': self.train_steps,
                   'final_train_loss': self.last_est.get('train'),
                   'final_val_loss': self.last_est.get('val'), 'best_val_loss': best,
                   'tokens_seen': self.tokens(step), 'epochs': round(self.epochs(step), 4),
                   **self.whole,
                   'wall_time_s': round(self.elapsed(), 1), **self.facts,
                   'peak_gpu_memory_mib': gpu_mib}
        with contextlib.nullcontext() if locked else self.saving:  # a signal waits for it too
            self._write(step, atomic_write, self.path('summary.json'),
                        lambda f: f.write(json.dumps(summary, indent=2).encode()))

    def stop(self, step, reason):
        """Stop the run on every rank without saving: ckpt_last.pt stays the last good one."""
        with self.saving:
            self.record_stop(step, reason)
        die(f"{reason} at step {step}; stopped without saving: {self.last_saved(advice=False)}")

    def record_stop(self, step, reason):
        """The stop in log.jsonl and summary.json: why, where, how to go on. self.saving is held."""
        if self.master and self.started:
            self.record_stop = lambda step, reason: None  # once: the writes below may fail too
            resume = resume_command(self.dir) if self.saved_step is not None else None
            self.log({'type': 'stop', 'step': step, 'reason': reason,
                      'last_checkpoint_step': self.saved_step, 'resume': resume})
            self.log = lambda rec: None  # the last record (the main thread may log on, briefly)
            self.facts['resume'] = resume
            self.summary(step, 'stopped: ' + reason, locked=True)

    def catch_signals(self):
        """From here a signal (Ctrl-C, SIGTERM, a closed output pipe), even in a torch op of
        minutes, stops the run after a save under way: recorded, one line, exit 128 + signum.
        A lost DDP rank: one line, exit 1."""
        r, w = os.pipe()  # Python's C-level handler writes each signal's number here, waking
        os.set_blocking(w, False)  # the thread below (torch ops release the GIL)
        for sig in STOP_SIGNALS:  # the main thread stops too, at its next bytecode, unless saving
            signal.signal(sig, lambda signum, frame: self._stop(signum, wait=False))
        signal.set_wakeup_fd(w)
        threading.Thread(target=_stop_on_signal, args=(weakref.ref(self), r), daemon=True).start()
        sys.excepthook = self._excepthook
        if os.environ.get('RANK') and sys.platform == 'linux':  # the rank dies with torchrun
            import ctypes
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # prctl(PR_SET_PDEATHSIG, SIGKILL)

    def _stop(self, signum, wait=True):  # after a save under way (the main thread, saving, goes on)
        if self.saving.acquire(wait):
            reason = f"interrupted by {signal.Signals(signum).name}"
            with contextlib.suppress(SystemExit):  # a full disk must not keep it from stopping
                self.record_stop(self.step, reason)
            stop(signum, f"error: {reason} at step {self.step}; {self.last_saved()}")

    def _excepthook(self, kind, e, tb):
        if isinstance(e, BrokenPipeError):  # a print after the output's reader has gone
            self._stop(signal.SIGPIPE)
        import torch.distributed as dist
        if not (os.environ.get('RANK') and (isinstance(e, dist.DistError) or "gloo" in str(e)
                                            or "NCCL" in str(e))):
            return sys.__excepthook__(kind, e, tb)
        # a rank killed (kill -9, OOM): the others' collectives fail
        rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        with self.saving:  # one line: the signal torchrun sends next finds the lock taken
            lost = f"rank {1 - rank}" if n == 2 else "a rank"
            saved = self.last_saved(advice=False) if rank == 0 else f"out_dir is {self.dir}"
            with contextlib.suppress(SystemExit):
                self.record_stop(self.step, f"DDP lost {lost}")
            # __stderr__: init_process_group wraps this hook in one that buffers sys.stderr
            print(f"error: rank {rank}: DDP lost {lost} at step {self.step}; {saved}: continue "
                  f"with the same torchrun command and --init_from=resume", file=sys.__stderr__,
                  flush=True)
            os._exit(1)

    def last_saved(self, advice=True):
        """The last checkpoint (or none yet), and with advice how to go on from it."""
        if self.saved_step is None:
            advice = advice * " (the same command starts the run over)"
            return "no checkpoint was saved yet" + advice
        return (f"the last checkpoint, {self.path('ckpt_last.pt')}, is from step {self.saved_step}"
                + (f": continue with {resume_command(self.dir)}" if advice else ""))


def resume_command(out_dir):
    """The whole command that continues the run in out_dir: its config is in the checkpoint."""
    launch, n = 'python', os.environ.get('LOCAL_WORLD_SIZE')
    if 'RANK' in os.environ:  # torchrun's options for one node, else the run's own
        one_node = n is not None and n == os.environ.get('WORLD_SIZE')
        launch = f'torchrun --standalone --nproc_per_node={n}' if one_node else 'torchrun ...'
    args = ['train.py', '--init_from=resume', f'--out_dir={out_dir}']
    return f"{launch} {shlex.join(args)}"
