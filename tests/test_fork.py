"""A fork's first edits of model.py, as a forker makes them in a copy of the project: freeze a
parameter, add one to some blocks, add a config field with a default, add a loss term. Each must
leave train, resume and sample working, old checkpoints included."""
import contextlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT, run_here

ENV = dict(os.environ, OMP_NUM_THREADS='1')
CORE = ['model.py', 'train.py', 'sample.py', 'engine.py', 'configurator.py', 'checkpoint.py',
        'rundir.py', 'tokenizer.py']
TINY = ['--arch=aed', '--vocab_size=256', '--n_layer=2', '--n_embed=16', '--n_head=2',
        '--context_size=16', '--embedding_loss_type=MSE', '--batch_size=4',
        '--gradient_accumulation_steps=2', '--lr=1e-2', '--warmup_iters=2', '--est_steps=1',
        '--est_interval=2', '--compile=False', '--dtype=float32', '--device=cpu']
# (anchor in model.py, what the fork puts after it): each edit as a forker would make it
FREEZE = ('                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * depth))\n',
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

# the usual forks, all in one copy (test_the_usual_forks)
RMSNORM = ('    return nn.LayerNorm(c.n_embed, bias=c.use_bias)\n',
           '    return nn.RMSNorm(c.n_embed)  # fork: RMSNorm for LayerNorm\n',
           'replace')
SWIGLU = ('        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))  # exact (erf) GELU\n',
          '        a, b = self.c_fc(x).chunk(2, dim=-1)  # fork: a SwiGLU MLP\n'
          '        return self.dropout(self.c_proj(F.silu(a) * b))\n', 'replace')
SWIGLU_FC = ('nn.Linear(C, 4 * C, bias=bias), nn.Linear(4 * C',
             'nn.Linear(C, 8 * C, bias=bias), nn.Linear(4 * C', 'replace')
UNTIED = ('        return F.linear(out, self.wte.weight)[..., :self.config.vocab_size]\n',
          '        return self.lm_head(out)  # fork: an untied head\n', 'replace')
UNTIED_INIT = ('        self.ln_f = layer_norm(c)\n',
               '        self.lm_head = nn.Linear(C, c.vocab_size, bias=False)  # fork\n')
LR_GROUP = ('"weight_decay": 0.0}]', '"weight_decay": 0.0, "lr_scale": 10.0}]', 'replace')
OWN_INIT = ('        self.ln_2, self.mlp = layer_norm(c), MLP(c)\n',
            '        self.mix = nn.Parameter(torch.eye(c.n_embed))  # fork: its own init\n'
            '        self.mix_norm = self.mix.norm().item()  # fork: reads a value (not on meta)\n')
OWN_INIT_USE = ('        return x + self.mlp(self.ln_2(x))\n',
                '        return (x + self.mlp(self.ln_2(x))) @ self.mix  # fork\n', 'replace')
INT_FIELD = (FIELD[0], '    n_memory: int = 0  # fork: a count that may be 0\n')
USUAL = (RMSNORM, SWIGLU, SWIGLU_FC, UNTIED, UNTIED_INIT, LR_GROUP, OWN_INIT, OWN_INIT_USE,
         INT_FIELD)
NEW_KEY = ('seed = 1337', 'log_extra = False  # fork: a new key\nseed = 1337')


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
    # its own custom op's name, as in a process of its own: re-registering aed::cumsum_time in
    # this process would destroy the registration this process's model.py calls
    assert '"aed::cumsum_time"' in src
    (d / 'model.py').write_text(src.replace('"aed::cumsum_time"', '"aed_fork::cumsum_time"'))
    return d


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    """A tiny byte dataset as prepare.py --tokenizer=bytes writes it (read only)."""
    root = tmp_path_factory.mktemp('fork_data')
    d = root / 'data' / 'tiny'
    d.mkdir(parents=True, exist_ok=True)
    text = np.frombuffer(b'the cat sat on the mat; the dog sat on the log. ' * 60, np.uint8)
    text[:2400].astype(np.uint16).tofile(d / 'train.bin')
    text[2400:].astype(np.uint16).tofile(d / 'val.bin')
    (d / 'meta.json').write_text(json.dumps({'vocab_size': 256, 'tokenizer': 'bytes'}))
    return str(root / 'data')


@pytest.fixture(scope='module')
def base(tmp_path_factory, data):
    """The unforked code's run of 2 steps, the one the forks that load older checkpoints start
    from (read only: copy it first)."""
    out = str(tmp_path_factory.mktemp('fork_base') / 'out')
    p = run_here('train.py', *TINY, f'--data_dir={data}', '--dataset=tiny', f'--out_dir={out}',
                 '--train_steps=2')
    assert p.returncode == 0, p.stderr
    return out


# the modules a fork's scripts import: each script gets the fork's own, freshly imported
PROJECT = [name[:-3] for name in CORE]


@contextlib.contextmanager
def own_modules(code):
    """Inside: the project's modules import from the fork in code, afresh, as in a process of the
    fork's own; this process's modules are back after."""
    saved = {name: sys.modules.pop(name) for name in PROJECT if name in sys.modules}
    sys.path.insert(0, str(code))
    try:
        yield
    finally:
        sys.path.remove(str(code))
        for name in PROJECT:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


def run_fork(code, *calls, status=0):
    """The fork's scripts, as `python script args` in the fork would run them, one after another
    in this process (no torch import, no process start), each with the fork's modules: each
    (script, *args) must end with status (0: without a traceback). Their CompletedProcesses."""
    done = []
    for call in calls:
        with own_modules(code):
            p = run_here(*call, root=str(code))
            # the fork's code ran, not this process's
            assert os.path.dirname(sys.modules['model'].__file__) == str(code)
        assert p.returncode == status, p.stdout + p.stderr
        assert 'Traceback' not in p.stderr, p.stderr
        done.append(p)
    return done


def torchrun(cwd, *args):
    p = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone',
                        '--nproc_per_node=2', *args], cwd=cwd, env=ENV, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert 'Traceback' not in p.stderr, p.stderr
    return p


