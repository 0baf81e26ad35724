"""
Tests of configurator.py, train.py, rundir.py, sample.py and checkpoint.py. The scripts run as users
run them (subprocesses; cases that need no process of their own run in this process through
run_here) on tiny models and tiny generated data.
"""
import errno
import io
import json
import math
import os
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import zipfile

import numpy as np
import pytest
import torch

from configurator import ConfigError, collect_defaults, load_config
from conftest import (ENV, TINY, TINY_RUN_STEPS, make_data, run_here, signal_after_reader_gone,
                      train_defaults)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
PY = sys.executable

# ----------------------------------------------------------------------------- configurator
DEFAULTS = {'lr': 9e-4, 'batch_size': 50, 'compile': True, 'out_dir': 'out', 'detach_type': None,
            'gradient_accumulation_steps': 16}


def test_cli_values_types_and_order(tmp_path):
    cfg = tmp_path / 'c.py'
    cfg.write_text("import math\nlr = 1\nbatch_size = 8\n_helper = 3\n"
                   "out_dir = 'out-' + str(math.floor(2.5))\n")
    c = load_config(DEFAULTS,
                    [str(cfg), '--batch_size=4', '--compile=false', '--detach_type=ENCODER_OUT'])
    assert c['lr'] == 1.0 and isinstance(c['lr'], float)  # int accepted for a float key
    assert c['batch_size'] == 4  # the command line wins over the file before it
    assert c['compile'] is False and c['out_dir'] == 'out-2' and c['detach_type'] == 'ENCODER_OUT'
    # split on the first '='
    assert load_config(DEFAULTS, ['--out_dir=a=b=c'])['out_dir'] == 'a=b=c'
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
    (['--lr'], ['expected --lr=value', 'only a boolean key can stand alone']),
    (['--no-lr'], ["unknown config key 'no_lr'"]),
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
    with pytest.raises(ConfigError,
                       match=r"unknown config key 'batch_sise' in .*did you mean 'batch_size'"):
        load_config(DEFAULTS, [str(bad)])
    bad.write_text("lr = 'high'\n")
    with pytest.raises(ConfigError, match=r"lr in .*expected float"):
        load_config(DEFAULTS, [str(bad)])
    bad.write_text("lr = = 1\n")
    with pytest.raises(ConfigError, match=r"bad.py:1: syntax error"):
        load_config(DEFAULTS, [str(bad)])


def test_a_key_set_below_the_keys_section_says_where_keys_go(tmp_path, monkeypatch):
    """A script's global set below its keys (e.g. next to its use) is no key: the error says so
    and where keys go, not just 'unknown' with a far match."""
    script = tmp_path / 'train.py'
    script.write_text("lr = 1.0  # a key\n# ---\nwarmup = 5  # next to its use\n")
    monkeypatch.setattr(sys.modules['__main__'], '__file__', str(script))
    with pytest.raises(ConfigError) as e:
        load_config({'lr': 1.0}, ['--warmup=3'])
    assert str(e.value) == ("unknown config key 'warmup': train.py sets it below its keys, so it "
                            "is not one (keys go above the '# ---' line)")
    with pytest.raises(ConfigError, match="unknown config key 'lrr' .*did you mean 'lr'"):
        load_config({'lr': 1.0}, ['--lrr=3'])


def test_bare_boolean_flags():
    defaults = dict(DEFAULTS, quick=False)
    assert load_config(defaults, ['--quick'])['quick'] is True  # a boolean key alone means True
    assert load_config(defaults, ['--no-compile'])['compile'] is False
    # in order, as always
    assert load_config(defaults, ['--no_compile', '--compile'])['compile'] is True
    assert load_config(defaults, ['--quick=False'])['quick'] is False


def test_config_file_include(tmp_path):
    (tmp_path / 'base.py').write_text("lr = 1\nbatch_size = 8\nout_dir = 'base'\n")
    (tmp_path / 'sub').mkdir()
    child = tmp_path / 'sub' / 'child.py'
    child.write_text("include('../base.py')  "
                     "# relative to this file, not to the working directory\n"
                     "batch_size = 4\n")
    c = load_config(DEFAULTS, [str(child), '--out_dir=cli'])
    # later lines and the command line win
    assert (c['lr'], c['batch_size'], c['out_dir']) == (1.0, 4, 'cli')
    child.write_text("batch_size = 4\ninclude('../base.py')\n")
    # an include sets its keys where it stands
    assert load_config(DEFAULTS, [str(child)])['batch_size'] == 8
    child.write_text("include('nope.py')\n")
    with pytest.raises(ConfigError,
                       match=r"child.py: include\('nope.py'\): config file not found: .*nope.py"):
        load_config(DEFAULTS, [str(child)])
    child.write_text("include('bytes_comon.py')\n")  # a typo: the nearest file, here or in config/
    with pytest.raises(ConfigError, match=r"\(did you mean config/bytes_common.py\?\)"):
        load_config(DEFAULTS, [str(child)])
    child.write_text("include('child.py')\n")
    with pytest.raises(ConfigError, match=r"child.py: RecursionError: maximum recursion depth"):
        load_config(DEFAULTS, [str(child)])
    (tmp_path / 'base.py').write_text("lr = 'high'\n")
    child.write_text("include('../base.py')\n")
    # names the file with the mistake
    with pytest.raises(ConfigError, match=r"lr in .*base.py: expected float"):
        load_config(DEFAULTS, [str(child)])


@pytest.mark.parametrize('script, sources, line', [
    ('train.py', ['train.py', 'model.py'], "  lr = 0.0009 .*# peak learning rate"),
    ('sample.py', ['sample.py'],
     "  temperature = 0.8 .*# < 1 sharper, > 1 more random; 0 = greedy"),
    ('bench.py', ['bench.py'], "  quick = False .*# "),
    ('prepare.py', ['prepare.py'], "  eot = True .*# encode <\\|endoftext\\|>.*--no-eot"),
    ('experiments/report.py', ['experiments/report.py'], "  svg = '' .*# write the chart here"),
])
def test_help(script, sources, line):
    """--help (or -h) prints the script's docstring and every key with its default and the comment
    beside it in the source, and exits 0, whatever else is on the command line."""
    from configurator import key_comments
    # in this process: the text is the subject (a real --help: test_help_into_a_closed_pipe_...)
    p = run_here(script, '--no_such_key=1', '-h' if script == 'prepare.py' else '--help')
    assert p.returncode == 0 and p.stderr == '', p.stderr
    assert re.search(line, p.stdout, re.M), p.stdout
    assert p.stdout.startswith(
        open(os.path.join(ROOT, script)).read().split('"""')[1].strip().splitlines()[0])
    comments = {}
    for src in reversed(sources):
        comments.update(key_comments(os.path.join(ROOT, src)))
    keys = [m.group(1) for m in re.finditer(r'^  (\w+) = ', p.stdout, re.M)]
    assert len(keys) >= 5
    for key in keys:
        shown = re.search(rf'^  {key} = .*$', p.stdout, re.M).group(0)
        if key in comments:
            assert shown.endswith('# ' + comments[key]), shown
    if script == 'train.py':  # report.py's reading of train.py is what train.py runs with
        assert keys == list(train_defaults())
        for key, value in train_defaults().items():
            assert re.search(rf'^  {key} = {re.escape(repr(value))}( |$)', p.stdout, re.M), key
        # from model.py
        assert re.search(r'^  n_layer = 13 .*# AED: n_layer encoder blocks', p.stdout, re.M)


@pytest.mark.parametrize('script', ['train.py', 'bench.py', 'experiments/report.py',
                                    'experiments/floors.py'])
