"""
train.py's training step: its gradient accumulation (.backward() a micro-step; under CUDA
graphs, torch.autograd.grad added into kept .grad tensors) gives one step's gradients, micro_batch
regroups a step's sequences without changing them, the training forward returns no logits, and a
compile_mode that cannot run here is refused. train.py runs in this process (run_here), its model
patched to record.
"""
import torch
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

import model as model_py
from model import Transformer
from conftest import TINY, make_data, run_here
from test_train import assert_one_line_error


def recorder(monkeypatch, forwards=True):
    """Patch the model class so that a train.py run records the gradients and weights its first
    optimizer step sees and (forwards: eager only) every forward's inputs, arguments and logits."""
    rec = {'calls': [], 'grads': None}
    configure, forward = model_py.Transformer.configure_optimizers, model_py.Transformer.forward

    def configure_recording(self, *args):
        opt = configure(self, *args)

        def before_step(opt, args, kwargs):
            if rec['grads'] is None:
                rec['config'] = self.config
                rec['weights'] = {n: p.detach().clone() for n, p in self.named_parameters()}
                rec['grads'] = {n: p.grad.clone() for n, p in self.named_parameters()}
        opt.register_step_pre_hook(before_step)
        return opt

    def recording_forward(self, idx, targets=None, return_logits=True):
        logits, loss, parts = forward(self, idx, targets, return_logits)
        rec['calls'].append(dict(idx=idx.clone(), targets=targets.clone(), training=self.training,
                                 return_logits=return_logits, logits=logits))
        return logits, loss, parts

    monkeypatch.setattr(model_py.Transformer, 'configure_optimizers', configure_recording)
    if forwards:
        monkeypatch.setattr(model_py.Transformer, 'forward', recording_forward)
    return rec


def one_step(tmp_path, name, *args):
    data = make_data(tmp_path)  # TINY: 2 micro-steps of 4 sequences a step
    p = run_here('train.py', *TINY, f'--data_dir={data}', '--dataset=tiny', '--train_steps=1',
                 f'--out_dir={tmp_path}/{name}', *args)
    assert p.returncode == 0, p.stderr
    return p


def test_accumulation_is_backwards_and_micro_batch_regroups(tmp_path, monkeypatch):
    """The first step's gradients, as the optimizer sees them, equal .backward()'s on the same
    weights and sequences (each loss / micro-steps, accumulated by autograd). micro_batch 1, 2, 3,
    8 and 200 (the default) run the same 8 sequences in the same order in the fewest equal forwards
    of at most that many (8, 4, 4, 1, 1), the estimates the same batches, and give the same
    gradients to float32 rounding. No training forward returns logits."""
    runs, forwards = {}, {0: 4, 1: 1, 2: 2, 3: 2, 8: 8, 200: 8}  # micro_batch: rows a forward
    for micro_batch, rows in forwards.items():
        rec = runs[micro_batch] = recorder(monkeypatch)
        one_step(tmp_path, f'mb{micro_batch}', f'--micro_batch={micro_batch}')
        train = rec['train'] = [c for c in rec['calls'] if c['training']]
        assert [tuple(c['idx'].shape) for c in train] == [(rows, 16)] * (8 // rows)
        assert all(c['return_logits'] is False and c['logits'] is None for c in train)
        rec['x'], rec['y'] = (torch.cat([c[k] for c in train]) for k in ('idx', 'targets'))
        rec['est'] = torch.cat([c['idx'] for c in rec['calls'] if not c['training']])
    base = runs[0]
    for micro_batch in (1, 2, 3, 8, 200):
        r = runs[micro_batch]
        assert torch.equal(r['x'], base['x']) and torch.equal(r['y'], base['y'])
        assert torch.equal(r['est'], base['est'])
        for n, g in base['grads'].items():
            torch.testing.assert_close(r['grads'][n], g, rtol=1e-4, atol=1e-7, msg=n)
    # the same step through .backward(), at the same weights
    m = Transformer(base['config'])
    m.load_state_dict(base['weights'])
    for c in base['train']:
        (m(c['idx'], c['targets'])[1] / 2).backward()
    for n, p in m.named_parameters():
        torch.testing.assert_close(base['grads'][n], p.grad, rtol=1e-5, atol=1e-8, msg=n)
    assert all(g.abs().max() > 0 for g in base['grads'].values())


def test_compiled_step_gives_the_eager_gradients(tmp_path, monkeypatch):
    """Compiled (Inductor on CPU: compile_mode auto is the default mode here), the step's
    accumulated gradients equal the eager step's to float32 tolerance: the same accumulation
    through the compiled backward. Its shapes stay static though the estimates came first with
    another batch size (4 rows, the step 8): Dynamo would otherwise make the batch dimension
    symbolic, which made the author's GPT step slower on a GPU (docs/gpu.md)."""
    grads, dims = [], []  # how Dynamo treats each dimension of the compiled frames' inputs
    create_symbol = ShapeEnv.create_symbol
    monkeypatch.setattr(ShapeEnv, 'create_symbol', lambda self, val, source, dynamic_dim, *a, **k:
                        dims.append(dynamic_dim) or create_symbol(self, val, source, dynamic_dim,
                                                                  *a, **k))
    for compile in (False, True):
        torch._dynamo.reset()
        rec = recorder(monkeypatch, forwards=False)
        p = one_step(tmp_path, f'compile{compile}', f'--compile={compile}')
        assert f"compile {'default' if compile else 'off'}\n" in p.stdout
        grads.append(rec['grads'])
    assert dims and set(dims) == {DimDynamic.STATIC}
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g, rtol=1e-4, atol=1e-5, msg=n)


def test_step_options_that_cannot_run_are_refused(tmp_path):
    """One line, before out_dir is touched: an unknown compile_mode, CUDA graphs off CUDA, a
    negative micro_batch."""
    data = make_data(tmp_path)
    for args, words in [(['--compile_mode=fast'], ['compile_mode must be one of', 'max-autotune']),
                        (['--compile=True', '--compile_mode=reduce-overhead'],
                         ['reduce-overhead uses CUDA graphs', 'on CUDA only']),
                        (['--compile=True', '--compile_mode=max-autotune'], ['CUDA graphs']),
                        (['--micro_batch=-1'], ['micro_batch must be >= 0'])]:
        p = run_here('train.py', *TINY, f'--data_dir={data}', '--dataset=tiny',
                     f'--out_dir={tmp_path}/out', *args)
        assert_one_line_error(p, *words)
        assert not (tmp_path / 'out').exists()