SAMPLE = ('sample.py', '--device=cpu', '--num_samples=1', '--max_new_tokens=8', '--start=the ')


def train_resume_sample(code, data, out, steps=(2, 4), extra=(), snapshot=None):
    """Train `steps[0]` steps, resume to `steps[1]`, sample a few bytes: every one must work.
    snapshot: where to copy the first run's checkpoint before the resume."""
    common = [f'--data_dir={data}', '--dataset=tiny', f'--out_dir={out}']
    run_fork(code, ('train.py', *TINY, *common, f'--train_steps={steps[0]}', *extra))
    if snapshot:
        shutil.copy(os.path.join(out, 'ckpt_last.pt'), snapshot)
    _, p = run_fork(code, ('train.py', *common, '--init_from=resume', f'--train_steps={steps[1]}'),
                    (*SAMPLE, f'--out_dir={out}'))
    assert json.load(open(os.path.join(out, 'summary.json')))['step'] == steps[1]
    assert p.stdout.startswith('the '), p.stdout


def weights(out, name='last'):
    path = out if out.endswith('.pt') else os.path.join(out, f'ckpt_{name}.pt')
    return torch.load(path, weights_only=True)['model']


def test_a_frozen_parameter_stays_put(tmp_path, data):
    """Frozen: no gradient, no place in the optimizer, no weight decay (which moved it before);
    the rest trains."""
    code, out, start = fork(tmp_path, FREEZE), str(tmp_path / 'out'), str(tmp_path / 'start.pt')
    train_resume_sample(code, data, out, steps=(0, 4), extra=['--weight_decay=0.5'],
                        snapshot=start)
    assert torch.equal(weights(start)['wpe.weight'], weights(out)['wpe.weight'])
    assert not torch.equal(weights(start)['wte.weight'], weights(out)['wte.weight'])