def test_help_into_a_closed_pipe_ends_quietly(script):
    """`python script --help | head -2`: the reader gone, the script ends without a traceback."""
    r, w = os.pipe()
    os.close(r)  # gone before the first write: every write meets it
    p = subprocess.run([PY, script, '--help'], cwd=ROOT, env=ENV, stdout=w,
                       stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(w)
    assert p.returncode in (0, -signal.SIGPIPE) and p.stderr == '', p.stderr


def test_docs_references_lead_somewhere():
    """Every "docs/X.md, Heading" in the Python files (--help shows some) names a file and a heading
    of it that exist."""
    headings = {name: [line.lstrip('#').strip() for line in open(os.path.join(ROOT, 'docs', name))
                       if line.startswith('#')] for name in os.listdir(os.path.join(ROOT, 'docs'))}
    files = [f for f in os.listdir(ROOT) if f.endswith('.py') and not f.startswith('test_')]
    files += ['config/' + f for f in os.listdir(os.path.join(ROOT, 'config'))]
    files += ['experiments/report.py']
    checked = 0
    for name in files:
        text = open(os.path.join(ROOT, name)).read()
        text = re.sub(r'\n\s*#?\s*', ' ', text)  # a reference may go on on the next line
        for m in re.finditer(r'docs/(\w+\.md)(, "?([^"]*))?', text):
            checked += m[3] is not None
            assert m[1] in headings, (name, m[0])
            assert m[3] is None or any(m[3].startswith(h) and not m[3][len(h):len(h) + 1].isalnum()
                                       for h in headings[m[1]]), (name, m[0][:60])
    assert checked > 10  # the pattern still finds the references with a heading


def test_readme_fits_and_cites_what_it_reproduces():
    """README within 100 columns (its diagram too) and 15,000 bytes; it and docs/model.md cite the
    author's write-up and code; its one figure for the AED preset is experiments/results.md's."""
    readme = open(os.path.join(ROOT, 'README.md'), encoding='utf-8').read()
    assert len(readme.encode()) < 15000
    assert max(len(line) for line in readme.splitlines()) <= 100
    model_md = open(os.path.join(ROOT, 'docs', 'model.md'), encoding='utf-8').read()
    code = 'https://github.com/yiphei/yif-AI/tree/main/autoregressive_encoder_decoder_transformer'
    for text in (readme, model_md):
        assert 'Yifei Yan, *Auto-regressive Encoder-Decoder Transformer* (2024' in text
        assert code in text
    results = open(os.path.join(ROOT, 'experiments', 'results.md'), encoding='utf-8').read()
    val = re.search(r'^\| aed_mse_possub \| [\d.]+ \| ([\d.]+) \|', results, re.M)[1]
    assert f'to val {val} and' in readme and '6.555' not in readme  # an earlier train.py's
    # the quick start's commands paste into bash: no placeholder, no quote left open
    for line in re.search(r'## Quick start.*?```sh\n(.*?)```', readme, re.S)[1].splitlines():
        assert '<' not in line and shlex.split(line, comments=True), line
    assert "CPU build with the command PyTorch's \"Get started\" page gives" in readme
    assert set(re.findall(r'https?://([^/\s]+)', readme)) == {'github.com'}  # no index's host
    assert 'pip install -r requirements.txt\n' in readme


def test_hand_written_lines_fit_in_100_columns():
    """Every line of the code, scripts and docs within 100 characters. Not counted: the rows of the
    tables that report.py writes (experiments/*.md), the runs' own files, and one verbatim console
    line that docs/training.md quotes."""
    verbatim = {('docs/training.md', '  step 1/3 | loss 18.7090 (ce 10.8422 + 8 x emb 9.833e-01)')}
    names = []
    for d, dirs, files in os.walk(ROOT):
        top = os.path.relpath(d, ROOT).split(os.sep)  # ['.'] for ROOT itself
        # not data/, out*/, local hidden folders, nor the runs' own folders in experiments/
        skip = top[0] in ('data', '__pycache__') or top[0].startswith('out') \
            or top[0].startswith('.') and top[0] not in ('.', '.ci') \
            or top[0] == 'experiments' and len(top) > 1
        if skip:
            continue
        names += [os.path.relpath(os.path.join(d, f), ROOT) for f in files
                  if f.endswith(('.py', '.md', '.sh', '.ini', '.txt')) or top[0] == '.ci']
    long = []
    for name in names:
        parts = name.split(os.sep)
        generated = parts[0] == 'experiments' and name.endswith('.md') and parts[1] != 'README.md'
        for i, line in enumerate(open(os.path.join(ROOT, name), encoding='utf-8'), 1):
            line = line.rstrip('\n')
            if len(line) > 100 and not (generated and line.startswith('|')) \
                    and not any(name == f and line.startswith(v) for f, v in verbatim):
                long.append(f"{name}:{i} ({len(line)})")
    assert len(names) > 30 and not long, long


def test_collect_defaults():
    ns = {'lr': 1e-3, 'name': 'x', 'flag': False, 'opt': None, '_private': 1, 'os': os, 'fn': len,
          'lst': [1]}
    assert collect_defaults(ns) == {'lr': 1e-3, 'name': 'x', 'flag': False, 'opt': None}


def test_every_config_file_loads():
    # each shipped config names only known keys with the right types, and builds a valid ModelConfig
    from checkpoint import model_config_of
    defaults = train_defaults()
    for name in sorted(os.listdir(os.path.join(ROOT, 'config'))):
        if name.endswith('.py'):
            model_config_of(load_config(defaults, [os.path.join(ROOT, 'config', name)]))


def test_cpu_runs_are_the_authors_runs_at_cpu_size():
    """Each config/cpu_X.py is the author's run X with the CPU size and config/cpu_common.py's
    training settings: no model option of X is lost or changed on the way (include order, a stray
    line)."""
    from configurator import read_config_file
    defaults = train_defaults()
    common = read_config_file(os.path.join(ROOT, 'config', 'cpu_common.py'), defaults)
    size = {'out_dir', 'n_embed', 'n_layer', 'n_head', 'cross_attn_n_head', 'context_size'}
    cpu_names = [n[4:-3] for n in os.listdir(os.path.join(ROOT, 'config'))
                 if n.startswith('cpu_') and n != 'cpu_common.py']
    names = [n for n in cpu_names if os.path.isfile(os.path.join(ROOT, 'config', f'{n}.py'))]
    assert len(names) == 8
    # the studies' own shapes of a CPU run: only the size differs from the run they reshape
    variants = {'baseline_matched': 'baseline', 'aed_deep': 'aed_mse_possub',
                'baseline_deep': 'baseline'}
    assert set(cpu_names) == set(names) | set(variants)
    for name, base in variants.items():
        a, b = (load_config(defaults, [os.path.join(ROOT, 'config', f'cpu_{n}.py')])
                for n in (name, base))
        assert {k for k in defaults if a[k] != b[k]} <= size, name
        assert a['arch'] != 'aed' or a['cross_attn_n_head'] == 2 * a['n_head'], name
    for name in names:
        cpu, gpu = (load_config(defaults, [os.path.join(ROOT, 'config', f)])
                    for f in (f'cpu_{name}.py', f'{name}.py'))
        assert {k for k in defaults if cpu[k] != gpu[k]} - size <= set(common), name
        assert all(cpu[k] == v for k, v in common.items()), name
        # the AED's heads as the author set them: cross-attention 2 x n_head
        if gpu['arch'] == 'aed':
            assert cpu['cross_attn_n_head'] == 2 * cpu['n_head'], name
    cpu = load_config(defaults, [os.path.join(ROOT, 'config', 'cpu_aed_mse_possub.py')])
    assert ((cpu['train_steps'], cpu['batch_size'], cpu['context_size'], cpu['lr'])
            == (600, 8, 128, 2e-3))  # docs


def test_byte_pair_is_the_key_pair_at_byte_size():
    """config/bytes_*.py: the author's key AED and GPT at a byte-level size with bytes_common.py's
    settings, the GPT's non-embedding parameters (all but wte) within 1% of the AED's."""
    from checkpoint import model_config_of
    from configurator import read_config_file
    from model import Transformer
    defaults, path = train_defaults(), lambda n: os.path.join(ROOT, 'config', n)
    common = read_config_file(path('bytes_common.py'), defaults)
    size = {'out_dir', 'n_embed', 'n_layer', 'n_head', 'cross_attn_n_head'}
    non_emb = []
    for name in ('aed_mse_possub', 'baseline'):
        small, author = (load_config(defaults, [path(f)])
                         for f in (f'bytes_{name}.py', f'{name}.py'))
        assert {k for k in defaults if small[k] != author[k]} <= size | set(common), name
        assert all(small[k] == v for k, v in common.items()), name
        m = Transformer(model_config_of(small))
        non_emb.append(m.get_num_params() - m.wte.weight.numel())
    aed, gpt = load_config(defaults, [path('bytes_aed_mse_possub.py')]), non_emb
    assert aed['cross_attn_n_head'] == 2 * aed['n_head'] and common['vocab_size'] == 256
    assert abs(gpt[1] / gpt[0] - 1) < 0.01, gpt

def test_config_files_state_only_what_they_change():
    """No config file sets a key to train.py's default (arch aside, which says which model it is),
    and no CPU run repeats a key of config/cpu_common.py, which they all include."""
    from configurator import read_config_file
    defaults = train_defaults()
    config_dir = os.path.join(ROOT, 'config')
    for name in sorted(os.listdir(config_dir)):
        values = read_config_file(os.path.join(config_dir, name), defaults)
        restated = {k for k, v in values.items()
                    if (v, type(v)) == (defaults[k], type(defaults[k]))} - {'arch'}
        assert not restated, (name, restated)
    common = read_config_file(os.path.join(config_dir, 'cpu_common.py'), defaults)
    for name in sorted(os.listdir(config_dir)):
        if name.startswith('cpu_') and name != 'cpu_common.py':
            own = {'include': lambda other: None}  # the keys of the file's own lines
            exec(open(os.path.join(config_dir, name)).read(), own)
            assert not set(own) & set(common), (name, set(own) & set(common))


def test_author_configs_param_counts():
    from model import Transformer
    from checkpoint import model_config_of
    defaults = train_defaults()
    expect = {'aed_mse_possub': 15_763_500, 'baseline': 16_036_800, 'baseline_small': 15_441_192,
              'baseline_dropout': 16_036_800}
    for name, n in expect.items():
        c = load_config(defaults, [os.path.join(ROOT, 'config', name + '.py')])
        m = Transformer(model_config_of(c))
        assert m.get_num_params() == n, name


# ----------------------------------------------------------------------------- helpers
def run(script, *args, timeout=120):
    return subprocess.run([PY, script, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=ENV)


def read_log(out_dir):
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
        return [json.loads(line) for line in f]


def read_log_text(raw):
    return [json.loads(line) for line in raw.decode().splitlines()]


def load_ckpt(out_dir, name='last'):
    return torch.load(os.path.join(out_dir, f'ckpt_{name}.pt'), map_location='cpu',
                      weights_only=True)


def save_with_checksum(ckpt, path):
    import checkpoint
    torch.save(dict(ckpt, checksum=checkpoint.checksum(ckpt)), path)


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
def test_script_errors_are_one_line(tmp_path, monkeypatch):
    # what the parser catches is tested above; here: the scripts turn every bad input into one line
    # (a real process for the first; the others in this process: a traceback would raise here)
    p = run('train.py', '--lrr=1')
    assert_one_line_error(p, "unknown config key 'lrr'", "did you mean 'lr'")
    p = run_here('train.py', '--arch=bert')
    assert_one_line_error(p, 'model config', 'arch')
    p = run_here('train.py', *TINY, f'--data_dir={tmp_path}', f'--out_dir={tmp_path}/out')
    assert_one_line_error(p, os.path.join(str(tmp_path), 'wikipedia', 'train.bin'),
                          f'not found: run python prepare.py --data_dir={tmp_path} (docs/data.md)')
    assert not os.path.exists(tmp_path / 'out')  # a refused run leaves no out_dir with a lone .lock
    # an out_dir made before stays
    data = make_data(tmp_path / 'd')
    os.makedirs(tmp_path / 'empty')
    p = run_here('train.py', *TINY, f'--data_dir={data}', '--dataset=shakespeare_char',
                 f'--out_dir={tmp_path}/empty')
    assert_one_line_error(p, 'shakespeare_char/train.bin not found: run python prepare.py '
                          f'--input=<your text> --name=shakespeare_char --data_dir={data} ')
    assert os.listdir(tmp_path / 'empty') == []
    # each missing dataset is told the command that makes it
    with monkeypatch.context() as m:
        m.chdir(tmp_path)  # no data/ here
        for dataset, flags in [('wikipedia', ''), ('wikipedia_bytes', ' --tokenizer=bytes')]:
            assert_one_line_error(run_here('train.py', *TINY, f'--dataset={dataset}'),
                                  f'error: data/{dataset}/train.bin not found: run python '
                                  f'prepare.py{flags} (docs/data.md)')
    bins = os.path.join(data, 'tiny', 'train.bin')
    assert_one_line_error(run_here('train.py', *TINY, f'--data_dir={bins}'),  # a file: not found
                          f'train.bin/wikipedia/train.bin not found: run python prepare.py')
    # a mistyped config file: the nearest one in config/; --config=FILE: no such key
    for arg in 'config/cpu_aed_mse_posub.py', 'cpu_aed_mse_possub.py', 'config/cpu_aed_mse_possub':
        assert_one_line_error(run_here('train.py', arg), f'config file not found: {arg} '
                              f'(did you mean config/cpu_aed_mse_possub.py?)')
    p = run_here('train.py', '--config=config/cpu_baseline.py')
    assert_one_line_error(p, "unknown config key 'config' on the command line")
    assert_one_line_error(run_here('train.py', 'config'), 'config file not found: config')
    p = run_here('train.py', *TINY, f'--out_dir={tmp_path}/none', '--init_from=resume')
    assert_one_line_error(p, 'no checkpoint at')
    p = run_here('sample.py', f'--out_dir={tmp_path}/none', '--num_samples=2')
    assert_one_line_error(p, 'no checkpoint at')
    os.makedirs(tmp_path / 'junk')
    (tmp_path / 'junk' / 'ckpt_best.pt').write_bytes(b'not a checkpoint')
    p = run('sample.py', f'--out_dir={tmp_path}/junk')
    assert_one_line_error(p, 'cannot read', 'not a checkpoint written by train.py')


def test_refusals_come_before_import_torch(tmp_path):
    """A mistyped key, value or path of sample.py is told at once, not after the seconds of
    `import torch`: with a torch that cannot be imported, the refusals are the same."""
    (tmp_path / 'torch').mkdir()
    (tmp_path / 'torch' / '__init__.py').write_text('raise ImportError("torch was imported")\n')
    env = dict(ENV, PYTHONPATH=str(tmp_path))  # before site-packages: this torch is found first
    (tmp_path / 'run').mkdir()
    (tmp_path / 'run' / 'ckpt_best.pt').write_bytes(b'')  # read only after the device's check
    for script, args, words in [
            ('sample.py', ['--tempreature=1'], "did you mean 'temperature'"),
            ('sample.py', ['--checkpoint=mid'], "checkpoint must be 'best' or 'last'"),
            ('sample.py', [f'--out_dir={tmp_path}/none'], 'no checkpoint at'),
            ('sample.py', [f'--out_dir={tmp_path}/run', '--device=tpu'], 'device must be auto')]:
        p = subprocess.run([PY, script, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=60)
        assert_one_line_error(p, words)


# ----------------------------------------------------------------------------- training runs
def test_a_run_logs_every_step_and_learns(tiny_runs):
    """The shared tiny run (conftest.tiny_runs), uninterrupted: its step lines, log, summary and
    best checkpoint."""
    full, stdout = tiny_runs['full'], tiny_runs['full_stdout']
    # the step line's loss is what the optimizer sees, ce + coefficient x emb; the estimates are ce
    # alone
    assert re.search(r'^step 10/40 \| loss [\d.]+ \(ce [\d.]+ \+ 1 x emb [\d.e+-]+\) '
                     r'\| lr .* tok/s$', stdout, re.M)
    assert re.search(r'^step 10: estimate train ce [\d.]+, val ce [\d.]+', stdout, re.M), stdout
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


def test_a_run_killed_and_resumed_ends_with_the_weights_of_one_never_killed(tiny_runs):
    """The shared tiny run killed with kill -9 mid-way (after step 17), then resumed: the same
    weights as the uninterrupted run."""
    killed, step = tiny_runs['resumed'], tiny_runs['killed_step']
    assert 15 <= step < TINY_RUN_STEPS and step % 5 == 0
    assert (f"resuming from {os.path.join(killed, 'ckpt_last.pt')} at step {step}"
            in tiny_runs['resumed_stdout'])
    final = load_ckpt(killed)
    assert final['step'] == 40
    same_weights(load_ckpt(tiny_runs['full'])['model'], final['model'], atol=1e-5)
    assert json.load(open(os.path.join(killed, 'summary.json')))['status'] == 'finished'


def test_a_resume_needs_only_out_dir_and_keeps_the_model(tmp_path, tiny_runs):
    """A resume takes the rest of the config from the checkpoint; a change of the model is refused,
    the same model spelt out is none."""
    out = str(tmp_path / 'run')
    shutil.copytree(tiny_runs['resumed'], out)
    p = run_here('train.py', f'--out_dir={out}', '--init_from=resume', '--train_steps=42',
                 '--device=cpu')
    assert p.returncode == 0, p.stderr
    assert load_ckpt(out)['step'] == 42
    p = run_here('train.py', f'--out_dir={out}', '--init_from=resume', '--n_embed=32')
    assert_one_line_error(p, 'cannot change n_embed when resuming')
    p = run_here('train.py', f'--out_dir={out}', '--init_from=resume', '--n_layer=0')
    assert_one_line_error(p, 'model config: n_layer must be >= 1, got 0')
    # the same model spelt out is no change: n_decoder_layer None means n_layer (1 here); 2 is
    # another model
    p = run_here('train.py', f'--out_dir={out}', '--init_from=resume', '--n_decoder_layer=2')
    assert_one_line_error(p, 'cannot change n_decoder_layer when resuming: the checkpoint has None')
    p = run_here('train.py', f'--out_dir={out}', '--init_from=resume', '--train_steps=43',
                 '--n_decoder_layer=1')
    assert p.returncode == 0, p.stderr
    assert load_ckpt(out)['step'] == 43


def test_samples_of_a_resumed_run_whatever_the_cache_and_greedy_at_temperature_0(tmp_path,
                                                                                  tiny_runs):
    """Sampling the resumed tiny run without the KV cache, with it, and with it and the compiled
    one-token step gives the same samples; temperature 0 is the argmax continuation."""
    killed = tiny_runs['resumed']
    prompt = tmp_path / 'prompt.txt'
    prompt.write_text('The first of the')  # GPT-2 ids 464, 717, 286, 262: all < vocab_size 1024
    outs = []
    for flags in (['--kv_cache=False'], ['--kv_cache=True'], ['--kv_cache=True', '--compile=True']):
        p = run_here('sample.py', f'--out_dir={killed}', f'--start=FILE:{prompt}',
                     '--num_samples=2', '--max_new_tokens=20', '--device=cpu', '--top_k=0', *flags)
        assert p.returncode == 0, p.stderr
        assert p.stdout.count('---------------') == 2 and p.stdout.startswith('The first of the')
        assert (', compiled' in p.stderr) == ('--compile=True' in flags), p.stderr
        outs.append(p.stdout)
    # same seed, same samples: the cache and compiling change speed only
    assert outs[0] == outs[1] == outs[2]
    # temperature 0 is greedy: every sample, whatever the seed, is the argmax continuation
    greedy = [run_here('sample.py', f'--out_dir={killed}', f'--start=FILE:{prompt}',
                       '--num_samples=2', '--max_new_tokens=20', '--device=cpu',
                       '--temperature=0', f'--seed={s}')
              for s in (1, 2)]
    assert all(p.returncode == 0 for p in greedy), greedy[0].stderr
    assert greedy[0].stdout == greedy[1].stdout
    first, second = greedy[0].stdout.split('---------------\n')[:2]
    assert first == second and first.startswith('The first of the')


def test_run_header_and_expected_time(tmp_path):
    """No silent start: the run's header comes before compiling, which says it takes about a minute;
    after ten steps, the expected time per step, for the steps left and for the whole run."""
    data = make_data(tmp_path)
    # torch.compile returns at once: the order of the lines is tested
    env = dict(ENV, TORCHDYNAMO_DISABLE='1')
    p = subprocess.run([PY, 'train.py', *TINY, '--compile', f'--data_dir={data}', '--dataset=tiny',
                        '--train_steps=14', '--est_interval=7', '--log_interval=100',
                        f'--out_dir={tmp_path}/out'],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    where = {key: next(i for i, line in enumerate(lines) if line.startswith(key))
             for key in ('aed model, ', 'compiling the model', 'step 0: estimate')}
    assert where['aed model, '] < where['compiling the model'] < where['step 0: estimate']
    assert 'about a minute' in lines[where['compiling the model']]
    # the data it reads
    assert f"train tokens (all) of {os.path.join(data, 'tiny')} |" in lines[where['aed model, ']]
    assert lines[-1].endswith(f"; sample: python sample.py --out_dir={tmp_path}/out")  # what next
    expected = [line for line in lines if line.startswith('expected: ')]
    assert len(expected) == 1, p.stdout
    assert re.fullmatch(r'expected: \d+ ms/step \(median of steps 2-10\), ~[\d.]+ (s|min|h) '
                        r'for the 4 steps and 1 estimate\(s\) left: the whole run ~[\d.]+ '
                        r'(s|min|h)', expected[0]), expected
    # the scoring of all of val.bin at the end says what it does, first
    scoring = next(i for i, line in enumerate(lines) if line.startswith('scoring '))
    assert re.fullmatch(r'scoring the (last and the best model|model) on all of val.bin '
                        r'\(1,488 tokens\)', lines[scoring]), lines[scoring]
    assert lines[scoring + 1].startswith('all of val.bin (1,488 tokens): ce '), lines


def test_new_model_keys_train_resume_sample(tmp_path):
    """The keys beyond the author (docs/model.md, Beyond the author) work from the command line,
    through resume (where they cannot change) and sample.py."""
    data = make_data(tmp_path)
    out = str(tmp_path / 'out')
    common = TINY + [f'--data_dir={data}', '--dataset=tiny', '--est_interval=2', '--n_layer=2',
                     '--n_decoder_layer=1', '--embedding_ln_affine=False']
    p = run_here('train.py', *common, '--train_steps=2', f'--out_dir={out}')
    assert p.returncode == 0, p.stderr
    ckpt = load_ckpt(out)
    assert (ckpt['config']['n_decoder_layer'] == 1
            and ckpt['config']['embedding_ln_affine'] is False)
    assert ('decoder_blocks.0.ln_1.weight' in ckpt['model']
            and 'decoder_blocks.1.ln_1.weight' not in ckpt['model'])
    assert 'ln_a.weight' not in ckpt['model']
    p = run_here('train.py', f'--out_dir={out}', '--init_from=resume', '--train_steps=3')
    assert p.returncode == 0, p.stderr
    assert load_ckpt(out)['step'] == 3
    p = run_here('sample.py', f'--out_dir={out}', '--checkpoint=last', '--num_samples=1',
                 '--max_new_tokens=20', '--device=cpu')
    assert p.returncode == 0, p.stderr
    assert p.stdout.count('---------------') == 1



def test_nan_loss_stops_without_saving(tmp_path, monkeypatch):
    """A NaN loss stops the run with a clear message; the last good checkpoint stays as it was."""
    import model
    data = make_data(tmp_path)
    out = str(tmp_path / 'out')
    # make the model's loss NaN from the 13th optimizer step on (2 micro-steps per step)
    build = model.Transformer

    def build_nan(cfg):
        m = build(cfg)
        forward, calls = m.forward, [0]

        def nan_forward(*args, **kwargs):
            logits, loss, parts = forward(*args, **kwargs)
            if m.training:
                calls[0] += 1
                if calls[0] > 24:
                    loss = loss * float('nan')
            return logits, loss, parts
        m.forward = nan_forward
        return m
    monkeypatch.setattr(model, 'Transformer', build_nan)
    args = TINY + [f'--data_dir={data}', '--dataset=tiny', '--train_steps=40', '--est_interval=5',
                   f'--out_dir={out}', '--micro_batch=4']  # 2 forwards a step
    p = run_here('train.py', *args)
    assert_one_line_error(p, 'the training loss is not finite at step 12', 'stopped without saving')
    ckpt = load_ckpt(out)
    assert ckpt['step'] == 10
    assert all(torch.isfinite(v).all() for v in ckpt['model'].values())
    log = read_log(out)
    assert log[-1]['type'] == 'stop' and max(r['step'] for r in log if r['type'] == 'step') == 12
    assert json.load(open(os.path.join(out, 'summary.json')))['status'].startswith('stopped')


# ----------------------------------------------------------------------------- the lr schedule
def author_lr(s, lr, min_lr, warmup_iters, lr_decay_iters):
    # the author's get_lr (docs/model.md, The author's lr schedule), written out: s is the 0-based
    # step
    if s + 1 < warmup_iters:
        return lr * (s + 1) / warmup_iters
    if s + 1 > lr_decay_iters:
        return min_lr
    ratio = (s + 1 - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1 + math.cos(math.pi * ratio)) * (lr - min_lr)


def test_lr_schedule_is_the_authors(tmp_path):
    """400 steps: 300 of warm-up (the author's), then the cosine, and min_lr past lr_decay_iters."""
    data = make_data(tmp_path)
    out = str(tmp_path / 'out')
    p = run_here('train.py', '--arch=gpt', '--vocab_size=1024', '--n_layer=1', '--n_embed=8',
                 '--n_head=1', '--context_size=8', '--batch_size=1',
                 '--gradient_accumulation_steps=1', '--compile=False', '--device=cpu',
                 '--dtype=float32', f'--data_dir={data}', '--dataset=tiny', f'--out_dir={out}',
                 '--train_steps=400', '--lr=9e-4', '--min_lr=9e-5', '--warmup_iters=300',
                 '--lr_decay_iters=380', '--est_interval=1000', '--est_steps=1',
                 '--log_interval=1000')
    assert p.returncode == 0, p.stderr
    lrs = [r['lr'] for r in read_log(out) if r['type'] == 'step']
    assert len(lrs) == 400
    for s, got in enumerate(lrs):
        assert got == pytest.approx(author_lr(s, 9e-4, 9e-5, 300, 380), rel=1e-12, abs=0), s
    # not nanoGPT's 9e-4 / 301 at step 0
    assert lrs[0] == 9e-4 / 300 and lrs[299] == 9e-4 and lrs[-1] == 9e-5


# ----------------------------------------------------------------------------- train_tokens
def test_train_tokens_never_reads_past_the_limit_and_survives_resume(tmp_path):
    """Past the first 3000 train tokens sits an id >= vocab_size: reading a single one of them
    crashes the embedding or the cross-entropy, so a run that finishes never read past
    train_tokens."""
    data = make_data(tmp_path)
    path = os.path.join(data, 'tiny', 'train.bin')
    poisoned = np.fromfile(path, dtype=np.uint16)
    poisoned[3000:] = 1024 + 7  # TINY's vocab_size is 1024
    poisoned.tofile(path)
    out = str(tmp_path / 'out')
    common = TINY + [f'--data_dir={data}', '--dataset=tiny', f'--out_dir={out}', '--est_interval=5',
                     '--log_interval=5']
    p = run_here('train.py', *common, '--train_tokens=3000', '--train_steps=10')
    assert p.returncode == 0, p.stderr
    tokens_per_step = 4 * 2 * 16
    assert f'epoch {5 * tokens_per_step / 3000:.2f}' in p.stdout  # epochs in the step lines
    summary = json.load(open(os.path.join(out, 'summary.json')))
    assert summary['train_tokens'] == 3000 and summary['config']['train_tokens'] == 3000
    assert summary['epochs'] == round(10 * tokens_per_step / 3000, 4)
    log = read_log(out)
    assert log[0]['train_tokens'] == 3000
    assert [r['epochs'] for r in log if r['type'] == 'est'] == [s * tokens_per_step / 3000
                                                                for s in (0, 5, 10)]
    # a resume takes train_tokens from the checkpoint, without it on the command line
    p = run_here('train.py', f'--out_dir={out}', '--init_from=resume', '--train_steps=12',
                 '--device=cpu')
    assert p.returncode == 0, p.stderr
    summary = json.load(open(os.path.join(out, 'summary.json')))
    assert summary['step'] == 12 and summary['train_tokens'] == 3000
    # a resume with another batch size counts the tokens each step really saw
    p = run_here('train.py', f'--out_dir={out}', '--init_from=resume', '--train_steps=14',
                 '--batch_size=1')
    assert p.returncode == 0, p.stderr
    tokens = 12 * tokens_per_step + 2 * (1 * 2 * 16)
    assert json.load(open(os.path.join(out, 'summary.json')))['tokens_seen'] == tokens
    last_step = [r for r in read_log(out) if r['type'] == 'step'][-1]  # (whole_val comes last)
    assert last_step['tokens'] == tokens and f'done: 14 steps, {tokens:,} tokens' in p.stdout
    # the same run on the whole file is refused: the start-up id check sees the poisoned tail
    # (so it is there)
    p = run_here('train.py', *common[:-3], f'--out_dir={tmp_path / "all"}', '--train_steps=10',
                 '--est_interval=100')
    assert_one_line_error(p, 'holds token id 1031, but vocab_size is 1024')
    # a limit the file cannot meet, or too small for one sequence: one line each
    p = run_here('train.py', *common, '--train_tokens=6001', '--train_steps=1',
                 f'--out_dir={tmp_path / "e1"}')
    assert_one_line_error(p, 'train_tokens (6,001) is more than', 'train.bin holds (6,000)')
    p = run_here('train.py', *common, '--train_tokens=17', '--train_steps=1',
                 f'--out_dir={tmp_path / "e2"}')
    assert_one_line_error(p, 'train_tokens (17) is too small for one batch')


# ----------------------------------------------------------------------- bad input, damage, signals
def test_bad_values_and_data_are_one_line(tmp_path, tiny_runs):
    nodata = [*TINY, f'--data_dir={tmp_path}', '--dataset=none', f'--out_dir={tmp_path}/out']
    for arg, words in [('--lr=-1', 'lr must be > 0, got -1.0'), ('--lr=0', 'lr must be > 0'),
                       ('--min_lr=-1', 'min_lr must be >= 0'), ('--lr=1e999', 'lr must be finite'),
                       ('--grad_clip=1e999', 'grad_clip must be finite'),
                       ('--weight_decay=-1', 'weight_decay must be >= 0'),
                       ('--grad_clip=-1', 'grad_clip must be >= 0'),
                       ('--beta1=1.5', 'beta1 must be in [0, 1)'),
                       ('--beta2=1', 'beta2 must be in [0, 1)'),
                       ('--device=banana', "got 'banana'"),
                       ('--out_dir=', 'out_dir must not be empty'),
                       ('--ddp_timeout=0', 'ddp_timeout must be > 0')]:
        assert_one_line_error(run_here('train.py', *nodata, arg), words)
    os.makedirs(tmp_path / 'run')
    (tmp_path / 'run' / 'ckpt_best.pt').write_bytes(b'')  # read after the device is checked
    assert_one_line_error(run_here('sample.py', f'--out_dir={tmp_path}/run', '--device=banana'),
                          "got 'banana'")

    def bad_data(name, train):
        d = make_data(tmp_path / name)
        (tmp_path / name / 'tiny' / 'train.bin').write_bytes(train)
        return run_here('train.py', *TINY, f'--data_dir={d}', '--dataset=tiny',
                        f'--out_dir={tmp_path}/{name}/out')
    train_bin = os.path.join(str(tmp_path), 'empty', 'tiny', 'train.bin')
    assert_one_line_error(bad_data('empty', train=b''), train_bin, 'not uint16 token ids: 0 bytes')
    assert_one_line_error(bad_data('odd', train=b'\x01' * 1001), 'not uint16 token ids: 1001 bytes')
    ids = np.full(500, 7, dtype=np.uint16)
    ids[321] = 2000  # >= TINY's vocab_size 1024
    assert_one_line_error(bad_data('big_id', train=ids.tobytes()),
                          'holds token id 2000, but vocab_size is 1024')
    # ids that fit, of another vocabulary (bytes): meta.json says so, and the run is refused
    d = make_data(tmp_path / 'bytes')
    (tmp_path / 'bytes' / 'tiny' / 'meta.json').write_text('{"vocab_size": 256, "tokenizer": '
                                                           '"bytes"}')
    assert_one_line_error(run_here('train.py', *TINY, f'--data_dir={d}', '--dataset=tiny',
                                   f'--out_dir={tmp_path}/bytes/out'),
                          'holds ids of a vocabulary of 256, but vocab_size is 1024',
                          '--vocab_size=256')
    out = str(tmp_path / 'resumed')  # a resume cannot change vocab_size: no advice to set it
    shutil.copytree(tiny_runs['full'], out)
    p = run_here('train.py', f'--out_dir={out}', '--init_from=resume', f'--data_dir={d}',
                 '--dataset=tiny', '--train_steps=6')
    assert_one_line_error(p, 'holds ids of a vocabulary of 256, but vocab_size is 1024: the run in '
                          f'{out} cannot continue on this data')
    (tmp_path / 'bytes' / 'tiny' / 'meta.json').write_text('[256]')  # JSON, but not prepare.py's
    assert_one_line_error(run_here('train.py', *TINY, f'--data_dir={d}', '--dataset=tiny',
                                   f'--out_dir={tmp_path}/bytes/out2'),
                          "meta.json is not prepare.py's record")


def test_nan_weights_are_never_saved(tmp_path):
    """A step with a finite loss but non-finite weights (lr=1e4: the update overflows) stops the run
    before the next save, so ckpt_last.pt stays the last finite one; a diverged checkpoint is
    refused."""
    data = make_data(tmp_path)
    out = str(tmp_path / 'out')
    p = run_here('train.py', *TINY, f'--data_dir={data}', '--dataset=tiny', f'--out_dir={out}',
                 '--lr=1e4', '--warmup_iters=0', '--train_steps=60', '--est_interval=20',
                 '--save_interval=1')
    assert_one_line_error(p, 'is not finite (', ') at step 2; stopped without saving',
                          f"the last checkpoint, {os.path.join(out, 'ckpt_last.pt')}, "
                          "is from step 1")
    steps = [r for r in read_log(out) if r['type'] == 'step']
    # the loss alone saw nothing wrong
    assert steps[-1]['step'] == 2 and np.isfinite(steps[-1]['loss'])
    ckpt = load_ckpt(out)
    assert ckpt['step'] == 1 and all(torch.isfinite(v).all() for v in ckpt['model'].values())
    # a diverged checkpoint (as the old guard wrote them) is refused, not sampled from
    ckpt['model']['wte.weight'][3, 5] = float('nan')
    del ckpt['checksum']
    save_with_checksum(ckpt, os.path.join(out, 'ckpt_last.pt'))
    assert_one_line_error(run_here('sample.py', f'--out_dir={out}', '--checkpoint=last',
                                   '--device=cpu'),
                          '1 of', 'weight tensors hold NaN or inf (e.g. wte.weight)')


def test_damaged_and_hostile_checkpoints_are_refused(tmp_path, tiny_runs, monkeypatch):
    import model
    tiny_ckpt = tiny_runs['full']  # (read only: copied before anything changes)
    out = str(tmp_path / 'out')
    path = os.path.join(out, 'ckpt_best.pt')

    def sample(*args):
        return run_here('sample.py', f'--out_dir={out}', '--device=cpu', '--max_new_tokens=2',
                        *args)

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
        assert cfg.n_layer <= 2 and cfg.n_embed <= 32, (
            f'built the claimed model ({cfg.n_layer} x {cfg.n_embed})')
        return build(cfg)
    build = model.Transformer
    monkeypatch.setattr(model, 'Transformer', build_guarded)
    ckpt = load_ckpt(tiny_ckpt, 'best')
    del ckpt['checksum']
    for change, words in [({'n_layer': 400, 'n_embed': 1024, 'n_head': 8},
                           'blocks, more than the file'),
                          ({'n_embed': 32}, 'wte.weight is (1024, 16) in the file')]:
        # a checksum is no signature
        save_with_checksum(dict(ckpt, config=dict(ckpt['config'], **change)), path)
        assert_one_line_error(sample(), path, words)
    monkeypatch.setattr(model, 'Transformer', build)
    save_with_checksum(dict(ckpt, model=dict(ckpt['model'], extra=torch.zeros(1))), path)
    assert_one_line_error(sample(), path, 'written by a model without a change made to model.py',
                          'extra is (1,) in the file, this model needs none')

    # a resume from a checkpoint that lacks keys, a prompt file that is not text
    save_with_checksum({k: v for k, v in ckpt.items() if k not in ('optimizer', 'rng')},
                       os.path.join(out, 'ckpt_last.pt'))
    assert_one_line_error(run_here('train.py', f'--out_dir={out}', '--init_from=resume'),
                          'ckpt_last.pt lacks optimizer, rng')
    torch.save(ckpt, path)  # no checksum at all
    assert_one_line_error(sample(), path, 'lacks checksum')
    shutil.copy(os.path.join(tiny_ckpt, 'ckpt_best.pt'), path)
    (tmp_path / 'prompt.bin').write_bytes(b'\x89PNG\r\n\x1a\n\x00\x00')
    assert_one_line_error(sample(f'--start=FILE:{tmp_path}/prompt.bin'),
                          'prompt.bin is not UTF-8 text')


def test_full_disk_during_save(tmp_path, monkeypatch):
    """A full disk during a save: one line that names the file system, the file and the checkpoint
    still there, and no .tmp left to keep the disk full. torch.save reports a failed write as its
    own RuntimeError ('[enforce fail at inline_container.cc] unexpected pos ...'), so the disk fills
    inside torch.save here."""
    import checkpoint
    path = str(tmp_path / 'ckpt.pt')
    os.symlink('/dev/full', path + '.tmp')  # the kernel's own "disk full"
    with pytest.raises(checkpoint.CheckpointError,
                       match=rf'^no space left on /\S* while saving {re.escape(path)}$'):
        checkpoint.save({'x': torch.zeros(100000)}, path)
    assert os.listdir(tmp_path) == []

    class FillsUp(io.FileIO):  # ckpt_last.pt's save after step 4 meets a full disk 1000 bytes in
        def write(self, b):
            if self.name.endswith('ckpt_last.pt.tmp') and steps_done() >= 4 and self.tell() > 1000:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return super().write(b)
    steps_done = lambda: 4
    with FillsUp(str(tmp_path / 'ckpt_last.pt.tmp'), 'wb') as f, \
            pytest.raises(RuntimeError, match='unexpected pos'):
        # torch's own error: the OSError is only its context
        torch.save({'x': torch.zeros(100000)}, f)
    os.remove(tmp_path / 'ckpt_last.pt.tmp')
    data = make_data(tmp_path)
    out = str(tmp_path / 'out')
    steps_done = lambda: sum(r['type'] == 'step' for r in read_log(out))
    monkeypatch.setattr(checkpoint, 'open', FillsUp, raising=False)
    p = run_here('train.py', *TINY, f'--data_dir={data}', '--dataset=tiny', f'--out_dir={out}',
                 '--train_steps=8', '--est_interval=2')
    last = os.path.join(out, 'ckpt_last.pt')
    mount = re.escape(subprocess.run(['df', '--output=target', out], capture_output=True,
                                     text=True).stdout.split()[-1])
    assert_one_line_error(p)
    assert re.fullmatch(rf"error: no space left on {mount} while saving {re.escape(last)}; "
                        rf"stopped at step 4: the last checkpoint, {re.escape(last)}, "
                        rf"is from step 2: continue with python train.py --init_from=resume "
                        rf"--out_dir={re.escape(out)}\n", p.stderr), p.stderr
    assert sorted(os.listdir(out)) == ['.lock', 'ckpt_best.pt', 'ckpt_last.pt', 'log.jsonl',
                                       'summary.json']
    assert load_ckpt(out)['step'] == 2
    # on record as every stop: the few bytes of the log's record and summary.json still fit
    reason = p.stderr.split('; ')[0].removeprefix('error: ')
    resume = f'python train.py --init_from=resume --out_dir={out}'
    assert read_log(out)[-1] == {'type': 'stop', 'step': 4, 'reason': reason,
                                 'last_checkpoint_step': 2, 'resume': resume}
    summary = json.load(open(os.path.join(out, 'summary.json')))
    assert (summary['status'], summary['step'], summary['resume']) == ('stopped: ' + reason, 4,
                                                                        resume)


def test_full_disk_on_a_real_file_system(tmp_path):
    """The same on a small tmpfs, where the kernel itself runs out of space (needs root: skipped
    elsewhere)."""
    disk = tmp_path / 'small'
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=500k', 'tmpfs',
                                            str(disk)], capture_output=True).returncode:
        pytest.skip('cannot mount a tmpfs here')
    try:
        data = make_data(tmp_path)
        out = str(disk / 'out')  # a checkpoint is ~330 KB: the disk fills after a save or two
        p = run_here('train.py', *TINY, f'--data_dir={data}', '--dataset=tiny',
                     f'--out_dir={out}', '--train_steps=8', '--est_interval=2')
        assert_one_line_error(p,
                              f"no space left on {disk} while saving {out}/ckpt_last.pt; "
                              "stopped at step ")
        kept = int(re.search(r'is from step (\d+)', p.stderr)[1])
        assert load_ckpt(out)['step'] == kept and not [f for f in os.listdir(out)
                                                       if f.endswith('.tmp')]
        stop = read_log(out)[-1]  # the failed .tmp's space is free again: the stop fits
        assert stop['type'] == 'stop' and stop['last_checkpoint_step'] == kept
        summary = json.load(open(os.path.join(out, 'summary.json')))
        assert summary['status'] == f"stopped: {stop['reason']}" and 'no space' in stop['reason']
    finally:  # lazily: a failed run may still hold a file open there
        subprocess.run(['umount', '--lazy', str(disk)])


def tiny_run(tmp_path, *args):
    data = make_data(tmp_path)
    return run_here('train.py', *TINY, f'--data_dir={data}', '--dataset=tiny',
                    f'--out_dir={tmp_path}/out', '--est_interval=5', *args)


def test_scratch_run_never_replaces_a_run(tmp_path):
    out = str(tmp_path / 'out')
    assert tiny_run(tmp_path, '--train_steps=5').returncode == 0
    log = open(os.path.join(out, 'log.jsonl'), 'rb').read()
    # the same command again, as after a crash: refused, and the run is untouched
    p = tiny_run(tmp_path, '--train_steps=5')
    assert_one_line_error(p, f'{out} already holds a run', '--init_from=resume', '--overwrite=True')
    # another out_dir first: what a user who wants a second run needs, and it loses nothing
    err = p.stderr
    assert err.index('--out_dir=') < err.index('--init_from') < err.index('--overwrite')
    assert open(os.path.join(out, 'log.jsonl'), 'rb').read() == log
    # no checkpoint (killed before its first save, or deleted): nothing to resume, so a scratch
    # run starts it over
    os.remove(os.path.join(out, 'ckpt_last.pt'))
    assert_one_line_error(tiny_run(tmp_path, '--init_from=resume'), 'no checkpoint at',
                          'is out_dir right?')
    p = tiny_run(tmp_path, '--train_steps=1')
    assert p.returncode == 0, p.stderr
    assert read_log(out)[0]['type'] == 'start' and load_ckpt(out)['step'] == 1
    p = tiny_run(tmp_path, '--train_steps=2', '--overwrite=True')  # starting over on purpose
    assert p.returncode == 0, p.stderr
    assert read_log(out)[0]['type'] == 'start' and load_ckpt(out)['step'] == 2
    assert json.load(open(os.path.join(out, 'summary.json')))['step'] == 2


def test_resume_repairs_best_and_summary(tmp_path):
    """Killed right after the final save, before ckpt_best.pt was linked and summary.json renamed:
    the resumed run leaves the files the uninterrupted run would have."""
    out = str(tmp_path / 'out')
    assert tiny_run(tmp_path, '--train_steps=5').returncode == 0
    best5, summary5 = load_ckpt(out, 'best'), json.load(open(os.path.join(out, 'summary.json')))
    shutil.copy(os.path.join(out, 'ckpt_best.pt'), tmp_path / 'best5.pt')
    p = tiny_run(tmp_path, '--train_steps=10', '--init_from=resume')
    assert p.returncode == 0, p.stderr
    summary = json.load(open(os.path.join(out, 'summary.json')))
    # the final estimate is the best
    assert best5['step'] == 5 and load_ckpt(out, 'best')['step'] == 10
    # the state such a kill leaves: the new ckpt_last.pt, the old ckpt_best.pt, the old summary
    # a hard link to ckpt_last.pt: copying into it would change both
    os.remove(os.path.join(out, 'ckpt_best.pt'))
    shutil.copy(tmp_path / 'best5.pt', os.path.join(out, 'ckpt_best.pt'))
    json.dump(dict(summary5, status='running', train_steps=10),
              open(os.path.join(out, 'summary.json'), 'w'))
    p = tiny_run(tmp_path, '--init_from=resume')
    assert p.returncode == 0, p.stderr
    assert load_ckpt(out, 'best')['step'] == 10
    repaired = json.load(open(os.path.join(out, 'summary.json')))
    for k in ('status', 'step', 'best_val_loss', 'final_train_loss', 'final_val_loss',
              'tokens_seen'):
        assert repaired[k] == summary[k], k
    assert repaired['status'] == 'finished'
    # a finished run says so and how to go on, and keeps its summary (scores, wall time) as it was
    assert 'finished at step 10: --train_steps=N (N > 10) trains on' in p.stdout
    assert tiny_run(tmp_path, '--init_from=resume').returncode == 0
    assert json.load(open(os.path.join(out, 'summary.json'))) == repaired
    # what a resume changes is printed
    (tmp_path / 'b8.py').write_text('batch_size = 8\n')  # the run's batch is 4
    p = tiny_run(tmp_path, '--init_from=resume', str(tmp_path / 'b8.py'), '--train_steps=11')
    assert p.returncode == 0, p.stderr
    assert (f"resuming from {out}/ckpt_last.pt at step 10; batch_size: 4 -> 8; train_steps: 10 -> "
            f"11\n") in p.stdout, p.stdout


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
    """A second run or a resume while a run lives is refused at once; Ctrl-C and SIGTERM stop a run
    with one line that says the step and how to continue it."""
    data = make_data(tmp_path)
    out = str(tmp_path / 'out')
    args = TINY + [f'--data_dir={data}', '--dataset=tiny', f'--out_dir={out}',
                   '--train_steps=100000', '--est_interval=5', '--log_interval=1000']

    def start(*extra, steps):  # a run in the background, once it has taken `steps` steps
        first = len(read_log(out)) if os.path.exists(os.path.join(out, 'log.jsonl')) else 0
        proc = subprocess.Popen([PY, 'train.py', *args, *extra], cwd=ROOT, env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 90
        while time.time() < deadline and proc.poll() is None:
            if os.path.exists(os.path.join(out, 'log.jsonl')) and \
                    sum(r['type'] == 'step' for r in read_log(out)[first:]) >= steps:
                return proc
            time.sleep(0.05)
        raise AssertionError('the run ended before it could be stopped: ' + proc.stderr.read())

    proc = start(steps=6)
    # (in this process: the lock is the kernel's, per open file, so it holds against this
    # process too)
    try:
        assert_one_line_error(run_here('train.py', *args, '--train_steps=10'),
                              f'{out} is in use by another train.py (pid {proc.pid})')
        assert_one_line_error(run_here('train.py', f'--out_dir={out}', '--init_from=resume'),
                              'is in use')
    finally:
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
    saved = load_ckpt(out)['step']
    assert proc.returncode == 130 and len(err.strip().splitlines()) == 1, err
    assert re.fullmatch(rf"error: interrupted by SIGINT at step \d+; the last checkpoint, "
                        rf"{re.escape(out)}/ckpt_last.pt, is from step {saved}: "
                        rf"continue with python train.py --init_from=resume "
                        rf"--out_dir={re.escape(out)}\n", err)
    proc = start('--init_from=resume', steps=1)  # the lock went with the process
    # more than one SIGTERM (a kill reaches a script and its job): still one line
    while proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.002)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 143 and err.startswith('error: interrupted by SIGTERM at step '), err
    assert len(err.strip().splitlines()) == 1 and not [f for f in os.listdir(out)
                                                       if f.endswith('.tmp')]



def test_signals_stop_a_run_whose_output_pipe_is_closed(tmp_path):
    """`python train.py ... 2>&1 | tee log`, then Ctrl-C: tee stops too, so the signal's line cannot
    be written; the run still stops at once with 130 (SIGTERM: 143), its last checkpoint intact."""
    data = make_data(tmp_path)
    out = str(tmp_path / 'out')
    # no line after the start (saves print nothing), so only the stop writes to the closed pipe
    args = TINY + [f'--data_dir={data}', '--dataset=tiny', f'--out_dir={out}',
                   '--train_steps=100000', '--est_interval=100000', '--save_interval=3',
                   '--log_interval=100000']
    for sig, extra in ((signal.SIGINT, []), (signal.SIGTERM, ['--init_from=resume'])):
        first = len(read_log(out)) if extra else 0
        proc = subprocess.Popen([PY, 'train.py', *args, *extra], cwd=ROOT, env=ENV,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 90
            while time.time() < deadline and not (
                    os.path.exists(os.path.join(out, 'log.jsonl'))
                    and sum(r['type'] == 'step' for r in read_log(out)[first:]) >= 4):
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.05)
        except BaseException:
            proc.kill()
            raise
        assert signal_after_reader_gone(proc, sig, timeout=30) == 128 + sig
        assert load_ckpt(out)['step'] % 3 == 0 and not [f for f in os.listdir(out)
                                                         if f.endswith('.tmp')]
        assert_stop_recorded(out, f'interrupted by {signal.Signals(sig).name}')
    # the reader gone without a signal (tee closed first): the next line stops the run as a
    # signal does, recorded, exit 141 (SIGPIPE's)
    # (stderr apart, as `2>err.log | head`: the stop's one line goes there)
    proc = subprocess.Popen([PY, 'train.py', *args, '--init_from=resume', '--log_interval=1'],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    while not (line := proc.stdout.readline()).startswith(b'step '):  # training
        assert line, 'the run ended'
    proc.stdout.close()
    assert proc.wait(timeout=60) == 141
    err = proc.stderr.read().decode()
    assert err.startswith('error: interrupted by SIGPIPE at step ') and err.count('\n') == 1, err
    assert_stop_recorded(out, 'interrupted by SIGPIPE')


def assert_stop_recorded(out, reason):
    """summary.json and log.jsonl's last record say why the run stopped, where, and how to go on."""
    stop, summary = read_log(out)[-1], json.load(open(os.path.join(out, 'summary.json')))
    resume = f'python train.py --init_from=resume --out_dir={out}'
    assert (stop['type'], stop['reason'], stop['resume']) == ('stop', reason, resume), stop
    assert stop['last_checkpoint_step'] == load_ckpt(out)['step'] <= stop['step'], stop
    assert (summary['status'], summary['resume'], summary['step']) == (
        f'stopped: {reason}', resume, stop['step']), summary


def test_summary_is_written_under_the_lock_a_signal_waits_for(tmp_path, monkeypatch):
    """A kill's handler takes run.saving before it exits: summary.json must be written under it,
    else a SIGTERM in the middle leaves summary.json.tmp behind."""
    import rundir
    held = []
    real = rundir.atomic_write
    monkeypatch.setattr(rundir, 'atomic_write',
                        lambda path, write: (held.append(run.saving.locked()), real(path, write)))
    monkeypatch.setattr(rundir.RunDir, 'catch_signals', lambda self: None)  # this process's own
    run = rundir.RunDir(str(tmp_path / 'out'))
    run.start(10, 100, device='cpu', train_tokens=1000)
    run.summary(0)
    assert held and all(held), held
    assert json.load(open(tmp_path / 'out' / 'summary.json'))['step'] == 0

def threads(pid):
    return len(os.listdir(f'/proc/{pid}/task'))


def test_ctrl_c_at_any_moment(tmp_path):
    """Ctrl-C ends a run with one line and exit 130 at any moment: during `import torch` (seconds,
    before anything is set up), and in the middle of a torch op that takes minutes (a config too big
    for the machine, where a Python signal handler would wait for the op to return)."""
    proc = subprocess.Popen([PY, 'train.py', '--device=cpu'], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 1  # the signal thread starts before `import torch`
    while threads(proc.pid) < 2 and time.time() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert ((proc.returncode, out, err)
            == (130, '', 'error: interrupted by SIGINT while starting\n')), err

    # context 20000: one sequence's attention takes seconds, a batch's many, in one op
    data = make_data(tmp_path, n_train=25000, n_val=25000)
    proc = subprocess.Popen([PY, 'train.py', *TINY, f'--data_dir={data}', '--dataset=tiny',
                             f'--out_dir={tmp_path}/out', '--context_size=20000', '--batch_size=8',
                             '--est_steps=200'], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # a run that never says it: killed, and the test fails
    lines, watchdog = [], threading.Timer(90, proc.kill)
    watchdog.start()
    while not lines or not lines[-1].startswith('aed model, '):  # the header
        lines.append(proc.stdout.readline())
        assert lines[-1], 'the run ended: ' + proc.stderr.read()
    watchdog.cancel()
    time.sleep(3)  # inside the first estimate's first batch, an op of many seconds
    t0 = time.time()
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=60)[1]
    assert time.time() - t0 < 5 and proc.returncode == 130, (time.time() - t0, err)
    [error] = err.splitlines()
    assert error == 'error: interrupted by SIGINT at step 0; no checkpoint was saved yet ' \
                    '(the same command starts the run over)', err


def start_ddp_run(data, out, monitor_s=0.1, stdout=subprocess.DEVNULL):
    """A 2-process torchrun of TINY that trains until stopped; its stderr is piped. torchrun checks
    its workers every monitor_s seconds, then stops the others of one that died."""
    return subprocess.Popen([PY, '-m', 'torch.distributed.run', '--standalone',
                             f'--monitor-interval={monitor_s}',
                             '--nproc_per_node=2', 'train.py', *TINY, f'--data_dir={data}',
                             '--dataset=tiny', '--train_steps=100000', '--est_interval=5',
                             '--log_interval=1000', f'--out_dir={out}'],
                            cwd=ROOT, env=ENV, stdout=stdout, stderr=subprocess.PIPE, text=True)


def test_torchrun_two_processes_match_one_and_ctrl_c_stops_them(tmp_path):
    """2 gloo ranks x 1 micro-step == 1 process x 2 micro-steps: different batches per rank,
    gradients averaged once per step, only rank 0 logs. Ctrl-C reaches torchrun, which passes it on
    to its workers: rank 0 says where the run stopped and how to go on, in one line (torchrun then
    prints its own traceback). One torchrun for both."""
    data = make_data(tmp_path)
    out = str(tmp_path / 'ddp')
    torchrun = start_ddp_run(data, out, stdout=subprocess.PIPE)  # (a few lines: no reader needed)
    deadline = time.time() + 120
    while time.time() < deadline and not (os.path.exists(os.path.join(out, 'log.jsonl'))
                                          and sum(r['type'] == 'step' for r in read_log(out)) >= 6):
        assert torchrun.poll() is None, 'torchrun ended early: ' + torchrun.stderr.read()
        time.sleep(0.1)
    torchrun.send_signal(signal.SIGINT)
    stdout, err = torchrun.communicate(timeout=60)
    two = load_ckpt(out)  # saved at an estimate (every 5 steps), before the stop
    ours = [line for line in err.splitlines() if line.startswith('error: ')]
    assert len(ours) == 1 and re.fullmatch(
        rf"error: interrupted by SIGINT at step \d+; the last checkpoint, "
        rf"{re.escape(out)}/ckpt_last.pt, is from step {two['step']}: "
        rf"continue with torchrun --standalone --nproc_per_node=2 train.py --init_from=resume "
        rf"--out_dir={re.escape(out)}", ours[0]), err
    # only rank 0 logs: one header, one line per estimate
    assert '2 process(es)' in stdout and stdout.count('aed model, ') == 1, stdout
    assert stdout.count('step 5: estimate') == 1, stdout
    # the same steps in one process: the same weights
    common = TINY + [f'--data_dir={data}', '--dataset=tiny', f'--train_steps={two["step"]}',
                     '--est_interval=5']
    one = str(tmp_path / 'one')
    p = run_here('train.py', *common, f'--out_dir={one}')
    assert p.returncode == 0, p.stderr
    a = load_ckpt(one)
    assert two['step'] >= 5 and a['step'] == two['step']
    same_weights(a['model'], two['model'], atol=1e-4)
    # and the ranks did not draw the same batch: rank 0's batch alone gives other weights
    same = str(tmp_path / 'same')
    p = run_here('train.py', *common, '--gradient_accumulation_steps=1', f'--out_dir={same}')
    assert p.returncode == 0, p.stderr
    c = load_ckpt(same)
    assert max((two['model'][k] - c['model'][k]).abs().max() for k in c['model']) > 1e-3


def test_ctrl_c_under_torchrun_into_a_closed_pipe(tmp_path):
    """`torchrun ... 2>&1 | tee log`, then Ctrl-C: the workers cannot write their line, and still
    stop at once (not after torchrun's 30 s wait and its SIGKILL)."""
    data = make_data(tmp_path)
    out = str(tmp_path / 'ddp')
    # nothing printed after step 10 (saves print nothing): only the stop writes to the closed pipe
    torchrun = subprocess.Popen([PY, '-m', 'torch.distributed.run', '--standalone',
                                 '--nproc_per_node=2', 'train.py', *TINY, f'--data_dir={data}',
                                 '--dataset=tiny', '--train_steps=100000', '--est_interval=100000',
                                 '--save_interval=3', '--log_interval=100000', f'--out_dir={out}'],
                                cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (os.path.exists(os.path.join(out, 'log.jsonl'))
                                              and sum(r['type'] == 'step'
                                                      for r in read_log(out)) >= 12):
            assert torchrun.poll() is None, 'torchrun ended early: ' + torchrun.stdout.read()
            time.sleep(0.1)
        workers = children(torchrun.pid)
        torchrun.stdout.close()  # tee has gone
        t0 = time.time()
        torchrun.send_signal(signal.SIGINT)
        torchrun.wait(timeout=60)
        assert time.time() - t0 < 15 and not any(alive(pid) for pid in workers)
    finally:
        if torchrun.poll() is None:
            torchrun.kill()
    assert load_ckpt(out)['step'] % 3 == 0


def test_ddp_timeout(tmp_path, monkeypatch):
    """A rank that never shows up (or hangs) stops the others after ddp_timeout, not torch's 30
    minutes."""
    data = make_data(tmp_path)
    # rank 0 of 2 without its partner: the rendezvous waits for it as long as any collective would
    # (in this process: the start-up fails, so no process group is left behind)
    for k, v in dict(RANK='0', LOCAL_RANK='0', WORLD_SIZE='2', MASTER_ADDR='127.0.0.1',
                     MASTER_PORT=str(free_port())).items():
        monkeypatch.setenv(k, v)
    p = run_here('train.py', *TINY, f'--data_dir={data}', '--dataset=tiny',
                 f'--out_dir={tmp_path}/out', '--ddp_timeout=2')
    assert not torch.distributed.is_initialized()
    assert_one_line_error(p, 'DDP start-up failed on rank 0', 'Timed out after')
    # ddp_timeout=2 (+ rounding)
    assert int(re.search(r'Timed out after (\d+) seconds', p.stderr)[1]) < 10


def test_orphaned_ddp_workers_stop(tmp_path):
    """After a kill -9 of torchrun its workers stop too, instead of training on alone."""
    data = make_data(tmp_path)
    args = TINY + [f'--data_dir={data}', '--dataset=tiny', '--train_steps=100000',
                   '--est_interval=50', '--log_interval=1000']
    out = str(tmp_path / 'ddp')
    torchrun = subprocess.Popen([PY, '-m', 'torch.distributed.run', '--standalone',
                                 '--nproc_per_node=2', 'train.py', *args, f'--out_dir={out}'],
                                cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
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


def test_a_lost_ddp_rank_is_one_line(tmp_path):
    """After a kill -9 of one DDP rank the other says in one line which rank it lost and how to go
    on, instead of gloo's traceback (torchrun's own report follows it)."""
    data = make_data(tmp_path)
    out = str(tmp_path / 'ddp')
    # torchrun checks every 5 s: on a loaded machine its 0.1 s check could stop rank 0 before rank
    # 0's next collective finds rank 1 gone (it would then say "interrupted by SIGTERM", one line)
    torchrun = start_ddp_run(data, out, monitor_s=5)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (
                os.path.exists(os.path.join(out, 'log.jsonl'))
                and sum(r['type'] == 'step' for r in read_log(out)) >= 6):
            assert torchrun.poll() is None, 'torchrun ended early: ' + torchrun.stderr.read()
            time.sleep(0.1)
        rank1 = [pid for pid in children(torchrun.pid)
                 if 'RANK=1' in open(f'/proc/{pid}/environ').read().split('\0')]
        os.kill(rank1[0], signal.SIGKILL)
        err = torchrun.communicate(timeout=60)[1]
    finally:
        if torchrun.poll() is None:
            torchrun.kill()
    ours = [line for line in err.splitlines() if line.startswith('error: ')]
    assert len(ours) == 1 and re.fullmatch(
        rf"error: rank 0: DDP lost rank 1 at step \d+; the last checkpoint, "
        rf"{re.escape(out)}/ckpt_last.pt, is from step {load_ckpt(out)['step']}: "
        rf"continue with the same torchrun command and --init_from=resume", ours[0]), err
    assert 'GLHF' not in err and '[rank0]' not in err, err


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


def test_run_records_where_it_ran_and_its_whole_val_loss(tmp_path):
    """summary.json says where the run ran (commit, threads, CPU, ...) and, at the end, the last and
    the best model's ce on all of val.bin (the same tokens whatever the seed), each equal to an
    independent computation."""
    from checkpoint import load
    from model import Transformer
    import torch.nn.functional as F
    out = str(tmp_path / 'out')
    assert tiny_run(tmp_path, '--train_steps=10').returncode == 0
    # val gets worse
    p = tiny_run(tmp_path, '--init_from=resume', '--train_steps=15', '--lr=3', '--warmup_iters=0')
    assert p.returncode == 0, p.stderr
    s = json.load(open(os.path.join(out, 'summary.json')))
    assert s['best_val_loss'] < s['final_val_loss']  # so the best model is not the last one
    git = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=ROOT, capture_output=True, text=True)
    head = git.stdout.strip()
    if os.path.isdir(os.path.join(ROOT, '.git')):  # a clone (CI's): the commit is recorded
        assert git.returncode == 0 and re.fullmatch('[0-9a-f]{40}', head), git.stderr
    assert s['commit'] == (head or None) and isinstance(s['tree_changed'], bool) == bool(head)
    assert (s['threads'] == torch.get_num_threads() and s['cpu'] and s['python']
            and s['torch'] == torch.__version__)
    assert s['cpu_isa'] == torch.backends.cpu.get_cpu_capability()
    val = np.fromfile(os.path.join(tmp_path, 'tiny', 'val.bin'), dtype=np.uint16).astype(np.int64)
    n = (len(val) - 1) // 16  # context_size 16
    x = torch.from_numpy(val[:n * 16].reshape(n, 16))
    y = torch.from_numpy(val[1:n * 16 + 1].reshape(n, 16))
    for name, key in (('last', 'whole_val_last'), ('best', 'whole_val_best')):
        ckpt, model_config = load(os.path.join(out, f'ckpt_{name}.pt'))
        m = Transformer(model_config)
        m.load_state_dict(ckpt['model'])
        m.eval()
        with torch.no_grad():
            logits = m(x, y, return_logits=True)[0]
        ce = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1)).item()
        assert math.isclose(s[key], ce, rel_tol=1e-5), (name, s[key], ce)
    assert s['whole_val_tokens'] == n * 16 and s['whole_val_best'] != s['whole_val_last']
    assert ([r for r in read_log(out) if r['type'] == 'whole_val'][-1]['whole_val_best']
            == s['whole_val_best'])
    # resuming the finished run does not score it again: its scores stand
    n_whole = sum(r['type'] == 'whole_val' for r in read_log(out))
    p = run_here('train.py', f'--out_dir={out}', '--init_from=resume')
    assert p.returncode == 0 and 'all of val.bin' not in p.stdout, p.stdout + p.stderr
    assert sum(r['type'] == 'whole_val' for r in read_log(out)) == n_whole
    assert json.load(open(os.path.join(out, 'summary.json'))) == dict(
        s, wall_time_s=json.load(open(os.path.join(out, 'summary.json')))['wall_time_s'])
