"""
Tests of sample.py's streaming: the text it prints token by token is the decoded text of the sampled
tokens, it shows up while sampling goes on, and Ctrl-C stops it in one line. A tiny model, saved as
train.py does. What needs no process of its own (the printed text, a refusal) runs in this process
(run_here); signals, closed pipes and start-up run sample.py as users do.
$ python -m pytest -q test_sample.py
"""
import dataclasses
import os
import re
import select
import signal
import subprocess
import sys

import pytest
import torch

import checkpoint
from configurator import read_config_file
from conftest import ROOT, run_here, signal_after_reader_gone, train_defaults
from engine import Engine
from model import ModelConfig, Transformer
from tokenizer import get_encoding

ENV = dict(os.environ, OMP_NUM_THREADS='1')


@pytest.fixture(scope='module')
def out_dir(tmp_path_factory):
    # vocab_size 256: GPT-2's first 256 ids are the single bytes, so every character outside ASCII
    # is split across tokens, and random bytes are often no UTF-8 at all
    config = ModelConfig(arch='gpt', vocab_size=256, context_size=16, n_embed=16, n_layer=1,
                         n_head=2)
    torch.manual_seed(0)
    model = Transformer(config)
    out = tmp_path_factory.mktemp('out')
    checkpoint.save({'model': model.state_dict(), 'config': dataclasses.asdict(config), 'step': 0},
                    str(out / 'ckpt_best.pt'))
    return out


def sample(out_dir, *args):
    # in this process: what it prints, as written (a \r stays a \r)
    p = run_here('sample.py', f'--out_dir={out_dir}', '--device=cpu', *args)
    return p.returncode, p.stdout, p.stderr


def test_streamed_text_is_the_decoded_tokens(out_dir):
    enc = get_encoding()
    rc, out, err = sample(out_dir, '--start=H', '--num_samples=3', '--max_new_tokens=200',
                          '--seed=7', '--top_k=0', '--temperature=2')
    assert rc == 0, err
    # the same samples, not streamed: the same seed and calls as sample.py, decoded at once
    ckpt, config = checkpoint.load(str(out_dir / 'ckpt_best.pt'))
    torch.manual_seed(7)
    model = Transformer(config)  # its initialisation draws random numbers in sample.py too
    model.load_state_dict(ckpt['model'])
    model.eval()
    x = torch.tensor([enc.encode('H')])
    ids = [Engine(model).generate(x, 200, temperature=2.0)[0].tolist() for _ in range(3)]
    assert out == ''.join(enc.decode(i) + '\n---------------\n' for i in ids)
    # and the test means something: characters were split across tokens (all of them are single
    # bytes), and some bytes were no UTF-8 at all
    assert sum(ord(c) > 127 and c != '\ufffd' for c in out) > 10 and '\ufffd' in out


def test_a_byte_level_run_samples_bytes(out_dir, tmp_path):
    # the checkpoint says its data were bytes: the prompt is encoded and the samples decoded so,
    # id 0 as the end of a document
    ckpt, config = checkpoint.load(str(out_dir / 'ckpt_best.pt'))
    checkpoint.save({**ckpt, 'tokenizer': 'bytes'}, str(tmp_path / 'ckpt_best.pt'))
    rc, out, err = sample(tmp_path, '--start=é', '--num_samples=2', '--max_new_tokens=300',
                          '--seed=3', '--top_k=0', '--temperature=2')
    assert rc == 0, err
    torch.manual_seed(3)
    model = Transformer(config)
    model.load_state_dict(ckpt['model'])
    model.eval()
    x = torch.tensor([list('é'.encode())])
    ids = [Engine(model).generate(x, 300, temperature=2.0)[0].tolist() for _ in range(2)]
    decode = lambda i: bytes(i).replace(b'\0', b'<|endoftext|>').decode(errors='replace')
    assert out == ''.join(decode(i) + '\n---------------\n' for i in ids)
    assert '<|endoftext|>' in out and out.startswith('é')