def test_a_frozen_parameter_stays_put_under_ddp(tmp_path, data):
    """The same with DDP: 2 gloo ranks (torchrun) train the fork's checkpoint of step 0 on, and the
    fork samples what they saved."""
    code, out, start = fork(tmp_path, FREEZE), str(tmp_path / 'out'), str(tmp_path / 'start.pt')
    common = [f'--data_dir={data}', '--dataset=tiny', f'--out_dir={out}']
    run_fork(code, ('train.py', *TINY, *common, '--train_steps=0', '--weight_decay=0.5'))
    shutil.copy(os.path.join(out, 'ckpt_last.pt'), start)
    p = torchrun(code, 'train.py', *common, '--init_from=resume', '--train_steps=4')
    assert '2 process(es)' in p.stdout, p.stdout
    assert json.load(open(os.path.join(out, 'summary.json')))['step'] == 4
    p, = run_fork(code, (*SAMPLE, f'--out_dir={out}'))
    assert p.stdout.startswith('the '), p.stdout
    assert torch.equal(weights(start)['wpe.weight'], weights(out)['wpe.weight'])
    assert not torch.equal(weights(start)['wte.weight'], weights(out)['wte.weight'])


def test_a_parameter_frozen_after_the_checkpoint_resumes(tmp_path, data, base):
    """A run of the unforked code, resumed by a fork that freezes wpe: the saved AdamW state no
    longer fits the trainable parameters, so AdamW starts afresh, said in one line; the weights
    resume, the frozen one stays put."""
    out = str(tmp_path / 'out')
    shutil.copytree(base, out)
    p, = run_fork(fork(tmp_path, FREEZE), ('train.py', f'--out_dir={out}', '--init_from=resume',
                                            '--train_steps=4'))
    assert [line for line in p.stderr.splitlines() if 'AdamW' in line] == [
        "warning: the optimizer state does not fit (ValueError: loaded state dict contains a "
        "parameter group that doesn't match the size of optimizer's group): AdamW starts afresh"
    ], p.stderr
    start, end = weights(base), weights(out)
    assert torch.equal(start['wpe.weight'], end['wpe.weight'])
    assert not torch.equal(start['wte.weight'], end['wte.weight'])


def test_a_parameter_on_some_blocks(tmp_path, data):
    """A parameter on every other block: its checkpoint resumes and samples."""
    train_resume_sample(fork(tmp_path, GATE), data, str(tmp_path / 'out'))
    assert 'blocks.1.gate' in weights(str(tmp_path / 'out'))


def test_a_config_field_with_a_default_loads_older_checkpoints(tmp_path, data, base):
    """A ModelConfig field added with a default: the checkpoints written before it resume and
    sample with that default, and the new key trains."""
    out = str(tmp_path / 'out')
    shutil.copytree(base, out)
    run_fork(fork(tmp_path, FIELD, (*FIELD_USE, 'replace')),
             ('train.py', f'--out_dir={out}', '--init_from=resume', '--train_steps=4'),
             ('sample.py', f'--out_dir={out}', '--device=cpu', '--num_samples=1',
              '--max_new_tokens=4'),
             ('train.py', *TINY, f'--data_dir={data}', '--dataset=tiny', '--mlp_ratio=2',
              f'--out_dir={tmp_path}/narrow', '--train_steps=2'))
    assert json.load(open(os.path.join(out, 'summary.json')))['step'] == 4
    assert weights(out)['blocks.0.mlp.c_fc.weight'].shape == (64, 16)
    assert weights(str(tmp_path / 'narrow'))['blocks.0.mlp.c_fc.weight'].shape == (32, 16)


