"""
Tests of configurator.py, train.py, sample.py and checkpoint.py. The scripts run as users run them
(subprocesses; cases that need no process of their own run in this process through run_here) on tiny
models and tiny generated data.
"""
import contextlib
import errno
import gc
import io
import json
import os
import re
import runpy
import shutil
import signal
import struct
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest
import torch

from configurator import ConfigError, collect_defaults, load_config

ROOT = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable

# a tiny AED model (with the MSE embedding loss and the positional subtraction) on a tiny corpus
TINY = ['--arch=aed', '--vocab_size=1024', '--n_layer=1', '--n_embed=16', '--n_head=2', '--context_size=16',
        '--embedding_loss_type=MSE', '--sub_pos_embed_to_decoder=YES_NO_LN',
        '--batch_size=4', '--gradient_accumulation_steps=2', '--lr=3e-3', '--warmup_iters=2',
        '--lr_decay_iters=1000', '--est_steps=2', '--compile=False', '--dtype=float32', '--device=cpu']


# ----------------------------------------------------------------------------- configurator
DEFAULTS = {'lr': 9e-4, 'batch_size': 50, 'compile': True, 'out_dir': 'out', 'detach_type': None,
            'gradient_accumulation_steps': 16}


def test_cli_values_types_and_order(tmp_path):
    cfg = tmp_path / 'c.py'
    cfg.write_text("import math\nlr = 1\nbatch_size = 8\n_helper = 3\nout_dir = 'out-' + str(math.floor(2.5))\n")
    c = load_config(DEFAULTS, [str(cfg), '--batch_size=4', '--compile=false', '--detach_type=ENCODER_OUT'])
    assert c['lr'] == 1.0 and isinstance(c['lr'], float)  # int accepted for a float key
    assert c['batch_size'] == 4  # the command line wins over the file before it
    assert c['compile'] is False and c['out_dir'] == 'out-2' and c['detach_type'] == 'ENCODER_OUT'
    assert load_config(DEFAULTS, ['--out_dir=a=b=c'])['out_dir'] == 'a=b=c'  # split on the first '='
    assert load_config(DEFAULTS, ['--out_dir=2024'])['out_dir'] == '2024'  # str keys keep the text
    assert load_config(DEFAULTS, ['--detach_type=None'])['detach_type'] is None
    assert load_config(DEFAULTS, ['--lr=3e-4'])['lr'] == 3e-4
    assert DEFAULTS['batch_size'] == 50  # defaults untouched


@pytest.mark.parametrize('argv, words', [
    (['--gradient_acumulation_steps=2'], ["unknown config key 'gradient_acumulation_steps'",
                                          "did you mean 'gradient_accumulation_steps'"]),
    (['--batch_size=2.5'], ['batch_size', 'expected int', 'float']),
    (['--batch_size=True'], ['batch_size', 'expected int', 'bool']),
    (['--lr=fast'], ['lr', 'expected float', 'str']),
    (['--compile=yes'], ['compile', 'expected bool']),
    (['--lr'], ['expected --key=value']),
    (['no/such/config.py'], ['config file not found: no/such/config.py']),
])
def test_config_errors(argv, words):
    with pytest.raises(ConfigError) as e:
        load_config(DEFAULTS, argv)
    msg = str(e.value)
    assert '\n' not in msg
    for w in words:
        assert w in msg


def test_config_file_errors(tmp_path):
    bad = tmp_path / 'bad.py'
    bad.write_text("batch_sise = 8\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'batch_sise' in .*did you mean 'batch_size'"):
        load_config(DEFAULTS, [str(bad)])
    bad.write_text("lr = 'high'\n")
    with pytest.raises(ConfigError, match=r"lr in .*expected float"):
        load_config(DEFAULTS, [str(bad)])
    bad.write_text("lr = = 1\n")
    with pytest.raises(ConfigError, match=r"bad.py:1: syntax error"):
        load_config(DEFAULTS, [str(bad)])


def test_collect_defaults():
    ns = {'lr': 1e-3, 'name': 'x', 'flag': False, 'opt': None, '_private': 1, 'os': os, 'fn': len, 'lst': [1]}
    assert collect_defaults(ns) == {'lr': 1e-3, 'name': 'x', 'flag': False, 'opt': None}


