"""A fork's first edits of model.py, as a forker makes them in a copy of the project: freeze a
parameter, add one to some blocks, add a config field with a default, add a loss term. Each must
leave train, resume and sample working, old checkpoints included."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT

ENV = dict(os.environ, OMP_NUM_THREADS='1')
CORE = ['model.py', 'train.py', 'sample.py', 'configurator.py', 'checkpoint.py', 'rundir.py',
        'tokenizer.py']
TINY = ['--arch=aed', '--vocab_size=256', '--n_layer=2', '--n_embed=16', '--n_head=2',
        '--context_size=16', '--embedding_loss_type=MSE', '--batch_size=4',
        '--gradient_accumulation_steps=2', '--lr=1e-2', '--warmup_iters=2', '--est_steps=1',
        '--est_interval=2', '--compile=False', '--dtype=float32', '--device=cpu']
# (anchor in model.py, what the fork puts after it): each edit as a forker would make it
FREEZE = ('        self.compiled_decode_step = None\n',
          '        self.wpe.weight.requires_grad_(False)  # fork: a fixed positional embedding\n')
GATE = ('        self.ln_f = layer_norm(c)\n',
        '        for i, b in enumerate(self.blocks):  # fork: a gate on every other block\n'
        '            if i % 2:\n'
        '                b.gate = nn.Parameter(torch.ones(C))\n')
FIELD = ('    embedding_ln_affine: Opt[bool] = None  # False: loss LayerNorms have no weight, bias'
         '\n',
         '    mlp_ratio: int = 4  # fork: the MLP\'s width over n_embed\n')
FIELD_USE = ('4 * C', 'c.mlp_ratio * C')
RETURN_LOSS = '        return logits if return_logits else None, loss, parts\n'
Z_LOSS = (RETURN_LOSS,
          '        z = 1e-4 * torch.logsumexp(logits, -1).pow(2).mean()  # fork: a z-loss\n'
          '        loss, parts["z"] = loss + z, z.detach()\n' + RETURN_LOSS, 'replace')


def fork(tmp_path, *edits):
    """A copy of the project's core with model.py edited: (anchor, insert after it) or, with
    replace=True given as a third item, (old, new)."""
    d = tmp_path / 'fork'
    d.mkdir(exist_ok=True)
    for name in CORE:
        shutil.copy(os.path.join(ROOT, name), d / name)
    src = (d / 'model.py').read_text()
    for edit in edits:
        old, new = edit[:2]
        assert src.count(old) >= 1, f'model.py no longer has {old!r}: update this fork'
        src = src.replace(old, new) if len(edit) == 3 else src.replace(old, old + new, 1)
    (d / 'model.py').write_text(src)
    return d


def byte_data(root):
    """A tiny byte dataset as prepare.py --tokenizer=bytes writes it."""
    d = root / 'data' / 'tiny'
    d.mkdir(parents=True, exist_ok=True)
    text = np.frombuffer(b'the cat sat on the mat; the dog sat on the log. ' * 60, np.uint8)
    text[:2400].astype(np.uint16).tofile(d / 'train.bin')
    text[2400:].astype(np.uint16).tofile(d / 'val.bin')
    (d / 'meta.json').write_text(json.dumps({'vocab_size': 256, 'tokenizer': 'bytes'}))
    return str(root / 'data')


def run(cwd, *args, torchrun=False):
    launch = ['-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2'] if torchrun \
        else []
    p = subprocess.run([sys.executable, *launch, *args], cwd=cwd, env=ENV, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert 'Traceback' not in p.stderr, p.stderr
    return p


def train_resume_sample(code, data, out, steps=(2, 4), torchrun=False, extra=(), first=None):
    """Train `steps[0]` steps, resume to `steps[1]`, sample a few bytes: every one must work.
    first(): called between the first run and the resume."""
    common = [f'--data_dir={data}', '--dataset=tiny', f'--out_dir={out}']
    run(code, 'train.py', *TINY, *common, f'--train_steps={steps[0]}', *extra, torchrun=torchrun)
    first and first()
    run(code, 'train.py', *common, '--init_from=resume', f'--train_steps={steps[1]}',
        torchrun=torchrun)
    assert json.load(open(os.path.join(out, 'summary.json')))['step'] == steps[1]
    p = run(code, 'sample.py', f'--out_dir={out}', '--device=cpu', '--num_samples=1',
            '--max_new_tokens=8', '--start=the ')
    assert p.stdout.startswith('the '), p.stdout


def weights(out, name='last'):
    return torch.load(os.path.join(out, f'ckpt_{name}.pt'), weights_only=True)['model']


@pytest.mark.parametrize('torchrun', [False, True], ids=['one process', '2-rank gloo'])
def test_a_frozen_parameter_stays_put(tmp_path, torchrun):
    """Frozen: no gradient, no place in the optimizer, no weight decay (which moved it before),
    with DDP too; the rest trains."""
    code, data, out = fork(tmp_path, FREEZE), byte_data(tmp_path), str(tmp_path / 'out')
    start = {}
    train_resume_sample(code, data, out, steps=(0, 4), torchrun=torchrun,
                        extra=['--weight_decay=0.5'], first=lambda: start.update(weights(out)))
    end = weights(out)
    assert torch.equal(start['wpe.weight'], end['wpe.weight'])
    assert not torch.equal(start['wte.weight'], end['wte.weight'])


def test_a_parameter_frozen_after_the_checkpoint_resumes(tmp_path):
    """A run of the unforked code, resumed by a fork that freezes wpe: the saved AdamW state no
    longer fits the trainable parameters, so AdamW starts afresh, said in one line; the weights
    resume, the frozen one stays put."""
    data, out = byte_data(tmp_path), str(tmp_path / 'out')
    common = [f'--data_dir={data}', '--dataset=tiny', f'--out_dir={out}']
    run(ROOT, 'train.py', *TINY, *common, '--train_steps=2')
    start = weights(out)
    p = run(fork(tmp_path, FREEZE), 'train.py', *common, '--init_from=resume', '--train_steps=4')
    assert [line for line in p.stderr.splitlines() if 'AdamW' in line] == [
        "warning: the optimizer state does not fit (ValueError: loaded state dict contains a "
        "parameter group that doesn't match the size of optimizer's group): AdamW starts afresh"
    ], p.stderr
    end = weights(out)
    assert torch.equal(start['wpe.weight'], end['wpe.weight'])
    assert not torch.equal(start['wte.weight'], end['wte.weight'])


def test_a_parameter_on_some_blocks(tmp_path):
    """A parameter on every other block: its checkpoint resumes and samples."""
    code, data = fork(tmp_path, GATE), byte_data(tmp_path)
    train_resume_sample(code, data, str(tmp_path / 'out'))
    assert 'blocks.1.gate' in weights(str(tmp_path / 'out'))


def test_a_config_field_with_a_default_loads_older_checkpoints(tmp_path):
    """A ModelConfig field added with a default: the checkpoints written before it resume and
    sample with that default, and the new key trains."""
    data, out = byte_data(tmp_path), str(tmp_path / 'out')
    run(ROOT, 'train.py', *TINY, f'--data_dir={data}', '--dataset=tiny', f'--out_dir={out}',
        '--train_steps=2')
    code = fork(tmp_path, FIELD, (*FIELD_USE, 'replace'))
    run(code, 'train.py', f'--out_dir={out}', '--init_from=resume', '--train_steps=4')
    run(code, 'sample.py', f'--out_dir={out}', '--device=cpu', '--num_samples=1',
        '--max_new_tokens=4')
    assert weights(out)['blocks.0.mlp.c_fc.weight'].shape == (64, 16)
    run(code, 'train.py', *TINY, f'--data_dir={data}', '--dataset=tiny', '--mlp_ratio=2',
        f'--out_dir={tmp_path}/narrow', '--train_steps=2')
    assert weights(str(tmp_path / 'narrow'))['blocks.0.mlp.c_fc.weight'].shape == (32, 16)


def test_a_loss_term_in_forward(tmp_path):
    code, data = fork(tmp_path, Z_LOSS), byte_data(tmp_path)
    train_resume_sample(code, data, str(tmp_path / 'out'))