def test_a_loss_term_in_forward(tmp_path, data):
    """A z-loss added in forward, its value among the parts: trained, resumed, sampled, and the
    part logged with the others at every step. Scored on val, the model is scored by its
    cross-entropy alone (the 'ce' part), not by the fork's loss."""
    from checkpoint import model_config_of
    from model import Transformer
    train_resume_sample(fork(tmp_path, Z_LOSS), data, str(tmp_path / 'out'))
    records = list(map(json.loads, open(tmp_path / 'out' / 'log.jsonl')))
    steps = [r for r in records if r['type'] == 'step']
    assert len(steps) == 4 and all(r['z'] > 0 and r['emb'] > 0 for r in steps), steps
    ckpt = torch.load(tmp_path / 'out' / 'ckpt_last.pt', weights_only=True)
    m = Transformer(model_config_of(ckpt['config'])).eval()  # unforked: no z-loss
    m.load_state_dict(ckpt['model'])
    val = torch.from_numpy(np.fromfile(os.path.join(data, 'tiny', 'val.bin'), np.uint16)
                           .astype(np.int64))
    n = (len(val) - 1) // 16  # whole windows of context_size 16, as train.py scores val.bin
    x, y = val[:n * 16].view(n, 16), val[1:n * 16 + 1].view(n, 16)
    whole = [r for r in records if r['type'] == 'whole_val'][-1]  # at step 4
    assert whole['step'] == 4
    assert whole['whole_val_last'] == pytest.approx(m(x, y)[1].item(), rel=1e-5)


def test_the_usual_forks(tmp_path, data, base):
    """RMSNorm for LayerNorm, a SwiGLU MLP, an untied head, one parameter group at 10x the lr, a
    parameter with its own init (its __init__ reading a value: checkpoint.py's shape check cannot
    build it on meta), an int field defaulting to 0 and a new train.py key, in one copy: it
    trains, resumes and samples; the init, the head and the 10x lr hold. The unforked run's
    checkpoint is refused in one line that says why; a key set below train.py's keys, or named
    like a ModelConfig field, too."""
    code, out, start = fork(tmp_path, *USUAL), str(tmp_path / 'out'), str(tmp_path / 'start.pt')
    train = (code / 'train.py').read_text()
    (code / 'train.py').write_text(train.replace(*NEW_KEY, 1))
    (code / 'check.py').write_text('import torch\nfrom model import ModelConfig, Transformer\n'
                                   'assert isinstance(Transformer(ModelConfig()).ln_f, '
                                   'torch.nn.RMSNorm)\n')
    run_fork(code, ('check.py',))
    train_resume_sample(code, data, out, steps=(0, 4), extra=['--log_extra=True'],
                        snapshot=start)
    init, end = weights(start), weights(out)
    assert torch.equal(init['blocks.0.mix'], torch.eye(16))  # kept, not drawn from N(0, 0.02)
    assert not torch.equal(end['blocks.0.mix'], torch.eye(16))  # and trained
    assert end['lm_head.weight'].shape == (256, 16)
    assert end['blocks.0.mlp.c_fc.weight'].shape == (128, 16)
    groups = torch.load(os.path.join(out, 'ckpt_last.pt'), weights_only=True)['optimizer'][
        'param_groups']
    assert groups[1]['lr_scale'] == 10.0 and groups[1]['lr'] == pytest.approx(10 * groups[0]['lr'])

    def refused(*args):  # train.py of the fork: one line, exit 1
        p, = run_fork(code, ('train.py', *args), status=1)
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
        return p.stderr.strip()
    old = str(tmp_path / 'old')
    shutil.copytree(base, old)
    assert 'was written by a model without a change made to model.py since' in refused(
        f'--out_dir={old}', '--init_from=resume', '--train_steps=4')
    (code / 'train.py').write_text(train + '\nlog_extra = False  # fork: next to its use\n')
    assert refused(*TINY, '--log_extra=True') == (
        "error: unknown config key 'log_extra': train.py sets it below its keys, so it is not one "
        "(keys go above the '# ---' line)")
    # a key named like a ModelConfig field: one of the two defaults would silently hide the other
    (code / 'train.py').write_text(train.replace('seed = 1337', 'dropout_rate = 0.1\nseed = 1337'))
    assert refused(*TINY) == "error: dropout_rate is both a train.py key and a ModelConfig field"