def test_every_config_file_loads():
    # each shipped config names only known keys with the right types, and builds a valid ModelConfig
    import dataclasses
    from model import ModelConfig
    defaults = script_defaults()
    for name in sorted(os.listdir(os.path.join(ROOT, 'config'))):
        if name.endswith('.py'):
            c = load_config(defaults, [os.path.join(ROOT, 'config', name)])
            ModelConfig(**{f.name: c[f.name] for f in dataclasses.fields(ModelConfig)})


def script_defaults():
    # train.py's DEFAULTS, without running it: exec the block between its first two '# ---' lines
    import dataclasses
    from model import ModelConfig
    src = open(os.path.join(ROOT, 'train.py')).read()
    head = src.split('\n# ' + '-' * 77 + '\n')[1]
    ns = {'dataclasses': dataclasses, 'ModelConfig': ModelConfig, 'collect_defaults': collect_defaults}
    exec(head, ns)
    return ns['DEFAULTS']


def test_author_configs_param_counts():
    from model import ModelConfig, build_model
    import dataclasses
    defaults = script_defaults()
    expect = {'aed_mse_possub': 15_763_500, 'baseline': 16_036_800, 'baseline_small': 15_441_192,
              'baseline_dropout': 16_036_800}
    for name, n in expect.items():
        c = load_config(defaults, [os.path.join(ROOT, 'config', name + '.py')])
        m = build_model(ModelConfig(**{f.name: c[f.name] for f in dataclasses.fields(ModelConfig)}))
        assert m.get_num_params() == n, name


# ----------------------------------------------------------------------------- helpers
# one thread per process: tiny models gain nothing from two, and lose a lot when the cores are busy
ENV = dict(os.environ, OMP_NUM_THREADS='1')


