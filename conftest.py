"""What the test files share: the repository's root, train.py's defaults (read
without torch), one torch thread, a signal sent after the reader of a pipe has gone, the tiny model
and data the training tests use, a script run in this process, and the tiny run trained once for
every test that reads, samples or resumes it."""
import contextlib
import gc
import io
import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.abspath(__file__))


def pytest_configure(config):
    # one torch thread in the test process, as OMP_NUM_THREADS=1 gives the scripts the tests run:
    # the tensors are tiny, and extra threads only add overhead (on a busy machine 40x: 300 tokens
    # of a tiny model took 7.7 s with 2 threads beside two training runs, 0.19 s with one)
    import torch
    torch.set_num_threads(1)


def signal_after_reader_gone(proc, sig, timeout):
    """Send sig to proc once the reader of its output pipe has gone (as `... | tee log` after the
    same Ctrl-C stopped tee): nothing it writes can arrive. Returns its exit status."""
    try:
        proc.send_signal(signal.SIGSTOP)  # the signal reaches it after the pipe's reader has gone
        proc.stdout.close()
        proc.send_signal(sig)
        proc.send_signal(signal.SIGCONT)
        return proc.wait(timeout=timeout)
    finally:
        proc.kill()


sys.path.insert(0, os.path.join(ROOT, 'experiments'))  # report.py, which the tests import
from report import train_defaults  # noqa: E402,F401 (the tests import it from here)


# one thread per process: tiny models gain nothing from two, and lose a lot when the cores are busy
ENV = dict(os.environ, OMP_NUM_THREADS='1')
# a tiny AED model (with the MSE embedding loss and the positional subtraction) on a tiny corpus
TINY = ['--arch=aed', '--vocab_size=1024', '--n_layer=1', '--n_embed=16', '--n_head=2',
        '--context_size=16', '--embedding_loss_type=MSE', '--sub_pos_embed_to_decoder=YES_NO_LN',
        '--batch_size=4', '--gradient_accumulation_steps=2', '--lr=3e-3', '--warmup_iters=2',
        '--lr_decay_iters=1000', '--est_steps=2', '--compile=False', '--dtype=float32',
        '--device=cpu']


def make_data(root, n_train=6000, n_val=1500):
    # a fixed random 61-token "sentence", repeated: learnable in a few dozen steps
    # (ids < TINY's vocab_size)
    rng = np.random.default_rng(0)
    sentence = rng.integers(0, 1024, size=61)
    d = os.path.join(root, 'tiny')
    os.makedirs(d, exist_ok=True)
    for split, n in (('train', n_train), ('val', n_val)):
        seq = np.tile(sentence, n // 61 + 1)[:n].astype(np.uint16)
        seq.tofile(os.path.join(d, f'{split}.bin'))
    return str(root)


def run_here(script, *args, root=ROOT):
    """Run root's script in this process, as `python script args` would (exit status, stdout,
    stderr), for the cases that need no process of their own (no signals, no second run alive): no
    torch import each time."""
    import torch
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM,
                                                      signal.SIGPIPE)}
    out, err, argv, status = io.StringIO(), io.StringIO(), sys.argv, 0
    sys.argv = [script, *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                torch.random.fork_rng():
            runpy.run_path(os.path.join(root, script), run_name='__main__')
    except SystemExit as e:
        status = e.code
    finally:
        sys.argv = argv
        for sig, h in handlers.items():
            signal.signal(sig, h)
        signal.set_wakeup_fd(-1)  # train.py's signal pipe: this process's signals are its own again
        sys.excepthook = sys.__excepthook__  # (train.py's holds its run)
        gc.collect()  # closes the run's files, and so releases its lock on out_dir
    return subprocess.CompletedProcess([script, *args], status, out.getvalue(), err.getvalue())


def steps_logged(out_dir):
    try:
        with open(os.path.join(out_dir, 'log.jsonl')) as f:
            return sum(json.loads(line)['type'] == 'step' for line in f if line.endswith('\n'))
    except FileNotFoundError:
        return 0


TINY_RUN_STEPS = 40


TINY_RUNS = {}  # made by the first test that asks for them, read by every later one


@pytest.fixture
def tiny_runs(tmp_path_factory):
    """make_tiny_runs' runs, made once for all the tests."""
    if not TINY_RUNS:
        TINY_RUNS.update(make_tiny_runs(tmp_path_factory))
    return TINY_RUNS


def make_tiny_runs(tmp_path_factory):
    """The tiny AED trained 40 steps on the tiny data, once for every test that reads, samples or
    resumes it: 'full' uninterrupted (its output in 'full_stdout'); 'resumed', the same run killed
    with kill -9 after step 17 (its last checkpoint's step in 'killed_step'), then resumed to the
    end (its output in 'resumed_stdout'); 'data', the data_dir; 'common', the arguments of both.
    Read only: copy a run (shutil.copytree) before changing it."""
    import torch
    root = tmp_path_factory.mktemp('tiny_runs')
    data = make_data(root)
    common = TINY + [f'--data_dir={data}', '--dataset=tiny', f'--train_steps={TINY_RUN_STEPS}',
                     '--est_interval=10', '--save_interval=5', '--log_interval=10']
    full, resumed = str(root / 'full'), str(root / 'resumed')
    # both at once: the full run beside the one to kill
    proc = subprocess.Popen([sys.executable, 'train.py', *common, f'--out_dir={resumed}'],
                            cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        with subprocess.Popen([sys.executable, 'train.py', *common, f'--out_dir={full}'],
                              cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) as p:
            deadline = time.time() + 120
            while time.time() < deadline and proc.poll() is None and steps_logged(resumed) < 17:
                time.sleep(0.05)
            assert proc.poll() is None, ('the run ended before it could be killed: '
                                         + proc.stderr.read())
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            stdout, stderr = p.communicate(timeout=300)
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    assert p.returncode == 0, stderr
    killed_step = torch.load(os.path.join(resumed, 'ckpt_last.pt'), weights_only=True)['step']
    r = run_here('train.py', *common, f'--out_dir={resumed}', '--init_from=resume')
    assert r.returncode == 0, r.stderr
    return dict(full=full, resumed=resumed, data=data, common=common, full_stdout=stdout,
                killed_step=killed_step, resumed_stdout=r.stdout)