def test_tokens_show_while_sampling_and_ctrl_c_stops_in_one_line(out_dir):
    proc = subprocess.Popen([sys.executable, 'sample.py', f'--out_dir={out_dir}', '--device=cpu',
                             '--start=H', '--max_new_tokens=1000000'], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 300)  # text arrives long before the end
        assert ready and os.read(proc.stdout.fileno(), 100).startswith(b'H')
        proc.send_signal(signal.SIGINT)
        # seconds on any machine; the limit only catches a hang
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 130
    header, *rest = err.decode().splitlines()  # stderr: the header, then the stop's one line
    assert header.startswith('gpt model, ') and rest == ['error: interrupted'], err


@pytest.mark.parametrize('sig', [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_it_into_a_closed_pipe(out_dir, sig):
    """`python sample.py ... | tee out` and Ctrl-C (or a SIGTERM): the reader of the pipe has gone,
    so nothing more can be written; it still stops at once, with exit 130 (143)."""
    proc = subprocess.Popen([sys.executable, 'sample.py', f'--out_dir={out_dir}', '--device=cpu',
                             '--start=H', '--max_new_tokens=1000000'], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        seen = b''
        while b'\nH' not in seen:  # the header's line, then the prompt: sampling has begun
            chunk = os.read(proc.stdout.fileno(), 4096)
            assert chunk, seen  # (it ended)
            seen += chunk
    except BaseException:
        proc.kill()
        raise
    assert signal_after_reader_gone(proc, sig, timeout=60) == 128 + sig


def test_help_examples_name_out_dirs_that_configs_write():
    doc = open(os.path.join(ROOT, 'sample.py')).read().split('"""')[1]
    examples = re.findall(r'--out_dir=(\S+)', doc)
    written = set()
    for name in os.listdir(os.path.join(ROOT, 'config')):
        config = read_config_file(os.path.join(ROOT, 'config', name), train_defaults())
        written.add(config.get('out_dir'))
    assert examples and set(examples) <= written, (examples, written)


def test_a_closed_stdout_ends_it_quietly(out_dir):
    """`python sample.py ... | head -3`: the reader goes after a line, and sample.py ends as cat
    does, without a traceback."""
    proc = subprocess.Popen([sys.executable, 'sample.py', f'--out_dir={out_dir}', '--device=cpu',
                             '--max_new_tokens=1000000'], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdout.readline()
        proc.stdout.close()
        assert proc.wait(timeout=120) == -signal.SIGPIPE
        header, *rest = proc.stderr.read().decode().splitlines()
    finally:
        proc.kill()
    assert header.startswith('gpt model, ') and rest == []


def test_a_prompt_past_the_vocabulary_is_one_line(out_dir):
    """The fixture's vocabulary is GPT-2's first 256 ids; ' the history' is ids 262 and 2106."""
    assert sample(out_dir, '--start= the history') == (
        1, '', "error: the prompt has token id 2106, the model's vocab_size is 256\n")


def test_command_line_mistakes_are_one_line(tmp_path):
    """A run folder given alone, a folder without a checkpoint: one line each, saying what to do.
    --help lists the keys (max_new_tokens counted in bytes for a byte model), nothing else."""
    def run(*args):
        p = subprocess.run([sys.executable, 'sample.py', *args], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
        return p.returncode, p.stdout, p.stderr
    assert run(str(tmp_path)) == (1, '', f"error: unexpected argument '{tmp_path}': give the run's "
                                         f"folder as --out_dir={tmp_path}\n")
    assert run(f'--out_dir={tmp_path}') == (
        1, '', f"error: no checkpoint at {tmp_path}/ckpt_best.pt; train one first, e.g. python "
               f"train.py config/cpu_aed_mse_possub.py, then python sample.py "
               f"--out_dir=out-cpu-aed-mse-possub\n")
    rc, out, err = run('--help')
    keys = [line.split()[0] for line in out.splitlines() if re.match(r'  \w+ = ', line)]
    assert rc == 0 and keys == ['out_dir', 'checkpoint', 'start', 'num_samples', 'max_new_tokens',
                                'temperature', 'top_k', 'seed', 'device', 'dtype', 'kv_cache',
                                'compile']
    assert 'bytes' in next(line for line in out.splitlines() if 'max_new_tokens =' in line)