def run(script, *args, timeout=120):
    return subprocess.run([PY, script, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=ENV)


def make_data(root, n_train=6000, n_val=1500):
    # a fixed random 61-token "sentence", repeated: learnable in a few dozen steps (ids < TINY's vocab_size)
    rng = np.random.default_rng(0)
    sentence = rng.integers(0, 1024, size=61)
    d = os.path.join(root, 'tiny')
    os.makedirs(d, exist_ok=True)
    for split, n in (('train', n_train), ('val', n_val)):
        seq = np.tile(sentence, n // 61 + 1)[:n].astype(np.uint16)
        seq.tofile(os.path.join(d, f'{split}.bin'))
    return str(root)


def run_here(script, *args):
    """Run a script in this process, as `python script args` would (exit status, stdout, stderr), for the
    cases that need no process of their own (no signals, no second run alive): no torch import each time."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    out, err, argv, status = io.StringIO(), io.StringIO(), sys.argv, 0
    sys.argv = [script, *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), torch.random.fork_rng():
            runpy.run_path(os.path.join(ROOT, script), run_name='__main__')
    except SystemExit as e:
        status = e.code
    finally:
        sys.argv = argv
        for sig, h in handlers.items():
            signal.signal(sig, h)
        gc.collect()  # closes the run's files, and so releases its lock on out_dir
    return subprocess.CompletedProcess([script, *args], status, out.getvalue(), err.getvalue())


def read_log(out_dir):
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
        return [json.loads(line) for line in f]


def load_ckpt(out_dir, name='last'):
    return torch.load(os.path.join(out_dir, f'ckpt_{name}.pt'), map_location='cpu', weights_only=True)


def assert_one_line_error(p, *words):
    assert p.returncode == 1, p.stdout + p.stderr
    err = p.stderr.strip()
    assert 'Traceback' not in err and len(err.splitlines()) == 1, err
    assert err.startswith('error: '), err
    for w in words:
        assert w in err, err


def same_weights(a, b, atol):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=0, atol=atol), (k, (a[k] - b[k]).abs().max())


# ----------------------------------------------------------------------------- script errors
def test_script_errors_are_one_line(tmp_path):
    # what the parser catches is tested above; here: the scripts turn every bad input into one line
    p = run('train.py', '--lrr=1')
    assert_one_line_error(p, "unknown config key 'lrr'", "did you mean 'lr'")
    p = run('train.py', '--arch=bert')
    assert_one_line_error(p, 'model config', 'arch')
    p = run('train.py', *TINY, f'--data_dir={tmp_path}', f'--out_dir={tmp_path}/out')
    assert_one_line_error(p, os.path.join(str(tmp_path), 'wikipedia', 'train.bin'), 'run python prepare.py')
    p = run('train.py', *TINY, f'--out_dir={tmp_path}/none', '--init_from=resume')
    assert_one_line_error(p, 'no checkpoint at')
    p = run('sample.py', f'--out_dir={tmp_path}/none', '--num_samples=2')
    assert_one_line_error(p, 'no checkpoint at')
    os.makedirs(tmp_path / 'junk')
    (tmp_path / 'junk' / 'ckpt_best.pt').write_bytes(b'not a checkpoint')
    p = run('sample.py', f'--out_dir={tmp_path}/junk')
    assert_one_line_error(p, 'cannot read', 'not a checkpoint written by train.py')
    p = run('sample.py', f'--out_dir={tmp_path}/junk', '--compile=True', '--kv_cache=False')
    assert_one_line_error(p, '--compile=True', 'needs --kv_cache=True')


# ----------------------------------------------------------------------------- training runs
def test_train_kill_resume_sample(tmp_path):
    """An uninterrupted run and a run killed with kill -9 then resumed end with the same weights."""
    data = make_data(tmp_path)
    common = TINY + [f'--data_dir={data}', '--dataset=tiny', '--train_steps=40', '--est_interval=10',
                     '--save_interval=5', '--log_interval=10']
    full = str(tmp_path / 'full')
    p = run('train.py', *common, f'--out_dir={full}')
    assert p.returncode == 0, p.stderr
    assert 'train loss' in p.stdout and 'val loss' in p.stdout and 'tok/s' in p.stdout and 'emb' in p.stdout
    log = read_log(full)
    steps = [r for r in log if r['type'] == 'step']
    ests = [r for r in log if r['type'] == 'est']
    assert [r['step'] for r in steps] == list(range(1, 41))  # every step is in the log
    assert [r['step'] for r in ests] == [0, 10, 20, 30, 40]
    assert all(r['emb'] is not None and r['ce'] > 0 and r['loss'] > r['ce'] for r in steps)
    assert ests[-1]['val'] < ests[0]['val'] - 1.0  # it learns
    summary = json.load(open(os.path.join(full, 'summary.json')))
    assert summary['status'] == 'finished' and summary['step'] == 40
    assert summary['tokens_seen'] == 40 * 4 * 2 * 16 and summary['params'] > 0
    assert summary['best_val_loss'] == min(r['val'] for r in ests)
    assert load_ckpt(full, 'best')['best_val_loss'] == summary['best_val_loss']

    # the same run, killed mid-way with SIGKILL
    killed = str(tmp_path / 'killed')
    proc = subprocess.Popen([PY, 'train.py', *common, f'--out_dir={killed}'], cwd=ROOT, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 90
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(os.path.join(killed, 'log.jsonl')):
            if any(r['type'] == 'step' and r['step'] >= 17 for r in read_log(killed)):
                break
        time.sleep(0.05)
    assert proc.poll() is None, 'the run ended before it could be killed: ' + proc.stderr.read()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ckpt = load_ckpt(killed)
    assert 15 <= ckpt['step'] < 40 and ckpt['step'] % 5 == 0
    p = run('train.py', *common, f'--out_dir={killed}', '--init_from=resume')
    assert p.returncode == 0, p.stderr
    assert f"resuming from {os.path.join(killed, 'ckpt_last.pt')} at step {ckpt['step']}" in p.stdout
    final = load_ckpt(killed)
    assert final['step'] == 40
    same_weights(load_ckpt(full)['model'], final['model'], atol=1e-5)
    assert json.load(open(os.path.join(killed, 'summary.json')))['status'] == 'finished'

    # a resume needs only out_dir: the rest of the config comes from the checkpoint
    p = run('train.py', f'--out_dir={killed}', '--init_from=resume', '--train_steps=42', '--device=cpu')
    assert p.returncode == 0, p.stderr
    assert load_ckpt(killed)['step'] == 42
    p = run('train.py', f'--out_dir={killed}', '--init_from=resume', '--n_embed=32')
    assert_one_line_error(p, 'cannot change n_embed when resuming')

    # sample from it, without the KV cache, with it, and with it and the compiled one-token step
    prompt = tmp_path / 'prompt.txt'
    prompt.write_text('The first of the')  # GPT-2 ids 464, 717, 286, 262: all < vocab_size 1024
    outs = []
    for flags in (['--kv_cache=False'], ['--kv_cache=True'], ['--kv_cache=True', '--compile=True']):
        p = run('sample.py', f'--out_dir={killed}', f'--start=FILE:{prompt}', '--num_samples=2',
                '--max_new_tokens=20', '--device=cpu', '--top_k=0', *flags)
        assert p.returncode == 0, p.stderr
        assert p.stdout.count('---------------') == 2 and p.stdout.startswith('The first of the')
        outs.append(p.stdout)
    assert outs[0] == outs[1] == outs[2]  # same seed, same samples: the cache and compiling change speed only


def test_nan_loss_stops_without_saving(tmp_path):
    """A NaN loss stops the run with a clear message; the last good checkpoint stays as it was."""
    data = make_data(tmp_path)
    out = str(tmp_path / 'out')
    # make the model's loss NaN from the 13th optimizer step on (2 micro-steps per step)
    wrapper = tmp_path / 'nan_train.py'
    wrapper.write_text(f'''
import runpy, sys
sys.path.insert(0, {ROOT!r})
import model
build = model.build_model
def build_nan(cfg):
    m = build(cfg)
    forward, calls = m.forward, [0]
    def nan_forward(*args, **kwargs):
        logits, loss = forward(*args, **kwargs)
        if m.training:
            calls[0] += 1
            if calls[0] > 24:
                loss = loss * float('nan')
        return logits, loss
    m.forward = nan_forward
    return m
model.build_model = build_nan
sys.argv = ['train.py'] + sys.argv[1:]
runpy.run_path('train.py', run_name='__main__')
''')
    args = TINY + [f'--data_dir={data}', '--dataset=tiny', '--train_steps=40', '--est_interval=5',
                   f'--out_dir={out}']
    p = subprocess.run([PY, str(wrapper), *args], cwd=ROOT, capture_output=True, text=True, timeout=120, env=ENV)
    assert_one_line_error(p, 'training loss is nan at step 12', 'stopped without saving')
    ckpt = load_ckpt(out)
    assert ckpt['step'] == 10
    assert all(torch.isfinite(v).all() for v in ckpt['model'].values())
    log = read_log(out)
    assert log[-1]['type'] == 'stop' and max(r['step'] for r in log if r['type'] == 'step') == 12
    assert json.load(open(os.path.join(out, 'summary.json')))['status'].startswith('stopped')


def test_torchrun_two_processes_match_one(tmp_path):
    """2 gloo ranks x 1 micro-step == 1 process x 2 micro-steps: different batches per rank,
    gradients averaged once per step."""
    data = make_data(tmp_path)
    common = TINY + [f'--data_dir={data}', '--dataset=tiny', '--train_steps=6', '--est_interval=3']
    one = str(tmp_path / 'one')
    p = run('train.py', *common, f'--out_dir={one}')
    assert p.returncode == 0, p.stderr
    two = str(tmp_path / 'two')
    p = subprocess.run([PY, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', 'train.py',
                        *common, f'--out_dir={two}'], cwd=ROOT, capture_output=True, text=True, timeout=180,
                       env=ENV)
    assert p.returncode == 0, p.stderr[-3000:]
    assert '2 process(es)' in p.stdout and p.stdout.count('step 6/6') == 1  # only rank 0 logs
    a, b = load_ckpt(one), load_ckpt(two)
    assert b['step'] == 6
    same_weights(a['model'], b['model'], atol=1e-4)
    # and the ranks did not draw the same batch: rank 0's batch alone gives other weights
    same = str(tmp_path / 'same')
    p = run('train.py', *common, '--gradient_accumulation_steps=1', f'--out_dir={same}')
    assert p.returncode == 0, p.stderr
    c = load_ckpt(same)
    assert max((b['model'][k] - c['model'][k]).abs().max() for k in c['model']) > 1e-3


# ----------------------------------------------------------------------------- reliability (issue 12)
def test_bad_values_and_data_are_one_line(tmp_path):
    nodata = [*TINY, f'--data_dir={tmp_path}', '--dataset=none', f'--out_dir={tmp_path}/out']
    for arg, words in [('--lr=-1', 'lr must be > 0, got -1.0'), ('--lr=0', 'lr must be > 0'),
                       ('--min_lr=-1', 'min_lr must be >= 0'), ('--weight_decay=-1', 'weight_decay must be >= 0'),
                       ('--grad_clip=-1', 'grad_clip must be >= 0'), ('--beta1=1.5', 'beta1 must be in [0, 1)'),
                       ('--beta2=1', 'beta2 must be in [0, 1)'), ('--device=banana', "got 'banana'"),
                       ('--out_dir=', 'out_dir must not be empty'), ('--ddp_timeout=0', 'ddp_timeout must be > 0')]:
        assert_one_line_error(run_here('train.py', *nodata, arg), words)
    assert_one_line_error(run_here('sample.py', '--device=banana'), "got 'banana'")

    def bad_data(name, train=None, meta=None):
        d = make_data(tmp_path / name)
        if train is not None:
            (tmp_path / name / 'tiny' / 'train.bin').write_bytes(train)
        if meta is not None:
            (tmp_path / name / 'tiny' / 'meta.json').write_text(meta)
        return run_here('train.py', *TINY, f'--data_dir={d}', '--dataset=tiny', f'--out_dir={tmp_path}/{name}/out')
    train_bin = os.path.join(str(tmp_path), 'empty', 'tiny', 'train.bin')
    assert_one_line_error(bad_data('empty', train=b''), train_bin, 'has 0 tokens')
    assert_one_line_error(bad_data('odd', train=b'\x01' * 1001), 'odd number of bytes (1001)')
    ids = np.full(500, 7, dtype=np.uint16)
    ids[321] = 2000  # >= TINY's vocab_size 1024
    assert_one_line_error(bad_data('big_id', train=ids.tobytes()), 'holds token id 2000, but vocab_size is 1024')
    assert_one_line_error(bad_data('meta', meta='{"vocab_size": 50257,'), 'cannot read', 'meta.json')
    assert_one_line_error(bad_data('meta_list', meta='[1, 2]'), 'meta.json', 'expected a JSON object')


def test_nan_weights_are_never_saved(tmp_path):
    """A step with a finite loss but non-finite weights (lr=1e4: the update overflows) stops the run
    before the next save, so ckpt_last.pt stays the last finite one; a diverged checkpoint is refused."""
    data = make_data(tmp_path)
    out = str(tmp_path / 'out')
    p = run_here('train.py', *TINY, f'--data_dir={data}', '--dataset=tiny', f'--out_dir={out}', '--lr=1e4',
                 '--warmup_iters=0', '--train_steps=60', '--est_interval=20', '--save_interval=1')
    assert_one_line_error(p, 'are not finite', 'at step 2; stopped without saving',
                          f"the last checkpoint, {os.path.join(out, 'ckpt_last.pt')}, is from step 1")
    steps = [r for r in read_log(out) if r['type'] == 'step']
    assert steps[-1]['step'] == 2 and np.isfinite(steps[-1]['loss'])  # the loss alone saw nothing wrong
    ckpt = load_ckpt(out)
    assert ckpt['step'] == 1 and all(torch.isfinite(v).all() for v in ckpt['model'].values())
    # a diverged checkpoint (as the old guard wrote them) is refused, not sampled from
    ckpt['model']['wte.weight'][3, 5] = float('nan')
    del ckpt['checksum']
    torch.save(ckpt, os.path.join(out, 'ckpt_last.pt'))
    assert_one_line_error(run_here('sample.py', f'--out_dir={out}', '--checkpoint=last', '--device=cpu'),
                          '1 of', 'weight tensors hold NaN or inf (e.g. wte.weight)')


@pytest.fixture(scope='module')
def tiny_ckpt(tmp_path_factory):
    """A finished 4-step run: its directory (read only: copy before changing anything)."""
    tmp = tmp_path_factory.mktemp('tiny_ckpt')
    data = make_data(tmp)
    out = str(tmp / 'out')
    p = run_here('train.py', *TINY, f'--data_dir={data}', '--dataset=tiny', f'--out_dir={out}', '--train_steps=4',
                 '--est_interval=2')
    assert p.returncode == 0, p.stderr
    return out


def test_damaged_and_hostile_checkpoints_are_refused(tmp_path, tiny_ckpt, monkeypatch):
    import model
    out = str(tmp_path / 'out')
    path = os.path.join(out, 'ckpt_best.pt')

    def sample(*args):
        return run_here('sample.py', f'--out_dir={out}', '--device=cpu', '--max_new_tokens=2', *args)

    # a flipped byte in the largest tensor's data: torch.load does not notice, the checksum does
    shutil.copytree(tiny_ckpt, out)
    raw = bytearray(open(path, 'rb').read())
    with zipfile.ZipFile(path) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
    name_len, extra_len = struct.unpack('<HH', raw[info.header_offset + 26:info.header_offset + 30])
    raw[info.header_offset + 30 + name_len + extra_len + 101] ^= 0x10
    with open(path, 'wb') as f:
        f.write(raw)
    assert_one_line_error(sample(), path, 'is damaged', 'checksum')

    # a config that claims a model far larger than the weights in the file: refused before any build
    def build_guarded(cfg):
        assert cfg.n_layer <= 2 and cfg.n_embed <= 32, f'built the claimed model ({cfg.n_layer} x {cfg.n_embed})'
        return build(cfg)
    build = model.build_model
    monkeypatch.setattr(model, 'build_model', build_guarded)
    ckpt = load_ckpt(tiny_ckpt, 'best')
    del ckpt['checksum']  # a hand-made file: no checksum to fail
    for change, words in [({'n_layer': 400, 'n_embed': 1024, 'n_head': 8}, 'its config (n_layer=400) means'),
                          ({'n_embed': 32}, 'wte.weight is (1024, 16) in the file')]:
        torch.save(dict(ckpt, config=dict(ckpt['config'], **change)), path)
        assert_one_line_error(sample(), path, words)
    monkeypatch.setattr(model, 'build_model', build)

    # a resume from a checkpoint that lacks keys, and a prompt file that is not text
    torch.save({k: v for k, v in ckpt.items() if k not in ('optimizer', 'rng')}, os.path.join(out, 'ckpt_last.pt'))
    assert_one_line_error(run_here('train.py', f'--out_dir={out}', '--init_from=resume'),
                          'ckpt_last.pt lacks optimizer, rng')
    shutil.copy(os.path.join(tiny_ckpt, 'ckpt_best.pt'), path)
    (tmp_path / 'prompt.bin').write_bytes(b'\x89PNG\r\n\x1a\n\x00\x00')
    assert_one_line_error(sample(f'--start=FILE:{tmp_path}/prompt.bin'), 'prompt.bin is not UTF-8 text')


def test_full_disk_during_save(tmp_path, monkeypatch):
    import checkpoint
    # the kernel's own "disk full" (/dev/full): one line, and no temporary file left to keep the disk full
    path = str(tmp_path / 'ckpt.pt')
    os.symlink('/dev/full', path + '.tmp')
    with pytest.raises(checkpoint.CheckpointError, match=r'cannot write .*ckpt.pt: No space left on device'):
        checkpoint.save({'x': torch.zeros(100000)}, path)
    assert os.listdir(tmp_path) == []
    # the same in a run: it stops with one line that says which checkpoint is still there
    data = make_data(tmp_path)
    out = str(tmp_path / 'out')
    real = os.fsync
    def fsync_full(fd):
        if os.readlink(f'/proc/self/fd/{fd}').endswith('ckpt_last.pt.tmp') and steps_done() >= 4:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)
    steps_done = lambda: sum(r['type'] == 'step' for r in read_log(out))
    monkeypatch.setattr(os, 'fsync', fsync_full)
    p = run_here('train.py', *TINY, f'--data_dir={data}', '--dataset=tiny', f'--out_dir={out}', '--train_steps=8',
                 '--est_interval=2')
    monkeypatch.setattr(os, 'fsync', real)
    assert_one_line_error(p, f"cannot write {os.path.join(out, 'ckpt_last.pt')}: No space left on device; "
                             f"stopped at step 4: the last checkpoint, {os.path.join(out, 'ckpt_last.pt')}, "
                             f"is from step 2")
    assert sorted(os.listdir(out)) == ['.lock', 'ckpt_best.pt', 'ckpt_last.pt', 'log.jsonl', 'summary.json']
    assert load_ckpt(out)['step'] == 2


def tiny_run(tmp_path, *args):
    data = make_data(tmp_path)
    return run_here('train.py', *TINY, f'--data_dir={data}', '--dataset=tiny', f'--out_dir={tmp_path}/out',
                    '--est_interval=5', *args)


def test_scratch_run_never_replaces_a_run(tmp_path):
    out = str(tmp_path / 'out')
    assert tiny_run(tmp_path, '--train_steps=5').returncode == 0
    log = open(os.path.join(out, 'log.jsonl'), 'rb').read()
    # the same command again, as after a crash: refused, and the run is untouched
    assert_one_line_error(tiny_run(tmp_path, '--train_steps=5'), f'{out} already holds a run', '--init_from=resume',
                          '--overwrite=True')
    assert open(os.path.join(out, 'log.jsonl'), 'rb').read() == log
    os.remove(os.path.join(out, 'ckpt_last.pt'))  # killed before its first save: the log alone counts
    assert_one_line_error(tiny_run(tmp_path, '--train_steps=5'), 'already holds a run (log.jsonl)')
    p = tiny_run(tmp_path, '--train_steps=2', '--overwrite=True')  # starting over on purpose
    assert p.returncode == 0, p.stderr
    assert read_log(out)[0]['type'] == 'start' and load_ckpt(out)['step'] == 2
    assert json.load(open(os.path.join(out, 'summary.json')))['step'] == 2


def test_resume_repairs_best_and_summary(tmp_path):
    """Killed right after the final save, before ckpt_best.pt was linked and summary.json renamed: the
    resumed run leaves the files the uninterrupted run would have."""
    out = str(tmp_path / 'out')
    assert tiny_run(tmp_path, '--train_steps=5').returncode == 0
    best5, summary5 = load_ckpt(out, 'best'), json.load(open(os.path.join(out, 'summary.json')))
    shutil.copy(os.path.join(out, 'ckpt_best.pt'), tmp_path / 'best5.pt')
    p = tiny_run(tmp_path, '--train_steps=10', '--init_from=resume')
    assert p.returncode == 0, p.stderr
    summary = json.load(open(os.path.join(out, 'summary.json')))
    assert best5['step'] == 5 and load_ckpt(out, 'best')['step'] == 10  # the final estimate is the best
    # the state such a kill leaves: the new ckpt_last.pt, the old ckpt_best.pt, the old summary
    os.remove(os.path.join(out, 'ckpt_best.pt'))  # a hard link to ckpt_last.pt: copying into it would change both
    shutil.copy(tmp_path / 'best5.pt', os.path.join(out, 'ckpt_best.pt'))
    json.dump(dict(summary5, status='running', train_steps=10), open(os.path.join(out, 'summary.json'), 'w'))
    p = tiny_run(tmp_path, '--init_from=resume')
    assert p.returncode == 0, p.stderr
    assert load_ckpt(out, 'best')['step'] == 10
    repaired = json.load(open(os.path.join(out, 'summary.json')))
    for k in ('status', 'step', 'best_val_loss', 'final_train_loss', 'final_val_loss', 'tokens_seen'):
        assert repaired[k] == summary[k], k
    assert repaired['status'] == 'finished'


def test_resume_drops_a_torn_log_line(tmp_path):
    import report
    out = str(tmp_path / 'out')
    assert tiny_run(tmp_path, '--train_steps=5').returncode == 0
    with open(os.path.join(out, 'log.jsonl'), 'a') as f:
        f.write('{"type": "step", "step": 6, "loss": 7.1')  # killed mid-write
    p = tiny_run(tmp_path, '--train_steps=10', '--init_from=resume')
    assert p.returncode == 0, p.stderr
    log = read_log(out)  # every line is JSON
    assert [r['step'] for r in log if r['type'] == 'step'] == list(range(1, 11))
    assert report.load_run(out)['curve'][-1][0] == 10
    assert 'dropped its torn last line (39 bytes)' in p.stdout


def test_one_run_per_out_dir_and_signals(tmp_path):
    """A second run or a resume while a run lives is refused at once; Ctrl-C and SIGTERM stop a run with
    one line that says the step and how to continue it."""
    data = make_data(tmp_path)
    out = str(tmp_path / 'out')
    args = TINY + [f'--data_dir={data}', '--dataset=tiny', f'--out_dir={out}', '--train_steps=100000',
                   '--est_interval=5', '--log_interval=1000']

    def start(*extra, steps):  # a run in the background, once it has taken `steps` steps
        first = len(read_log(out)) if os.path.exists(os.path.join(out, 'log.jsonl')) else 0
        proc = subprocess.Popen([PY, 'train.py', *args, *extra], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 90
        while time.time() < deadline and proc.poll() is None:
            if os.path.exists(os.path.join(out, 'log.jsonl')) and \
                    sum(r['type'] == 'step' for r in read_log(out)[first:]) >= steps:
                return proc
            time.sleep(0.05)
        raise AssertionError('the run ended before it could be stopped: ' + proc.stderr.read())

    proc = start(steps=6)
    try:  # (in this process: the lock is the kernel's, per open file, so it holds against this process too)
        assert_one_line_error(run_here('train.py', *args, '--train_steps=10'),
                              f'{out} is in use by another train.py (pid {proc.pid})')
        assert_one_line_error(run_here('train.py', f'--out_dir={out}', '--init_from=resume'), 'is in use')
    finally:
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
    saved = load_ckpt(out)['step']
    assert proc.returncode == 130 and len(err.strip().splitlines()) == 1, err
    assert re.fullmatch(rf"error: interrupted by SIGINT at step \d+; the last checkpoint, {re.escape(out)}/ckpt_last.pt, "
                        rf"is from step {saved}: continue with --init_from=resume --out_dir={re.escape(out)}\n", err)
    proc = start('--init_from=resume', steps=1)  # the lock went with the process
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 143 and err.startswith('error: interrupted by SIGTERM at step '), err
    assert len(err.strip().splitlines()) == 1 and not [f for f in os.listdir(out) if f.endswith('.tmp')]


def test_ddp_timeout(tmp_path):
    """A rank that never shows up (or hangs) stops the others after ddp_timeout, not torch's 30 minutes."""
    data = make_data(tmp_path)
    # rank 0 of 2 without its partner: the rendezvous waits for it as long as any collective would
    env = dict(ENV, RANK='0', LOCAL_RANK='0', WORLD_SIZE='2', MASTER_ADDR='127.0.0.1', MASTER_PORT=str(free_port()))
    p = subprocess.run([PY, 'train.py', *TINY, f'--data_dir={data}', '--dataset=tiny', f'--out_dir={tmp_path}/out',
                        '--ddp_timeout=2'], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert_one_line_error(p, 'DDP start-up failed on rank 0', 'Timed out after')
    assert int(re.search(r'Timed out after (\d+) seconds', p.stderr)[1]) < 10  # ddp_timeout=2 (+ rounding)


def test_orphaned_ddp_workers_stop(tmp_path):
    """After a kill -9 of torchrun its workers stop too, instead of training on alone."""
    data = make_data(tmp_path)
    args = TINY + [f'--data_dir={data}', '--dataset=tiny', '--train_steps=100000', '--est_interval=50',
                   '--log_interval=1000']
    out = str(tmp_path / 'ddp')
    torchrun = subprocess.Popen([PY, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
                                 'train.py', *args, f'--out_dir={out}'], cwd=ROOT, env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (os.path.exists(os.path.join(out, 'log.jsonl'))
                                              and any(r['type'] == 'step' for r in read_log(out))):
            assert torchrun.poll() is None, 'torchrun ended early'
            time.sleep(0.1)
        workers = children(torchrun.pid)
        assert len(workers) == 2
        torchrun.kill()
        torchrun.wait()
        deadline = time.time() + 30
        while time.time() < deadline and any(alive(pid) for pid in workers):
            time.sleep(0.1)
        assert not any(alive(pid) for pid in workers), 'the workers outlived torchrun'
    finally:
        for pid in [torchrun.pid] + workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        torchrun.wait()


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def children(pid):
    # the processes whose parent is pid (Linux /proc)
    kids = []
    for d in os.listdir('/proc'):
        if d.isdigit():
            try:
                stat = open(f'/proc/{d}/stat').read()
            except OSError:
                continue
            if int(stat.rsplit(')', 1)[1].split()[1]) == pid:
                kids.append(int(d))
    return kids


def alive(pid):
    # running, not a zombie waiting to be reaped
    try:
        return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False
