"""
Tests of report.py: fake run directories with hand-written logs (exact numbers), bad input, and one
real tiny train.py run fed through report.py end to end.
"""
import contextlib
import io
import json
import math
import os
import re
import runpy
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch

from conftest import run_here

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
PY = sys.executable
SVG = '{http://www.w3.org/2000/svg}'


def run_report(*args):
    """report.py in this process, as `python experiments/report.py args` from the repository runs
    it (exit status, stdout, stderr): a process would add only its start-up, ~60 times. (Not
    conftest.run_here: its clean-up after train.py costs as much as report.py itself.) stdout
    with report.py's wrapped lines joined again, so that a check reads a whole line; the output
    as printed in raw."""
    out, err, argv, path, status = io.StringIO(), io.StringIO(), sys.argv, list(sys.path), 0
    cmd = sys.argv = ['experiments/report.py', *map(str, args)]
    try:
        with contextlib.chdir(ROOT), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            runpy.run_path(os.path.join(ROOT, 'experiments', 'report.py'), run_name='__main__')
    except SystemExit as e:
        status = e.code
    finally:
        sys.argv, sys.path[:] = argv, path  # report.py puts the repository first
    p = subprocess.CompletedProcess(cmd, status, out.getvalue(), err.getvalue())
    p.raw, p.stdout = p.stdout, unwrap(p.stdout)
    return p


def unwrap(text):
    # a line that is not blank, not a table row and not a new list item continues the one before
    lines = []
    for line in text.split('\n'):
        new = not line.strip() or line.lstrip().startswith(('- ', '|'))
        if lines and not new and lines[-1].strip() and not lines[-1].startswith('|'):
            lines[-1] += ' ' + line.strip()
        else:
            lines.append(line)
    return '\n'.join(lines)


def write_run(root, name, records, summary=None):
    d = os.path.join(root, name)
    os.makedirs(d)
    with open(os.path.join(d, 'log.jsonl'), 'w') as f:
        for r in records:
            f.write(json.dumps(r) + '\n')
    if summary is not None:
        with open(os.path.join(d, 'summary.json'), 'w') as f:
            json.dump(summary, f)
    return d


def fake_records(config, ests, emb, first_step=0, kind='start', steps=None):
    # ests: [(step, train, val)]; a 'step' record for every step up to the last estimate
    recs = [{'type': kind, 'step': first_step, 'config': config}]
    recs += [{'type': 'est', 'step': e[0], 'train': e[1], 'val': e[2], 'tokens': 0, 'epochs': 0.0,
              'time': 0.0}
             for e in ests if e[0] == first_step and kind == 'start']
    last = ests[-1][0]
    for s in range(first_step + 1, last + 1) if steps is None else steps:
        recs.append({'type': 'step', 'step': s, 'loss': 5.0, 'ce': 4.0, 'emb': emb, 'lr': 1e-3,
                     'tokens': s * 100, 'time': s * 0.5})
        for e in ests:
            if e[0] == s:
                recs.append({'type': 'est', 'step': s, 'train': e[1], 'val': e[2],
                             'tokens': s * 100, 'epochs': s / 100, 'time': s * 0.5})
    return recs


def table_rows(stdout):
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip('|').split('|')]
        if line.startswith('| ') and cells[0] not in ('run', '---'):
            rows[cells[0]] = cells
    return rows


def test_table_chart_resume_and_seeds(tmp_path):
    aed = {'arch': 'aed', 'n_embed': 48, 'seed': 1337, 'out_dir': 'a'}
    est0 = [(0, 10.8, 10.8)]
    a = write_run(tmp_path, 'run-aed',
                  fake_records(aed, est0 + [(10, 6.0, 6.5), (20, 5.1234, 5.6789)], 4.138e-9),
                  summary={'status': 'finished', 'params': 1_234_567, 'tokens_seen': 2000,
                           'wall_time_s': 75.0, 'config': aed})
    # the same config with another seed: the seed-noise line pairs the two
    aed2 = dict(aed, seed=2, out_dir='b')
    b = write_run(tmp_path, 'run-aed-seed2',
                  fake_records(aed2, est0 + [(10, 6.1, 6.6), (20, 5.2, 5.7011)], 5e-9),
                  summary={'status': 'finished', 'params': 1_234_567, 'tokens_seen': 2000,
                           'wall_time_s': 70.0, 'config': aed2})
    # a run killed after step 14 (last checkpoint at 10) and resumed: its steps 11-14 and the
    # estimate it logged at 12 are superseded by the resumed process's records
    gpt = {'arch': 'gpt', 'n_embed': 64, 'seed': 1337, 'dropout_rate': 0.0}
    recs = fake_records(gpt, est0 + [(10, 6.2, 6.4), (12, 1.0, 1.0)], None, steps=range(1, 15))
    recs += fake_records(gpt, [(20, 5.0, 5.9)], None, first_step=10, kind='resume')
    recs.append('{"type": "step", "step": 21, "lo')  # a half-written last line (killed mid-write)
    with open(os.path.join(write_run(tmp_path, 'run-gpt', []), 'log.jsonl'), 'w') as f:
        f.write('\n'.join(r if isinstance(r, str) else json.dumps(r) for r in recs))
    c = str(tmp_path / 'run-gpt')  # no summary.json: numbers come from the log

    svg, md = tmp_path / 'chart.svg', tmp_path / 'table.md'
    p = run_report(a, b, c, f'--svg={svg}', f'--md={md}')
    assert p.returncode == 0, p.stderr
    rows = table_rows(p.stdout)
    assert rows['run-aed'] == ['run-aed', '5.123', '5.679', '5.679 (20)', '4.138e-09', '1,234,567',
                               '1337', '20', '?', '2,000', '1.2 min']
    assert rows['run-aed-seed2'][1:5] == ['5.200', '5.701', '5.701 (20)', '5.000e-09']
    g = rows['run-gpt (no summary.json)']
    assert (g[1:9] == ['5.000', '5.900', '5.900 (20)', 'N/A', '?', '1337', '20', '?']
            and g[10] == '10 s')
    # the seed group: mean ± sample std (|5.6789 - 5.7011| / sqrt(2) = 0.0157), min-max
    assert ('- run-aed: 2 seeds (1337, 2): final val 5.690 ± 0.016 (min 5.679, max 5.701); '
            'best val 5.690 ± 0.016 (min 5.679, max 5.701)') in p.stdout
    assert md.read_text() == p.raw

    root = ET.parse(svg).getroot()
    assert root.tag == SVG + 'svg'
    paths = root.findall(f'.//{SVG}path')
    assert len(paths) == 3  # one val curve per run
    assert [pth.find(SVG + 'title').text for pth in paths] == ['run-aed', 'run-aed-seed2',
                                                               'run-gpt']
    # another seed of a config: that config's colour, dashed; another config: another colour
    assert paths[0].get('stroke') == paths[1].get('stroke') != paths[2].get('stroke')
    assert paths[0].get('stroke-dasharray') is None and paths[1].get('stroke-dasharray')
    # the resumed run's curve has the steps 0, 10, 20 (its estimate at 12 was superseded)
    assert paths[2].get('d').count('L') == 2
    legend = ' '.join(t.text for t in root.iter(SVG + 'text'))
    assert 'run-aed (5.679)' in legend and 'run-gpt (5.900)' in legend and 'step' in legend

    p = run_report(a, c, f'--svg={svg}', '--train=True', '--ymin=4', '--ymax=7')
    assert p.returncode == 0, p.stderr
    assert len(ET.parse(svg).getroot().findall(f'.//{SVG}path')) == 4  # val + train per run
    assert not os.path.exists(str(svg) + '.tmp')


def test_runs_on_different_datasets_are_told(tmp_path):
    """Runs on different datasets set side by side: the report says that their losses do not
    compare (a run's config without the key: the default dataset)."""
    ests = [(0, 10.8, 10.8), (10, 6.0, 6.5)]
    a = write_run(tmp_path, 'wiki', fake_records({'arch': 'gpt'}, ests, None))
    b = write_run(tmp_path, 'wiki2', fake_records({'arch': 'aed', 'dataset': 'wikipedia'}, ests,
                                                  None))
    c = write_run(tmp_path, 'mine', fake_records({'arch': 'gpt', 'dataset': 'mytext'}, ests, None))
    p = run_report(a, b)
    assert p.returncode == 0 and 'datasets' not in p.stdout, p.stderr
    p = run_report(a, b, c)
    assert p.returncode == 0, p.stderr
    assert ('These runs are on different datasets, so their losses do not compare: wiki on '
            'wikipedia, wiki2 on wikipedia, mine on mytext.') in p.stdout


def test_torn_last_line_is_dropped_and_a_torn_line_inside_is_an_error(tmp_path):
    # a run killed mid-write can leave half a line at the end (train.py cuts it when it resumes)
    cfg = {'arch': 'gpt', 'n_embed': 64, 'seed': 1337}
    recs = [json.dumps(r) for r in fake_records(cfg, [(0, 10.8, 10.8), (10, 6.2, 6.4)], None,
                                                steps=range(1, 13))]
    d = write_run(tmp_path, 'torn', [])
    with open(os.path.join(d, 'log.jsonl'), 'w') as f:
        f.write('\n'.join(recs) + '\n{"type": "step", "step": 13, "lo')
    p = run_report(d)
    assert p.returncode == 0, p.stderr
    assert table_rows(p.stdout)['torn (no summary.json)'][1:3] == ['6.200', '6.400']
    with open(os.path.join(d, 'log.jsonl'), 'w') as f:
        f.write('\n'.join(recs[:3] + ['{"type": "step", "step": 3, "lo'] + recs[3:]) + '\n')
    p = run_report(d)
    assert p.returncode != 0 and 'line 4 is not JSON' in p.stderr and 'Traceback' not in p.stderr


def test_bad_input(tmp_path):
    def one_line_error(p, *words):
        assert p.returncode != 0
        err = p.stderr.strip()
        assert (err.startswith('error: ') and len(err.splitlines()) == 1
                and 'Traceback' not in err), err
        for w in words:
            assert w in err, err

    one_line_error(run_report(tmp_path / 'nope'), 'no such run directory')
    os.makedirs(tmp_path / 'empty')
    one_line_error(run_report(tmp_path / 'empty'), 'no log.jsonl')
    d = write_run(tmp_path, 'started', [{'type': 'start', 'step': 0, 'config': {}}])
    one_line_error(run_report(d), 'no loss estimate')
    with open(os.path.join(d, 'log.jsonl'), 'w') as f:
        f.write('garbage\n{"type": "start", "step": 0}\n')
    one_line_error(run_report(d), 'line 1 is not JSON')
    one_line_error(run_report(), 'no run directories given')
    one_line_error(run_report(d, '--svgg=x.svg'), "unknown config key 'svgg'", "did you mean 'svg'")
    one_line_error(run_report(d, '--ymin=low'), '--ymin must be a number')


def test_real_training_run_end_to_end(tmp_path, tiny_runs):
    # the tiny AED run of train.py every test shares (conftest.tiny_runs: 40 steps of 4 x 2
    # sequences of 16 tokens on the tiny data of 6,000 train tokens, a repeated random sentence)
    out = tmp_path / 'out-tiny'
    shutil.copytree(tiny_runs['full'], out)
    summary = json.load(open(out / 'summary.json'))
    log = [json.loads(line) for line in open(out / 'log.jsonl')]
    last_est = [r for r in log if r['type'] == 'est'][-1]
    last_step = [r for r in log if r['type'] == 'step'][-1]

    svg = tmp_path / 'r.svg'
    p = run_report(out, f'--svg={svg}')
    assert p.returncode == 0, p.stderr
    row = table_rows(p.stdout)['out-tiny']
    best = min((r for r in log if r['type'] == 'est'), key=lambda r: r['val'])
    assert row[1:8] == [f"{last_est['train']:.3f}", f"{last_est['val']:.3f}",
                        f"{best['val']:.3f} ({best['step']})", f"{last_step['emb']:.3e}",
                        f"{summary['params']:,}", '1337', '40']
    assert row[8:10] == [f"{40 * 4 * 2 * 16 / 6000:.2f}", f"{40 * 4 * 2 * 16:,}"]  # epochs, tokens
    assert row[11:] == [f"{summary['whole_val_last']:.3f}", f"{summary['whole_val_best']:.3f}"]
    speed = run_report(out, '--speed').stdout.split('Speed')[1]
    commit = summary['commit'][:7] + '+' * summary['tree_changed']
    cpu = f"{summary['cpu']} ({summary['cpu_count']} CPUs)"
    assert f"| {commit} | {summary['threads']} | {cpu} |" in speed
    paths = ET.parse(svg).getroot().findall(f'.//{SVG}path')
    # estimates at steps 0, 10, 20, 30, 40
    assert len(paths) == 1 and paths[0].get('d').count('L') == 4


# ----------------------------------------------------------------------------- the CPU configs
RUNS = ['aed_cosine', 'aed_mse', 'aed_plain', 'aed_possub', 'aed_mse_possub', 'baseline',
        'baseline_small', 'baseline_dropout']
SIZE_KEYS = {'n_embed', 'n_layer', 'n_head', 'cross_attn_n_head', 'context_size'}


def load_configs(prefix):
    from configurator import load_config
    from conftest import train_defaults
    return {r: load_config(train_defaults(), [os.path.join(ROOT, 'config', f'{prefix}{r}.py')])
            for r in RUNS}


def test_cpu_configs_mirror_the_author():
    """The eight CPU runs share everything but the model, and differ from each other exactly as the
    author's eight runs do; parameter order as in docs/model.md, The author's results:
    baseline_small < AED < baseline."""
    import dataclasses
    from checkpoint import model_config_of
    from model import ModelConfig, Transformer
    cpu, author = load_configs('cpu_'), load_configs('')
    model_keys = [f.name for f in dataclasses.fields(ModelConfig)]
    common = [k for k in cpu['baseline'] if k not in model_keys and k != 'out_dir']
    for r in RUNS:
        assert [cpu[r][k] for k in common] == [cpu['baseline'][k] for k in common], r
        for k in model_keys:
            if k not in SIZE_KEYS:
                # the run's own options, as the author set them
                assert cpu[r][k] == author[r][k], (r, k)
    assert len({cpu[r]['out_dir'] for r in RUNS}) == 8
    aed = [r for r in RUNS if r.startswith('aed')]
    for k in SIZE_KEYS:
        assert len({cpu[r][k] for r in aed}) == 1, k  # all AED runs: one size
    # as deep as encoder + decoder
    assert cpu['baseline']['n_layer'] == 2 * cpu['aed_mse_possub']['n_layer']
    assert cpu['baseline_small']['n_layer'] == cpu['baseline']['n_layer']
    assert {k: v for k, v in cpu['baseline_dropout'].items()
            if k not in ('out_dir', 'dropout_rate')} == \
        {k: v for k, v in cpu['baseline'].items() if k not in ('out_dir', 'dropout_rate')}

    def params(r):
        return Transformer(model_config_of(cpu[r])).get_num_params()
    assert (params('baseline_small') < params('aed_mse_possub') < params('baseline')
            == params('baseline_dropout'))


def test_seed_groups_compare_and_epochs(tmp_path):
    """Three seeds of two configs: group statistics, the paired A - B difference, and the epochs
    axis."""
    dirs = []
    vals = {'aed': [(3.40, 3.30), (3.50, 3.35), (3.42, 3.42)],
            'gpt': [(3.45, 3.31), (3.44, 3.40), (3.50, 3.38)]}
    for arch, seed_vals in vals.items():
        for seed, (final, best) in zip((1, 2, 3), seed_vals):
            cfg = {'arch': arch, 'seed': seed}
            # written by a later train.py: keys the first seed's config lacks, and run-control keys
            if seed > 1:
                cfg.update(n_decoder_layer=None, ddp_timeout=600, overwrite=True,
                           init_from='resume')
            name = arch if seed == 1 else f'{arch}_seed{seed}'
            ests = [(0, 10.8, 10.8), (10, 3.0, best), (20, 2.5, final)]
            recs = fake_records(cfg, ests, None)
            # the GPT's 20 steps are one epoch, the AED's two
            per_epoch = 10 if arch == 'aed' else 20
            for r in recs:
                if r['type'] == 'est':
                    r['epochs'] = r['step'] / per_epoch
            dirs.append(write_run(tmp_path, name, recs,
                                  summary={'status': 'finished', 'config': cfg,
                                           'epochs': 20 / per_epoch}))
    svg = tmp_path / 'c.svg'
    p = run_report(*dirs, '--compare=aed,gpt', f'--svg={svg}', '--x=epochs', '--train=True')
    assert p.returncode == 0, p.stderr
    rows = table_rows(p.stdout)
    # best val (first step)
    assert rows['aed_seed2'][3] == '3.350 (10)' and rows['aed_seed3'][3] == '3.420 (10)'
    assert rows['aed'][8] == '2.00' and rows['gpt'][8] == '1.00'  # epochs
    # aed final 3.40, 3.50, 3.42: mean 3.440, sample std 0.053
    assert '- aed: 3 seeds (1, 2, 3): final val 3.440 ± 0.053 (min 3.400, max 3.500); ' \
           'best val 3.357 ± 0.060 (min 3.300, max 3.420)' in p.stdout
    # paired final differences -0.05, +0.06, -0.08; best -0.01, -0.05, +0.04
    assert ('- aed - gpt, paired by seed (1, 2, 3): final val -0.023 ± 0.074 '
            '(min -0.080, max +0.060); best val -0.007 ± 0.045 (min -0.050, max +0.040); '
            'aed lower in 2 of 3 (final), 2 of 3 (best)') in p.stdout
    root = ET.parse(svg).getroot()
    texts = [t.text for t in root.iter(SVG + 'text')]
    assert 'epochs (tokens seen / training tokens)' in texts
    paths = {pth.find(SVG + 'title').text: pth.get('d') for pth in root.findall(f'.//{SVG}path')
             if pth.get('stroke-width') == '2'}
    # on the epochs axis the GPT's curves end half way across the 540 px plot (x from 70 to 610),
    # the AED's at the right edge; on the step axis both end at the right edge
    assert (paths['gpt'].split()[-1].startswith('L340.0,')
            and paths['aed'].split()[-1].startswith('L610.0,'))
    assert run_report(*dirs, f'--svg={svg}').returncode == 0
    paths = [pth.get('d') for pth in ET.parse(svg).getroot().findall(f'.//{SVG}path')]
    assert all(d.split()[-1].startswith('L610.0,') for d in paths)

    def one_line_error(p, *words):
        err = p.stderr.strip()
        assert p.returncode != 0 and err.startswith('error: ') and len(err.splitlines()) == 1, err
        assert all(w in err for w in words), err
    p = run_report(dirs[0], dirs[3], '--compare=aed,gpt')  # one seed each: no spread to report
    assert ('- aed - gpt, paired by seed (1): final val -0.050 (one seed: no spread yet); '
            'best val -0.010 (one seed: no spread yet); '
            'aed lower in 1 of 1 (final), 1 of 1 (best)') in p.stdout
    one_line_error(run_report(*dirs, '--compare=aed,bert'), "no run or group named 'bert'")
    one_line_error(run_report(dirs[0], dirs[4], '--compare=aed,gpt_seed2'), 'no seed in common')
    one_line_error(run_report(*dirs, '--compare=aed'), '--compare takes pairs of names')
    one_line_error(run_report(*dirs, '--compare=aed,gpt;gpt'), '--compare takes pairs of names')
    one_line_error(run_report(*dirs, '--x=tokens'), '--x must be step or epochs')
    # several pairs at once, each paired by seed; a second run of a config at a seed the group has
    # (a re-run) is a group of its own, not a fourth seed
    rerun = write_run(tmp_path, 'aed_rerun', fake_records({'arch': 'aed', 'seed': 1},
                                                          [(0, 10.8, 10.8), (20, 2.5, 3.0)], None),
                      summary={'status': 'finished', 'config': {'arch': 'aed', 'seed': 1}})
    p = run_report(*dirs, rerun, '--compare=aed,gpt;aed_rerun,aed')
    assert p.returncode == 0, p.stderr
    assert '- aed: 3 seeds (1, 2, 3): final val 3.440' in p.stdout
    assert '- aed - gpt, paired by seed (1, 2, 3): final val -0.023' in p.stdout
    assert ('- aed_rerun - aed, paired by seed (1): final val -0.400 (one seed: no spread yet)'
            in p.stdout)


def test_embedding_loss_diagnostics_table(tmp_path):
    """--diag: a table per run of the 'emb_diag' dicts that train.py logs with its estimates, at the
    first, the last and evenly spread estimates between; runs without them get none."""
    cfg = {'arch': 'aed', 'seed': 1}
    recs = fake_records(cfg, [(s, 5.0, 5.5) for s in range(0, 100, 10)], 0.5)
    for r in recs:
        if r['type'] == 'est':
            r['emb_diag'] = {'loss': 1.0 / (1 + r['step']), 'loss_no_affine': 0.9,
                             'ln_a_weight_rms': 1.0 - r['step'] / 200, 'ln_b_weight_rms': 0.5,
                             'ln_bias_gap_rms': 0.01, 'avg_spread': 0.2, 'target_spread': 0.3,
                             'cos_no_affine': 0.4}
    d = write_run(tmp_path, 'aed', recs)
    g = write_run(tmp_path, 'gpt',
                  fake_records({'arch': 'gpt', 'seed': 1}, [(0, 10.8, 10.8), (10, 3.0, 3.0)], None))
    p = run_report(d, g, '--diag=True')
    assert p.returncode == 0, p.stderr
    rows = [line for line in p.stdout.split('aed:')[-1].splitlines()
            if line.startswith('| ') and '---' not in line]
    assert rows[0].startswith('| step | loss | loss without LN affine | ln_a weight RMS |')
    steps = [int(r.split('|')[1].replace(',', '')) for r in rows[1:]]
    assert steps[0] == 0 and steps[-1] == 90 and len(steps) == 8 and steps == sorted(set(steps))
    assert rows[-1] == '| 90 | 1.10e-02 | 0.900 | 0.550 | 0.500 | 0.010 | 0.200 | 0.300 | 0.400 |'
    assert ('gpt:' not in p.stdout
            and 'embedding loss at the estimates' not in run_report(d, g).stdout)
    # today's train.py logs fewer diagnostics: a column it does not log is left out, not N/A
    for r in recs:
        for k in ('ln_bias_gap_rms', 'avg_spread', 'target_spread'):
            r.get('emb_diag', {}).pop(k, None)
    p = run_report(write_run(tmp_path, 'aed_new', recs), '--diag=True')
    assert ('| step | loss | loss without LN affine | ln_a weight RMS | ln_b weight RMS | cosine |'
            in p.stdout and 'N/A' not in p.stdout), p.stdout


def test_speed_table(tmp_path):
    """--speed: the median ms/step, tokens/s and MFU of each run's logged steps, without step 1 (it
    pays for compiling), and the summary's hardware and peak GPU memory; N/A where a CPU run has no
    MFU or GPU memory."""
    # step 1 (compile) and 5 (an outlier) off the median
    ms = {1: 9000.0, 2: 600.0, 3: 700.0, 4: 650.0, 5: 5000.0}
    gpu = fake_records({'arch': 'gpt', 'seed': 1}, [(0, 10.8, 10.8), (5, 7.0, 7.1)], None)
    for r in gpu:
        if r['type'] == 'step':
            r.update(ms=ms[r['step']], tok_s=160000 / ms[r['step']] * 1000,
                     mfu=0.02 * 600 / ms[r['step']])
    cpu = fake_records({'arch': 'aed', 'seed': 1}, [(0, 10.8, 10.8), (3, 7.0, 7.1)], None)
    for r in cpu:
        if r['type'] == 'step':
            r.update(ms=1000.0 + r['step'], tok_s=1024.0, mfu=None)
    d1 = write_run(tmp_path, 'g', gpu,
                   summary={'status': 'finished', 'gpu': 'NVIDIA H100 80GB HBM3', 'device': 'cuda',
                            'dtype': 'bfloat16', 'compiled': True, 'peak_gpu_memory_mib': 5631})
    d2 = write_run(tmp_path, 'c', cpu,
                   summary={'status': 'finished', 'device': 'cpu', 'dtype': 'float32',
                            'compiled': False, 'peak_gpu_memory_mib': None})
    p = run_report(d1, d2, '--speed')
    assert p.returncode == 0, p.stderr
    rows = {line.split('|')[1].strip(): [c.strip() for c in line.strip().strip('|').split('|')]
            for line in p.stdout.split('Speed')[1].splitlines()
            if line.startswith('| ') and '---' not in line}
    # GPU steps 2-5: 600, 650, 700, 5000 ms -> median 675; tok/s median of
    # 266,667 246,154 228,571 32,000
    assert rows['g'] == ['g', 'NVIDIA H100 80GB HBM3', 'bfloat16', 'yes', '4', '675', '237,363',
                         '1.8%', '5,631 MiB']
    assert rows['c'] == ['c', 'cpu', 'float32', 'no', '2', '1,002', '1,024', 'N/A', 'N/A']
    assert 'Speed' not in run_report(d1, d2).stdout  # only when asked


def write_seeds(root, name, cfgs, finals):
    # a run per config and final val: name, name_seed2, ... for seeds 1, 2, ...; best val 0.1 lower
    dirs = []
    for seed, (cfg, final) in enumerate(zip(cfgs, finals), 1):
        cfg = dict(cfg, seed=seed)
        recs = fake_records(cfg, [(0, 10.8, 10.8), (10, 3.0, final - 0.1), (20, 2.5, final)], None)
        recs[0].update(device='cpu', dtype='float32')  # as train.py's start record has them
        summary = {'status': 'finished', 'config': cfg, 'device': 'cpu', 'dtype': 'float32'}
        dirs.append(write_run(root, name if seed == 1 else f'{name}_seed{seed}', recs, summary))
    return dirs


def test_seed_groups_never_pool_two_configs_in_any_order(tmp_path):
    """A key missing from an older run's config means its default: the key config's first seed,
    written before embedding_ln_affine existed, is not the config of runs with
    embedding_ln_affine=False. Keys that change no number (out_dir, init_from, device 'auto' as it
    resolved) do not split a group."""
    new = {'arch': 'aed', 'embedding_ln_affine': None}
    old = {'arch': 'aed'}
    cpu = dict(new, device='cpu', dtype='float32', init_from='resume')
    key = write_seeds(tmp_path, 'aed', [old, dict(new, device='auto', out_dir='/x/a2'), cpu],
                      [3.40, 3.50, 3.42])
    noaffine = write_seeds(tmp_path, 'aed_noaffine', [dict(new, embedding_ln_affine=False)] * 3,
                           [3.60, 3.70, 3.65])
    gpt = write_seeds(tmp_path, 'gpt', [{'arch': 'gpt'}] * 3, [3.45, 3.44, 3.50])
    glob_order = sorted(key + noaffine + gpt)  # aed, aed_noaffine, aed_noaffine_seed2, ...
    shuffled = noaffine[1:] + gpt[::-1] + key[::-1] + noaffine[:1]
    outputs = []
    for dirs in (glob_order, shuffled):
        p = run_report(*dirs, '--compare=aed,gpt')
        assert p.returncode == 0, p.stderr
        groups = sorted(line for line in p.stdout.splitlines() if ' seeds (' in line)
        diffs = [line for line in p.stdout.splitlines() if ', paired by seed (' in line]
        outputs.append((groups, diffs))
        assert len(groups) == 3
        assert '- aed: 3 seeds (1, 2, 3): final val 3.440 ± 0.053 (min 3.400,' in p.stdout
        assert '- aed_noaffine: 3 seeds (1, 2, 3): final val 3.650 ± 0.050 (min' in p.stdout
        assert '- aed - gpt, paired by seed (1, 2, 3): final val -0.023 ± 0.074 (' in p.stdout
    assert outputs[0] == outputs[1]
    # a run's name stands for its group
    p = run_report(*shuffled, '--compare=aed_noaffine_seed2,aed')
    assert '- aed_noaffine_seed2 - aed, paired by seed (1, 2, 3): final val +0.210 ±' in p.stdout
    # another value of a key that changes the numbers is another group
    # (at a seed the group lacks: else it would be a re-run of seed 1, a group of its own anyway)
    other = write_seeds(tmp_path, 'aed_compiled', [dict(new, compile=False)] * 4, [3.0] * 4)[3:]
    p = run_report(*key, *other)
    assert p.returncode == 0, p.stderr
    assert '- aed: 3 seeds (1, 2, 3):' in p.stdout and ' seeds (1, 2, 3, 4)' not in p.stdout


def test_seed_groups_span_keys_added_or_removed_at_their_defaults(tmp_path):
    """A run from before a key existed, one written while train.py had a key it has since dropped
    (at that key's default), and one from today are one config: the data-constrained study's key
    pair at seeds 1337, 2, 3 is one group (its seed 1337 lacks embedding_agg_type, seeds 2 and 3
    hold it at None). A dropped key at another value, or one whose default is not known, splits."""
    old = {'arch': 'gpt'}  # before embedding_agg_type
    held = {'arch': 'gpt', 'embedding_agg_type': None}  # while train.py had it
    runs = write_seeds(tmp_path, 'gpt', [old, held, old], [3.4, 3.5, 3.6])
    runs += write_seeds(tmp_path, 'aed', [{'arch': 'aed'}, dict(held, arch='aed'),
                                          dict(held, arch='aed')], [3.3, 3.5, 3.5])
    p = run_report(*runs, '--compare=aed,gpt')
    assert p.returncode == 0, p.stderr
    assert '- gpt: 3 seeds (1, 2, 3):' in p.stdout
    assert '- aed - gpt, paired by seed (1, 2, 3):' in p.stdout
    # held at another value than its default, or a dropped key report.py does not know: apart
    learned = dict(held, embedding_agg_type='LEARNED')
    other = write_seeds(tmp_path / 'o', 'gpt_learned', [learned] * 4, [3.0] * 4)[1:2]
    gone = write_seeds(tmp_path / 'g', 'gpt_gone', [dict(old, gone_key=1)] * 4, [3.0] * 4)[2:3]
    p = run_report(*runs[:3], *other, *gone)
    assert p.returncode == 0, p.stderr
    assert '- gpt: 3 seeds (1, 2, 3):' in p.stdout and ' seeds (1, 2, 3, 4)' not in p.stdout
    assert ' seeds (1, 2, 3)' in p.stdout and '2 seeds' not in p.stdout


STUDIES = [  # (script, environment, what it names: committed runs and floors), the tables it writes
    ('cpu_data_constrained.sh', {'RES': 'data_constrained'},
     ['data_constrained', 'data_constrained_regularised', 'data_constrained_confounds']),
    ('cpu_bytes.sh', {'PILOT': 'bytes_pilot', 'STUDY': 'bytes'}, ['bytes_pilot', 'bytes']),
    ('cpu_bytes_overfit.sh', {'PILOT': 'bytes_overfit_pilot', 'STUDY': 'bytes_overfit'},
     ['bytes_overfit_pilot', 'bytes_overfit', 'bytes_overfit_paired']),
    ('cpu_bytes_stall.sh', {'RES': 'bytes_stall'}, ['bytes_stall']),
    ('gpu_author_regime.sh', {'RES': 'gpu_author_regime'}, ['gpu_author_regime']),
    ('gpu_author_regime.sh', {'RES': 'gpu_h100_30steps', 'STEPS': '30'}, ['gpu_h100_30steps']),
    ('gpu_author_regime.sh', {'RES': 'gpu_h200_30steps', 'STEPS': '30'}, ['gpu_h200_30steps']),
]


@pytest.mark.parametrize('script,env,tables', STUDIES,
                         ids=[s[1][next(iter(s[1]))] for s in STUDIES])
def test_committed_study_tables_reproduce(tmp_path, script, env, tables):
    """Each committed study table is what its script's report makes of the committed runs today
    (REPORT_ONLY=1, its folders pointed at links to the committed ones, so that the tables and
    charts it writes go to tmp_path, not into the repository)."""
    exp = os.path.join(ROOT, 'experiments')
    for name in env.values():
        for link in (name, f'{name}_floors.json'):
            if os.path.exists(os.path.join(exp, link)):
                os.symlink(os.path.join(exp, link), tmp_path / link)
    where = {k: (str(tmp_path / v) if k != 'STEPS' else v) for k, v in env.items()}
    # `python` is this one, but a console line's python -c that imports torch (the versions, not in
    # the tables) is not run: 2 s each
    shim = tmp_path / 'bin'
    shim.mkdir()
    (shim / 'python').write_text(f'''#!/usr/bin/env bash
case "$1 $2" in "-c "*torch*) echo "(not run)"; exit 0 ;; esac
exec {PY} "$@"
''')
    (shim / 'python').chmod(0o755)
    p = subprocess.run(['bash', os.path.join(exp, script)], capture_output=True, text=True,
                       env={**os.environ, **where, 'REPORT_ONLY': '1', 'OMP_NUM_THREADS': '1',
                            'PATH': f"{shim}:{os.environ['PATH']}"}, timeout=300)
    assert p.returncode == 0, p.stderr
    for t in tables:
        with open(os.path.join(exp, f'{t}.md')) as f, open(tmp_path / f'{t}.md') as g:
            assert g.read() == f.read(), f'experiments/{t}.md is not what {script} makes of it'


def test_committed_chunked_loss_table_reproduces():
    """experiments/gpu_h100_chunked_loss.md is the command experiments/README.md gives for it."""
    d = os.path.join('experiments', 'gpu_h100_chunked_loss')
    p = subprocess.run([PY, 'experiments/report.py', *sorted(
        os.path.join(d, r) for r in os.listdir(os.path.join(ROOT, d))), '--speed',
        '--floors=experiments/gpu_h100_chunked_loss_floors.json'], cwd=ROOT, capture_output=True,
        text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    with open(os.path.join(ROOT, 'experiments', 'gpu_h100_chunked_loss.md')) as f:
        assert p.stdout == f.read()


def test_paired_differences_get_a_95_percent_interval(tmp_path):
    aed = write_seeds(tmp_path, 'aed', [{'arch': 'aed'}] * 3, [3.40, 3.50, 3.42])
    gpt = write_seeds(tmp_path, 'gpt', [{'arch': 'gpt'}] * 3, [3.45, 3.44, 3.50])
    p = run_report(*aed, *gpt, '--compare=aed,gpt')
    assert p.returncode == 0, p.stderr
    # final (and best) differences -0.05, +0.06, -0.08: mean -0.0233, sd 0.0737, t(0.975, 2) is
    # 4.303, half width 4.303 * 0.0737 / sqrt(3) = 0.1831: [-0.2065, +0.1598]
    assert ('- aed - gpt, paired by seed (1, 2, 3): final val -0.023 ± 0.074 (min -0.080, '
            'max +0.060); best val -0.023 ± 0.074 (min -0.080, max +0.060); aed lower in 2 of 3 '
            '(final), 2 of 3 (best)\n  - 95% CI of the mean (t, n=3): final val [-0.206, +0.160], '
            'best val [-0.206, +0.160]\n') in p.stdout
    # as printed: its prose within 100 columns, a list item's lines under its text
    assert all(len(line) <= 100 for line in p.raw.splitlines() if not line.startswith('|'))
    assert "best val\n  -0.023 ± 0.074 (min -0.080, max +0.060); aed lower in 2 of 3" in p.raw
    # two seeds: t(0.975, 1) = 12.706; differences -0.05, +0.06: half width 12.706 * 0.0778 / 1.414
    p = run_report(*aed[:2], *gpt[:2], '--compare=aed,gpt')
    assert '  - 95% CI of the mean (t, n=2): final val [-0.694, +0.704]' in p.stdout
    p = run_report(aed[0], gpt[0], '--compare=aed,gpt')  # one seed: no interval
    assert 'paired by seed (1)' in p.stdout and '95% CI' not in p.stdout


def one_line_error(p, *words):
    err = p.stderr.strip()
    assert p.returncode != 0 and err.startswith('error: ') and len(err.splitlines()) == 1, err
    assert all(w in err for w in words), err


def test_a_repeated_run_is_refused_however_it_comes(tmp_path):
    """A run given twice would be another seed of its group, or take another's place in it: each
    way of repeating one is refused in one line, in either order."""
    aed = write_seeds(tmp_path / 'res', 'aed', [{'arch': 'aed'}] * 3, [3.40, 3.50, 3.42])
    gpt = write_seeds(tmp_path / 'res', 'gpt', [{'arch': 'gpt'}] * 3, [3.45, 3.44, 3.50])
    rerun = write_seeds(tmp_path / 'res', 'aed_rerun', [{'arch': 'aed'}], [3.0])
    ok = run_report(*aed, *gpt, *rerun, '--compare=aed,gpt')
    assert ok.returncode == 0 and 'paired by seed (1, 2, 3)' in ok.stdout, ok.stderr
    # a glob and one of its runs again (the pair would shrink to one seed)
    one_line_error(run_report(*aed, *gpt, gpt[0], '--compare=aed,gpt'), 'given twice')
    # the same directory spelled otherwise: a trailing slash, './', a link
    os.symlink(aed[0], tmp_path / 'link')
    for again in (aed[0] + '/', os.path.join(aed[0], '..', 'aed'), tmp_path / 'link'):
        one_line_error(run_report(*aed, again), 'given twice')
    # a run's working copy beside its committed copy: another directory, the same name
    work = write_seeds(tmp_path / 'out', 'aed', [{'arch': 'aed'}] * 2, [3.9, 3.8])
    for dirs in ([*aed, *gpt, work[0]], [work[0], *aed, *gpt], [*work, *aed]):
        one_line_error(run_report(*dirs, '--compare=aed,gpt'), "two runs named 'aed'")
    # overlapping globs (aed*, aed_seed*): a re-run would join the repeated seeds' group
    one_line_error(run_report(*rerun, *aed[1:], *aed[1:]), 'given twice')


def test_pooled_pairs(tmp_path):
    """A,B+C,D pools the seed pairs of both into one sample: n = 6, t with 5 degrees of freedom;
    pairs that share a run are refused."""
    dirs = []
    for name, finals in (('aed', [3.40, 3.50, 3.42]), ('gpt', [3.45, 3.44, 3.50]),
                         ('aed2', [3.30, 3.35, 3.33]), ('gpt2', [3.28, 3.30, 3.40])):
        dirs += write_seeds(tmp_path, name, [{'arch': name}] * 3, finals)
    p = run_report(*dirs, '--compare=aed2,gpt2;aed,gpt+aed2,gpt2')
    assert p.returncode == 0, p.stderr
    # -0.05, +0.06, -0.08 and +0.02, +0.05, -0.07: mean -0.0117, sd 0.0624; half width
    # 2.571 * 0.0624 / sqrt(6) = 0.0655
    assert ('- aed - gpt and aed2 - gpt2, pooled (6 seed pairs): final val -0.012 ± 0.062 '
            '(min -0.080, max +0.060)') in p.stdout
    assert 'the first lower in 3 of 6 (final)' in p.stdout
    assert '  - 95% CI of the mean (t, n=6): final val [-0.077, +0.054]' in p.stdout
    assert '- aed2 - gpt2, paired by seed (1, 2, 3): final val +0.000 ± 0.062' in p.stdout
    one_line_error(run_report(*dirs, '--compare=aed,gpt+aed2,gpt'),
                   'pooled pairs share the run gpt')
    one_line_error(run_report(*dirs, '--compare=aed,gpt+'), '--compare takes pairs of names')


def test_t_quantiles():
    """report.t975 against Student's t distribution: the x where its density integrated (Simpson)
    reaches 0.975, found by Newton's method, to 5e-4 (the intervals print 3 decimals)."""
    import report

    def pdf(x, df):
        c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
        return c * (1 + x * x / df) ** (-(df + 1) / 2)

    def cdf(x, df, n=4000):
        f = [pdf(x * i / n, df) for i in range(n + 1)]
        return 0.5 + x / n / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))
    for df in list(range(1, 41)) + [60, 120, 1000]:
        x = 2.0  # below every quantile: Newton's steps on this concave part rise to it
        for _ in range(12):
            x -= (cdf(x, df) - 0.975) / pdf(x, df)
        assert abs(report.t975(df) - x) < 5e-4, (df, report.t975(df), x)
    assert abs(report.t975(1) - 12.706) < 5e-4 and abs(report.t975(2) - 4.303) < 5e-4


def test_whole_val_and_where_a_run_ran(tmp_path):
    """Runs of a later train.py: the last and the best model's loss on all of val.bin (summary.json,
    or the log's 'whole_val' record) in the table, the seed lines and the paired differences, '-'
    where a run predates it; where each of a run's processes ran (commit, threads, CPU) in the
    speed table."""
    aed = write_seeds(tmp_path, 'aed', [{'arch': 'aed'}] * 3, [3.40, 3.50, 3.42])
    gpt = write_seeds(tmp_path, 'gpt', [{'arch': 'gpt'}] * 3, [3.45, 3.44, 3.50])
    figures = [(3.30, 3.20), (3.40, 3.30), (3.35, 3.25), (3.35, 3.25), (3.38, 3.31)]  # (last, best)
    for d, (last, best) in zip(aed + gpt[:2], figures):
        whole = {'whole_val_last': last, 'whole_val_best': best, 'whole_val_tokens': 12800}
        if d == aed[2]:  # no summary.json: the log's record
            os.remove(os.path.join(d, 'summary.json'))
            with open(os.path.join(d, 'log.jsonl'), 'a') as f:
                f.write(json.dumps(dict(type='whole_val', step=20, best_step=10, **whole)) + '\n')
        else:
            summary = json.load(open(os.path.join(d, 'summary.json')))
            json.dump(dict(summary, **whole), open(os.path.join(d, 'summary.json'), 'w'))
    p = run_report(*aed, *gpt, '--compare=aed,gpt')
    assert p.returncode == 0, p.stderr
    rows = table_rows(p.stdout)
    assert rows['aed'][11:] == ['3.300', '3.200']
    assert rows['aed_seed3 (no summary.json)'][11:] == ['3.350', '3.250']
    assert rows['gpt_seed3'][11:] == ['-', '-']  # it predates the whole-val figures
    assert "Best val is the lowest val estimate: an oracle early stop" in p.stdout
    assert "all of val.bin (12,800 tokens, the same for every seed)" in p.stdout
    assert ('- aed: 3 seeds (1, 2, 3): final val 3.440 ± 0.053 (min 3.400, max 3.500); best val '
            '3.340 ± 0.053 (min 3.300, max 3.400); whole val, last 3.350 ± 0.050 (min 3.300, '
            'max 3.400), best 3.250 ± 0.050 (min 3.200, max 3.300)\n') in p.stdout
    # one seed lacks it: no whole-val figure
    assert '(min 3.340, max 3.400)\n' in p.stdout.split('- gpt: 3 seeds')[1]
    # the seeds both sides have: last -0.05, +0.02 (sd 0.0495, half width 12.706 * 0.0495 /
    # sqrt(2) = 0.4447); best -0.05, -0.01 (sd 0.0283, half width 0.2541)
    assert ('  - whole val, paired by seed (1, 2): last -0.015 ± 0.049 (min -0.050, max +0.020), '
            '95% CI [-0.460, +0.430]; best -0.030 ± 0.028 (min -0.050, max -0.010), 95% CI '
            '[-0.284, +0.224]; aed lower in 1 of 2 (last), 2 of 2 (best)\n') in p.stdout
    p = run_report(aed[0], gpt[0], '--compare=aed,gpt')  # one seed: no interval
    assert '  - whole val, paired by seed (1): last -0.050 (one seed: no spread yet); ' in p.stdout
    # a whole-val record followed by an estimate (a resume that trained further) is stale
    with open(os.path.join(aed[2], 'log.jsonl'), 'a') as f:
        f.write(json.dumps({'type': 'est', 'step': 30, 'train': 2.4, 'val': 3.5, 'tokens': 3000,
                            'epochs': 0.3, 'time': 15.0}) + '\n')
    rows = table_rows(run_report(aed[2], aed[0]).stdout)
    assert rows['aed_seed3 (no summary.json)'][11:] == ['-', '-']
    assert 'whole val' not in run_report(*gpt[2:]).stdout.lower()  # no column when no run has it

    # the count-model floors under the table and on the chart, with how many best models are below
    # the lowest (of the runs with a current whole-val figure: aed's 3.20, 3.30, gpt's 3.25, 3.31)
    floors = tmp_path / 'floors.json'
    floors.write_text(json.dumps({'tokenizer': 'bytes', 'train_tokens': 5000,
                                  'floors': {'1': 3.9, '2': 3.26}}))
    p = run_report(*aed, *gpt, f'--floors={floors}', f'--svg={tmp_path / "c.svg"}')
    assert p.returncode == 0, p.stderr
    assert ('Count-model floors (interpolated Kneser-Ney, experiments/floors.py) from the first '
            '5,000 bytes of train.bin, on all of val.bin: 1-gram 3.900, 2-gram 3.260. Runs whose '
            'best model is below the lowest floor on all of val.bin: 2 of 4.') in p.stdout
    svg = (tmp_path / 'c.svg').read_text()
    assert '>1-gram 3.900</text>' in svg and '>2-gram 3.260</text>' in svg
    # with modified Kneser-Ney (floors.py's JSON now): where each group stands between the floors
    new = tmp_path / 'floors_mkn.json'
    new.write_text(json.dumps({'tokenizer': 'bytes', 'train_tokens': 5000,
                               'floors': {'1': 3.9, '2': 3.26, '3': 3.255},
                               'floors_mkn': {'1': 3.9, '2': 3.25, '3': 3.1}}))
    p = run_report(*aed, *gpt, f'--floors={new}', f'--svg={tmp_path / "c.svg"}')
    assert p.returncode == 0, p.stderr
    assert ('Count-model floors (experiments/floors.py) from the first 5,000 bytes of train.bin, '
            'on all of val.bin: interpolated Kneser-Ney 1-gram 3.900, 2-gram 3.260, 3-gram 3.255; '
            'modified Kneser-Ney 3-gram 3.100. Runs whose best model is below the lowest floor on '
            'all of val.bin: 0 of 4. Where the best models stand: aed (2 runs, 3.200-3.300) below '
            'the 1-gram, 1 of 2 below the 2-gram, 1 of 2 below the 3-gram, above the modified KN '
            '3-gram; gpt (2 runs, 3.250-3.310) below the 1-gram, 1 of 2 below the 2-gram, 1 of 2 '
            'below the 3-gram, above the modified KN 3-gram.') in ' '.join(p.stdout.split())
    svg = (tmp_path / 'c.svg').read_text()
    assert '>3-gram 3.255</text>' in svg and '>modified KN 3-gram 3.100</text>' in svg
    labels = re.findall(r'<text x="([\d.]+)" y="([\d.]+)" text-anchor="end" fill="#666" ', svg)
    assert sorted(x for x, y in labels) == ['514', '606', '606', '606']  # 2- and 3-gram
    # are 2.3 px apart: the second's label moves left of the first's ('2-gram 3.260': 12 characters)
    summary = json.load(open(os.path.join(gpt[0], 'summary.json')))  # gpt (3.25): another slice
    json.dump(dict(summary, train_tokens=2500), open(os.path.join(gpt[0], 'summary.json'), 'w'))
    assert ('below the lowest floor on all of val.bin: 1 of 3 (not counted, trained on another '
            'slice: gpt).') in run_report(*aed, *gpt, f'--floors={floors}').stdout
    assert_one_line = run_report(*aed, f'--floors={tmp_path / "none.json"}')
    assert assert_one_line.returncode == 1 and 'error: --floors: cannot read' in \
        assert_one_line.stderr

    # where it ran: a run started at a commit with changes in its tree, one thread, then resumed
    # elsewhere with two; a run from before train.py recorded it gets '-'
    log = os.path.join(gpt[0], 'log.jsonl')
    recs = [json.loads(line) for line in open(log)]
    facts = {'commit': 'abcdef0123456789', 'tree_changed': True, 'python': '3.11.7', 'threads': 1,
             'cpu': 'AMD EPYC 7B13', 'cpu_count': 2, 'cpu_isa': 'AVX2'}
    recs[0].update(facts)
    recs.append(dict(recs[0], type='resume', step=20, threads=2, tree_changed=False))
    with open(log, 'w') as f:
        f.write(''.join(json.dumps(r) + '\n' for r in recs))
    p = run_report(gpt[0], gpt[1], '--speed')
    rows = {line.split('|')[1].strip(): [c.strip() for c in line.strip().strip('|').split('|')]
            for line in p.stdout.split('Speed')[1].splitlines() if line.startswith('| ')}
    assert rows['run'][-3:] == ['commit', 'threads', 'CPU']
    assert rows['gpt'][-3:] == ['abcdef0+ / abcdef0', '1 / 2', 'AMD EPYC 7B13 (2 CPUs)']
    assert rows['gpt_seed2'][-3:] == ['-', '-', '-']
    # and under every table, the runs grouped by where they ran
    where = p.stdout.split('Where they ran')[1].split('\n\n')[1].splitlines()
    assert where == [
        '- commit abcdef0+ / abcdef0, 1 / 2 thread(s), AMD EPYC 7B13 (2 CPUs), AVX2: gpt',
        '- commit, threads and CPU not recorded (the run predates it); device cpu: gpt_seed2']
    # runs that all predate it still say so, with the device their logs name
    where = run_report(gpt[1], gpt[2]).stdout.split('Where they ran')[1].split('\n\n')[1]
    assert where == ('- commit, threads and CPU not recorded (the run predates it); device cpu: '
                     'gpt_seed2, gpt_seed3')


def small_wikipedia(root):
    """A data_dir holding a 'wikipedia' dataset as prepare.py writes it (GPT-2 ids), 100,000
    training tokens: what a study script's floors.py call reads, in a second, without the corpus."""
    d = os.path.join(root, 'wikipedia')
    os.makedirs(d)
    rng = np.random.default_rng(0)
    for split, n in (('train', 100_000), ('val', 2_000)):
        rng.integers(0, 500, n, dtype=np.uint16).tofile(os.path.join(d, f'{split}.bin'))
    with open(os.path.join(d, 'meta.json'), 'w') as f:
        json.dump({'vocab_size': 50257, 'tokenizer': 'gpt2'}, f)
    return str(root)


def test_gpu_study_script_scales_the_schedule_and_resumes_a_cut_off_run(tmp_path):
    """experiments/gpu_author_regime.sh with `python` shimmed: no GPU needed, train.py faked (a
    finished run is the committed baseline's files; with FAIL set, a run cut off after a save),
    prepare.py faked (called when data/wikipedia is missing), floors.py real on a small corpus the
    first time (its floors go under the table), faked after."""
    shim = tmp_path / 'bin'
    shim.mkdir()
    done = os.path.join(ROOT, 'experiments', 'gpu_author_regime', 'baseline')
    data = small_wikipedia(tmp_path / 'data')
    (shim / 'python').write_text(f'''#!/usr/bin/env bash
if [ "$1" = -c ]; then echo "=== a GPU"; exit 0; fi  # the script's CUDA check
if [ "$1" = prepare.py ]; then echo "$*" >> {tmp_path}/prepared; exit 0; fi
if [ "$1" = experiments/floors.py ]; then
    echo "$*" >> {tmp_path}/floors
    [ -n "${{REAL_FLOORS:-}}" ] || exit 0
    exec {PY} "$@" --data_dir={data}
fi
if [ "$1" = train.py ]; then
    echo "$*" >> {tmp_path}/calls
    out=$(printf '%s\\n' "$@" | sed -n 's/^--out_dir=//p')
    mkdir -p "$out"
    if [ -n "${{FAIL:-}}" ]; then touch "$out/ckpt_last.pt"; exit 143; fi
    cp {done}/log.jsonl {done}/summary.json "$out"
    exit 0
fi
exec {PY} "$@"
''')
    (shim / 'python').chmod(0o755)
    env = dict(os.environ, PATH=f"{shim}:{os.environ['PATH']}", STEPS='400', WARMUP='300',
               RUNS=str(tmp_path / 'runs'), RES=str(tmp_path / 'res' / 'w300'))

    def script(**more):
        return subprocess.run(['bash', 'experiments/gpu_author_regime.sh', 'baseline'], cwd=ROOT,
                              env=dict(env, **more), capture_output=True, text=True, timeout=120)

    p = script(FAIL='1', REAL_FLOORS='1')
    assert p.returncode != 0 and '=== baseline failed' in p.stdout, p.stdout + p.stderr
    res = tmp_path / 'res' / 'w300'
    # the count-model floors of all of train.bin, at the runs' context, where report() reads them
    assert (tmp_path / 'floors').read_text() == (
        f'experiments/floors.py --context_size=200 --json={res}_floors.json\n')
    assert json.load(open(f'{res}_floors.json'))['context_size'] == 200
    # the default corpus is prepared when it is not there (and only then)
    assert os.path.exists(tmp_path / 'prepared') != os.path.exists(
        os.path.join(ROOT, 'data', 'wikipedia', 'train.bin'))
    p = script()
    assert p.returncode == 0, p.stdout + p.stderr
    calls = (tmp_path / 'calls').read_text().splitlines()
    out = tmp_path / 'runs' / 'w300' / 'baseline'  # each RES's runs in a folder of their own
    # the author's 300 warm-up steps as asked, lr_decay_iters 700,000 of 9,000 steps scaled to 400
    args = (f'train.py config/baseline.py --train_steps=400 --warmup_iters=300 '
            f'--lr_decay_iters=31111 --est_interval=20 --log_interval=20 --out_dir={out}')
    assert calls == [args + ' --overwrite=True', args + ' --init_from=resume']
    assert (res / 'baseline' / 'summary.json').read_text() == open(f'{done}/summary.json').read()
    table = (tmp_path / 'res' / 'w300.md').read_text()
    assert '| baseline |' in table and 'Count-model floors (experiments/floors.py)' in table
    p = script()  # a finished run is skipped
    assert '=== baseline: finished' in p.stdout
    assert len((tmp_path / 'calls').read_text().splitlines()) == 2
    # without WARMUP, the author's 300 of 9,000 steps scaled: 220 steps -> 7, as in the runs above
    p = script(STEPS='220', WARMUP='', RES=str(tmp_path / 'res220'))
    assert p.returncode == 0, p.stdout + p.stderr
    assert '--warmup_iters=7 --lr_decay_iters=17111' in (tmp_path / 'calls').read_text()


def gpu_script_env(tmp_path, trainer, more=''):
    """An env whose `python` fakes a GPU: `python -c` (the GPU check) prints a name, `python
    TRAINER ... --out_dir=D` logs its arguments to tmp_path/calls and copies a finished run into D,
    the lines `more` handle what they match, and anything else runs."""
    shim = tmp_path / 'bin'
    shim.mkdir()
    done = os.path.join(ROOT, 'experiments', 'gpu_author_regime', 'baseline')
    (shim / 'python').write_text(f'''#!/usr/bin/env bash
if [ "$1" = -c ]; then echo "=== a GPU"; exit 0; fi
# the data and its floors: gpu_author_regime.sh's own test runs them
case "$1" in prepare.py|experiments/floors.py) exit 0 ;; esac
{more}if [ "$1" = {trainer} ]; then
    echo "$*" >> {tmp_path}/calls
    out=$(printf '%s\\n' "$@" | sed -n 's/^--out_dir=//p')
    mkdir -p "$out" && cp {done}/log.jsonl {done}/summary.json "$out" && exit 0
fi
exec {PY} "$@"
''')
    (shim / 'python').chmod(0o755)
    return dict(os.environ, PATH=f"{shim}:{os.environ['PATH']}", OUT=str(tmp_path / 'out'))


def test_gpu_step_script_trains_each_model_with_its_fastest_passing_variant(tmp_path):
    """experiments/gpu_step.sh with `python` shimmed (bench.py and train.py faked): the fastest
    variant whose gradients passed, a .backward() one as train.py's default mode, goes to train.py
    as --compile_mode and --micro_batch (of the 800 sequences); a WRONG or failed one never."""
    rows = [dict(model='gpt', micro_batches=16, mode='default', accumulation='backward',
                 ms_per_step=469, grad_ok=True),
            dict(model='gpt', micro_batches=16, mode='reduce-overhead', accumulation='grad',
                 ms_per_step=176, grad_ok=True),
            dict(model='gpt', micro_batches=4, mode='reduce-overhead', accumulation='grad',
                 ms_per_step=140, grad_ok=False),
            dict(model='aed', micro_batches=16, mode='default', accumulation='backward',
                 ms_per_step=713, grad_ok=True),
            dict(model='aed', error='OutOfMemoryError')]
    (tmp_path / 'bench.json').write_text(json.dumps({'step': rows}))
    env = gpu_script_env(tmp_path, 'train.py', more=f'''if [ "$1" = bench.py ]; then
    cp {tmp_path}/bench.json "$(printf '%s\\n' "$@" | sed -n 's/^--out_json=//p')"; exit 0
fi
''')
    env['RUNS'] = str(tmp_path / 'runs')  # train.py's out_dirs: not in the repository
    p = subprocess.run(['bash', 'experiments/gpu_step.sh'], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    calls = (tmp_path / 'calls').read_text().splitlines()
    assert [c.split()[1] for c in calls] == ['config/baseline.py', 'config/aed_mse_possub.py']
    assert calls[0].endswith('--compile_mode=reduce-overhead --micro_batch=50 --overwrite=True')
    assert calls[1].endswith('--compile_mode=default --micro_batch=50 --overwrite=True')
    assert '| baseline |' in (tmp_path / 'out' / '30steps.md').read_text()
    assert (tmp_path / 'runs' / '30steps' / 'baseline' / 'summary.json').is_file()


def test_gpu_train_step_script_runs_each_probe_on_its_config_and_data(tmp_path):
    """experiments/gpu_train_step.sh with `python` shimmed (the probe faked, its runs copied from a
    finished one): each run name goes to its config, probe way and dataset, random ids are written
    as many as the text's, and the table lists the runs that finished. An unknown run, or no GPU:
    one line."""
    data = tmp_path / 'data'  # the text's bins, as prepare.py writes them (not the repo's)
    os.makedirs(data / 'wikipedia')
    np.arange(3000, dtype=np.uint16).tofile(data / 'wikipedia' / 'train.bin')
    np.arange(300, dtype=np.uint16).tofile(data / 'wikipedia' / 'val.bin')
    (data / 'wikipedia' / 'meta.json').write_text('{"vocab_size": 50257}')
    ranks = f'if [ -n "${{RANK:-}}" ]; then echo "$RANK $WORLD_SIZE $2" >> {tmp_path}/ranks; fi\n'
    env = dict(gpu_script_env(tmp_path, 'experiments/gpu_probe.py', more=ranks), DATA=str(data),
               RUNS=str(tmp_path / 'runs'))
    p = subprocess.run(['bash', 'experiments/gpu_train_step.sh', 'gpt_random', 'aed_aten',
                        'gpt_profile', 'aed_pad64', 'gpt_nocudnn', 'aed_rank', 'aed_shapepad',
                        'gpt_fused'],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    calls = [c.split() for c in (tmp_path / 'calls').read_text().splitlines()]
    assert [(c[1], c[5], c[7], c[-1]) for c in calls] == [
        ('inductor', 'config/baseline.py', '--dataset=random_ids', '--overwrite=True'),
        ('aten', 'config/aed_mse_possub.py', '--dataset=wikipedia', '--overwrite=True'),
        ('profile', 'config/baseline.py', '--dataset=wikipedia', '--overwrite=True'),
        ('inductor', 'config/aed_mse_possub.py', '--dataset=wikipedia', '--vocab_pad_multiple=64'),
        ('nocudnn', 'config/baseline.py', '--dataset=wikipedia', '--overwrite=True'),
        ('profile', 'config/aed_mse_possub.py', '--dataset=wikipedia',
         '--gradient_accumulation_steps=2'),
        ('shapepad', 'config/aed_mse_possub.py', '--dataset=wikipedia', '--overwrite=True'),
        ('fused', 'config/baseline.py', '--dataset=wikipedia', '--overwrite=True')]
    # the rank run alone as one rank of a DDP run (the one GPU's share of the card's command)
    assert (tmp_path / 'ranks').read_text() == '0 1 profile\n'
    assert calls[2][2] == f"{tmp_path}/out/gpt_profile/profile.json"
    assert [c[6] for c in calls] == [f'--data_dir={data}'] * 8
    assert (os.path.getsize(data / 'random_ids' / 'train.bin') == 6000
            and (tmp_path / 'runs' / 'train_step' / 'gpt_random' / 'summary.json').is_file())
    table = (tmp_path / 'out.md').read_text()
    assert all(f'| {r} |' in table for r in ('gpt_random', 'aed_aten', 'aed_pad64')), table
    p = subprocess.run(['bash', 'experiments/gpu_train_step.sh', 'gpt_fast'], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and 'unknown run gpt_fast' in p.stderr
    if not torch.cuda.is_available():  # the real python here: no GPU, said in one line
        env = dict(os.environ, OUT=str(tmp_path / 'nogpu'))
        p = subprocess.run(['bash', 'experiments/gpu_train_step.sh', 'gpt_inductor'], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 1 and p.stdout + p.stderr == 'error: no CUDA GPU here\n'


def test_gpu_probe_aten_way_keeps_the_gradients_without_atomics(tmp_path, monkeypatch):
    """experiments/gpu_probe.py aten: the embedding, compiled, runs ATen's backward (no atomic adds
    in Inductor's code) and gives the gradients eager mode gives. Wrong arguments: one line.
    The probe runs in this process (run_here), its changes to torch undone after."""
    import torch._functorch.config
    import torch._inductor.config
    from torch._inductor.utils import run_and_get_code
    (tmp_path / 'train.py').write_text('''
import torch
from torch._inductor.utils import run_and_get_code
from model import ModelConfig, Transformer
torch.manual_seed(0)
m = Transformer(ModelConfig(arch="gpt", n_layer=1, n_embed=16, n_head=2, context_size=8,
                            vocab_size=50))
x = torch.randint(0, 50, (2, 8))
x[:, :4] = 3  # one id many times
def grads(mdl):
    m.zero_grad()
    mdl(x, x)[1].backward()
    return [p.grad.clone() for p in m.parameters()]
eager = grads(m)
compiled, code = run_and_get_code(lambda: grads(torch.compile(m)))
print("compiled", len(code) > 0, "atomics", any("atomic_add" in c for c in code))
print("equal", all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(compiled, eager)))
''')
    (tmp_path / 'plain').mkdir()
    (tmp_path / 'plain' / 'train.py').write_text('import sys, torch\nprint(sys.argv[1:], '
                                                 'torch.nn.Embedding.forward.__name__)\n')
    monkeypatch.setattr(sys, 'path', list(sys.path))  # the probe puts its folder first
    # two threads, as a GPU run's CPU side has: on one, Inductor's CPU code has no parallel loop and
    # so no atomic adds for the aten way to do without; no cached code: it would show no code
    threads, forward = torch.get_num_threads(), torch.nn.Embedding.forward
    torch.set_num_threads(2)
    try:
        torch._dynamo.reset()
        with torch._inductor.config.patch(fx_graph_cache=False), \
                torch._functorch.config.patch(enable_autograd_cache=False):
            monkeypatch.chdir(tmp_path)
            p = run_here('experiments/gpu_probe.py', 'aten', '--', 'train.py')
            torch.nn.Embedding.forward = forward  # the aten way's undone: torch's again
            assert p.returncode == 0, p.stderr
            assert p.stdout.split() == ['compiled', 'True', 'atomics', 'False', 'equal', 'True']
            # the inductor way is train.py as it is (the embedding as torch has it)
            monkeypatch.chdir(tmp_path / 'plain')
            p = run_here('experiments/gpu_probe.py', 'inductor', '--', 'train.py', '--x=1')
            assert (p.returncode, p.stdout) == (0, "['--x=1'] forward\n"), p.stderr
            # the probe's subject, compiled on the same two threads: Inductor's own code for the
            # embedding's backward adds with atomics
            torch._dynamo.reset()
            torch.manual_seed(0)
            wte = torch.nn.Embedding(50, 16)
            x = torch.randint(0, 50, (2, 8))
            x[:, :4] = 3  # one id many times
            wte(x).pow(2).sum().backward()
            eager, wte.weight.grad = wte.weight.grad, None
            _, code = run_and_get_code(lambda: torch.compile(wte)(x).pow(2).sum().backward())
    finally:
        torch.nn.Embedding.forward = forward
        torch.set_num_threads(threads)
        torch._dynamo.reset()
    assert any('atomic_add' in c for c in code)
    assert torch.allclose(wte.weight.grad, eager, rtol=1e-5, atol=1e-7)
    # a way it does not know, no `--`, a profile without its JSON: one line, before train.py runs
    # (and before torch is imported: a process of its own)
    for args in (['pad64', '--', 'train.py'], ['aten', 'train.py'], ['profile', '--', 'train.py']):
        p = subprocess.run([PY, os.path.join(ROOT, 'experiments', 'gpu_probe.py'), *args],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert p.returncode == 1 and p.stderr.startswith('usage: ') and p.stdout == '', p.stderr
        assert len(p.stderr.splitlines()) == 1


def test_cpu_study_script_resumes_restarts_skips_and_scrubs_paths(tmp_path):
    """experiments/cpu_data_constrained.sh with `python` shimmed (train.py faked, report.py and
    prepare.py skipped, floors.py on a small corpus): a finished run in RES is skipped, one with a
    checkpoint resumes, one killed before its first checkpoint starts over, and the committed
    copies hold no absolute path and only the last step record."""
    shim, out, res = tmp_path / 'bin', tmp_path / 'out', tmp_path / 'res'
    shim.mkdir()
    data = small_wikipedia(tmp_path / 'data')
    (shim / 'python').write_text(f'''#!/usr/bin/env bash
case "$1" in
    -c) echo "3.11 torch 2"; exit 0 ;;  # the script's version line
    prepare.py|experiments/report.py) exit 0 ;;
    experiments/floors.py) exec {PY} "$@" --data_dir={data} ;;
    train.py) ;;
    *) exec {PY} "$@" ;;
esac
echo "$*" >> {tmp_path}/calls
dir=$(printf '%s\\n' "$@" | sed -n 's/^--out_dir=//p')
mkdir -p "$dir"
{{
    echo '{{"type": "start", "step": 0, "config": {{"out_dir": "'$dir'"}}}}'
    for s in 1 2 3; do echo '{{"type": "step", "step": '$s'}}'; done
    echo '{{"type": "est", "step": 3}}'
}} > "$dir/log.jsonl"
echo '{{"status": "finished", "config": {{"out_dir": "'$dir'"}}}}' > "$dir/summary.json"
echo "done: fake"
''')
    (shim / 'python').chmod(0o755)
    os.makedirs(res / 'baseline')
    (res / 'baseline' / 'summary.json').write_text('{"status": "finished"}')
    os.makedirs(out / 'aed_mse_possub')
    (out / 'aed_mse_possub' / 'ckpt_last.pt').write_text('')
    os.makedirs(out / 'baseline_seed2')
    (out / 'baseline_seed2' / 'log.jsonl').write_text('{"type": "start", "step": 0}\n')
    # all runs at once (JOBS): the tables are rewritten as runs end, not after each of 49 (the
    # byte study's test runs two at a time)
    p = subprocess.run(['bash', 'experiments/cpu_data_constrained.sh'], cwd=ROOT,
                       env=dict(os.environ, PATH=f"{shim}:{os.environ['PATH']}", OUT=str(out),
                                RES=str(res), JOBS='50'), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert '=== baseline: finished' in p.stdout
    # the floors of the runs' 100,000 training tokens, where report() reads them
    assert json.load(open(f'{res}_floors.json'))['train_tokens'] == 100_000
    assert '50 of 50 runs finished' in (tmp_path / 'res.md').read_text()
    calls = {c.split('--out_dir=')[1].split()[0].split('/')[-1]: c
             for c in (tmp_path / 'calls').read_text().splitlines()}
    assert len(calls) == 49 and 'baseline' not in calls  # all 50 runs but the finished one
    assert calls['aed_mse_possub'].endswith('--init_from=resume')
    assert calls['baseline_seed2'].endswith('--overwrite=True')
    assert sum('--init_from' in c or '--overwrite' in c for c in calls.values()) == 2
    assert calls['aed_deep_seed3'].startswith(
        'train.py config/cpu_aed_deep.py --train_tokens=100000 --train_steps=2000 '
        '--lr_decay_iters=2000 ')
    assert '--lr_decay_iters=700000 --seed=2 ' in calls['baseline_flat_seed2']  # after 2000: wins
    for name in calls:
        for f in ('summary.json', 'log.jsonl'):
            text = (res / name / f).read_text()
            assert str(tmp_path) not in text and f'"out-cpu-dc/{name}"' in text, (name, f, text)
        steps = [line for line in (res / name / 'log.jsonl').read_text().splitlines()
                 if '"step", "step"' in line]
        assert steps == ['{"type": "step", "step": 3}']


def test_byte_study_script_picks_the_dropout_at_the_pilot_seed(tmp_path):
    """experiments/cpu_bytes.sh with `python` shimmed (train.py faked: a run's best whole-val is
    1.5 but 1.4 for the GPT at dropout 0.2): the pilot first, the dropout arm at the better rate
    of seed 0, every study run at its seed; rerun, everything is skipped."""
    shim, out = tmp_path / 'bin', tmp_path / 'out'
    shim.mkdir()
    (shim / 'python').write_text(f'''#!/usr/bin/env bash
case "$1" in
    prepare.py|experiments/floors.py|experiments/report.py) exit 0 ;;
    train.py) ;;
    # the script's own python -c lines (the dropout rate, 57 a run) read JSON: the standard library
    # is enough, and without site's start-up (-S) each is a third of the time
    -c) exec {PY} -S "$@" ;;
    *) exec {PY} "$@" ;;
esac
echo "$*" >> {tmp_path}/calls
dir=$(printf '%s\\n' "$@" | sed -n 's/^--out_dir=//p')
mkdir -p "$dir"
best=1.5; case "$*" in *dropout_rate=0.2*seed=0*) best=1.4 ;; esac
printf '%s\\n' '{{"type": "start", "step": 0}}' '{{"type": "step", "step": 1}}' > "$dir/log.jsonl"
echo '{{"status": "finished", "whole_val_best": '$best'}}' > "$dir/summary.json"
''')
    (shim / 'python').chmod(0o755)
    env = dict(os.environ, PATH=f"{shim}:{os.environ['PATH']}", OUT=str(out),
               PILOT=str(tmp_path / 'pilot'), STUDY=str(tmp_path / 'study'))
    p = subprocess.run(['bash', 'experiments/cpu_bytes.sh'], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    calls = [c.split('--out_dir=')[1].split('/')[-1] + ' ' + c.split('--out_dir=')[0]
             for c in (tmp_path / 'calls').read_text().splitlines()]
    assert len(calls) == 24 and len(set(calls)) == 24
    first = [c.split()[0] for c in calls[:4]]
    assert sorted(first) == ['baseline_1m', 'baseline_500k', 'baseline_dropout01',
                             'baseline_dropout02']
    study = {c.split()[0]: c for c in calls[4:]}
    assert study['baseline_dropout_seed4'].endswith(
        'config/bytes_baseline.py --dropout_rate=0.2 --seed=4 ')
    assert study['aed_mse_possub'].endswith('config/bytes_aed_mse_possub.py --seed=1337 ')
    assert study['aed_mse_possub_dropout_seed5'].endswith('--dropout_rate=0.2 --seed=5 ')
    assert all((tmp_path / 'study' / n / 'summary.json').is_file() for n in study)
    p = subprocess.run(['bash', 'experiments/cpu_bytes.sh'], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.count('skipped') == 24, p.stdout + p.stderr


def test_overfit_study_script_gates_on_its_pilots(tmp_path):
    """experiments/cpu_bytes_overfit.sh with `python` shimmed (train.py faked: each slice's pilot
    has its best estimate and whole-val scores as given): the 700,000-byte pilot that turns up too
    late or too little sends the script to the 500,000-byte one; the pair runs, at every seed, on
    the slice whose pilot passed, and only then. Neither passing: no pair, exit 1."""
    shim = tmp_path / 'bin'
    shim.mkdir()
    (shim / 'python').write_text(f'''#!/usr/bin/env bash
case "$1" in
    prepare.py|experiments/report.py|experiments/paired.py) exit 0 ;;
    train.py) ;;
    *) exec {PY} "$@" ;;
esac
echo "$*" >> "$CALLS"
dir=$(printf '%s\\n' "$@" | sed -n 's/^--out_dir=//p')
mkdir -p "$dir"
# the pilots, by slice: the step of the lowest val estimate, whole val at the end and the best
case "$*" in
    *train_tokens=700000*seed=0*) best=$BEST700 ;;
    *train_tokens=500000*seed=0*) best=$BEST500 ;;
    *) best="2000 1.5 1.5" ;;
esac
set -- $best
{{
    printf '%s\n' '{{"type": "start", "step": 0}}' '{{"type": "step", "step": 5600}}'
    for s in 0 1000 2000 3000 3800 4000 4800 5000 5600; do
        v=2; [ $s = $1 ] && v=1
        echo '{{"type": "est", "step": '$s', "val": '$v'}}'
    done
}} > "$dir/log.jsonl"
echo '{{"status": "finished", "train_steps": 5600, "whole_val_last": '$2',' \\
    '"whole_val_best": '$3'}}' > "$dir/summary.json"
''')
    (shim / 'python').chmod(0o755)

    def study(tag, best700, best500):
        env = dict(os.environ, PATH=f"{shim}:{os.environ['PATH']}", OUT=str(tmp_path / tag),
                   PILOT=str(tmp_path / tag / 'pilot'), STUDY=str(tmp_path / tag / 'study'),
                   CALLS=str(tmp_path / f'{tag}.calls'), BEST700=best700, BEST500=best500)
        p = subprocess.run(['bash', 'experiments/cpu_bytes_overfit.sh'], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
        return p, (tmp_path / f'{tag}.calls').read_text().splitlines()

    # 700k: best at 4,800 (too late) and +0.0088 (too little); 500k: best at 3,800, +0.043
    p, calls = study('a', '4800 1.4469 1.4381', '3800 1.5550 1.5121')
    assert p.returncode == 0, p.stdout + p.stderr
    assert 'the 700,000-byte pilot overfits: no (best estimate at step 4,800' in p.stdout
    assert 'the 500,000-byte pilot overfits: yes (best estimate at step 3,800' in p.stdout
    assert len(calls) == 22 and all('--train_tokens=500000' in c for c in calls[1:])
    assert sorted(c.split('--seed=')[1].split()[0] for c in calls[2:]) == sorted(
        ['1337', '2', '3', '4', '5', '6', '7', '8', '9', '10'] * 2)
    assert sum('bytes_aed_mse_possub' in c for c in calls) == 10
    # 700k passes: no adjustment, the pair on 700k
    p, calls = study('b', '3800 1.46 1.44', '3800 1.6 1.5')
    assert p.returncode == 0 and len(calls) == 21, p.stdout + p.stderr
    assert all('--train_tokens=700000' in c for c in calls)
    # best early enough but rising too little, in both: the script stops, no pair
    p, calls = study('c', '3000 1.445 1.44', '3000 1.505 1.50')
    assert p.returncode == 1 and 'neither pilot overfits' in p.stdout and len(calls) == 2


def test_stall_probe_measures_what_it_says():
    """experiments/stall.py: position's share is 1 for a state that only position sets, 0 for one
    that only the text sets; its embedding loss is the one the model trains on (dropout 0)."""
    import stall
    from model import ModelConfig, Transformer
    by_pos, by_text = torch.randn(1, 16, 8).expand(4, 16, 8), torch.randn(4, 1, 8).expand(4, 16, 8)
    assert stall.position_share(by_pos) == pytest.approx(1.0)
    assert stall.position_share(by_text) == pytest.approx(0.0, abs=1e-6)
    torch.manual_seed(0)
    c = dict(arch='aed', vocab_size=64, context_size=16, n_embed=32, n_layer=2, n_head=4,
             embedding_loss_type='MSE', embedding_ln_type='INIT', embedding_loss_coeff=8.0)
    m = Transformer(ModelConfig(**c))
    x, y = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    got = stall.probe(m, x, y)
    m.train()
    parts = m(x, y)[2]
    assert got['emb'] == pytest.approx(float(parts['emb']), rel=1e-5)
    assert got['ce'] == pytest.approx(float(parts['ce']), rel=1e-5)
    assert 0 < got['enc'] < 1 and 0 < got['out'] < 1
    p = run_here('experiments/stall.py', '--steps=0')
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1] == (
        'stall.py: error: --steps must be at least 1, got 0')


def test_gpu_probe_fused_way_is_the_loss_and_gradients_of_the_logits(tmp_path, monkeypatch):
    """experiments/gpu_probe.py fused: the training loss from the head in chunks of rows (7 rows of
    64 logits, a short last chunk) is model.py's loss, its gradients the same, in float64, for the
    GPT and the AED (its embedding loss too); with logits asked for, model.py's own forward."""
    (tmp_path / 'train.py').write_text('''
import torch
from model import ModelConfig, Transformer
torch.set_default_dtype(torch.float64)
for arch, kw in (("gpt", {}), ("aed", dict(embedding_loss_type="MSE", embedding_loss_coeff=8.0,
                                         sub_pos_embed_to_decoder="YES_NO_LN"))):
    torch.manual_seed(0)
    m = Transformer(ModelConfig(arch=arch, n_layer=1, n_embed=16, n_head=2, context_size=8,
                                vocab_size=64, vocab_pad_multiple=80, **kw))
    x, y = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))
    def run(return_logits):
        m.zero_grad()
        logits, loss, parts = m(x, y, return_logits=return_logits)
        loss.backward()
        return logits, loss, [p.grad.clone() for p in m.parameters()], parts
    (logits, full, g_full, p_full), (none, fused, g_fused, p_fused) = run(True), run(False)
    ok = logits is not None and none is None and abs(full.item() - fused.item()) < 1e-12 and all(
        torch.allclose(a, b, rtol=0, atol=1e-12) for a, b in zip(g_full, g_fused)) and \
        p_full.keys() == p_fused.keys() and all(abs(p_full[k] - p_fused[k]) < 1e-12 for k in p_full)
    print(arch, ok, 'emb' in p_fused)
''')
    import model
    monkeypatch.setenv('PROBE_LOSS_CHUNK', str(7 * 64))
    monkeypatch.setattr(sys, 'path', list(sys.path))  # the probe puts its folder first
    monkeypatch.chdir(tmp_path)
    # in this process: the probe's forward and train.py's dtype are undone after
    forward, dtype = model.Transformer.forward, torch.get_default_dtype()
    try:
        p = run_here('experiments/gpu_probe.py', 'fused', '--', 'train.py')
    finally:
        model.Transformer.forward = forward
        torch.set_default_dtype(dtype)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split('\n')[:2] == ['gpt True False', 'aed True True'], p.stdout


def test_stall_rate_table_applies_the_declared_rule(tmp_path):
    """experiments/stall.py --rate: a run stalls at a val estimate >= 3.0 at step 400 (not at
    another step), by arm; the rate's exact 95% interval is Clopper-Pearson's."""
    sys.path.insert(0, os.path.join(ROOT, 'experiments'))
    import stall
    assert stall.binomial_interval(0, 40) == pytest.approx((0.0, 1 - 0.025 ** (1 / 40)))
    assert stall.binomial_interval(5, 20) == pytest.approx((0.0866, 0.4910), abs=1e-4)
    runs = {'aed_seed11': {200: 3.1, 400: 3.0}, 'aed_seed12': {200: 3.2, 400: 2.49},
            'aed_seed13': {400: 2.51}, 'gpt_seed11': {400: 2.41}, 'gpt_seed12': {200: 2.6}}
    for name, est in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / 'log.jsonl').write_text(''.join(
            json.dumps({'type': 'est', 'step': s, 'val': v}) + '\n' for s, v in est.items()))
    table = stall.rate_table(str(tmp_path), of=6)
    assert table.startswith('4 of 6 runs finished.')  # gpt_seed12 has no estimate at 400
    assert '| aed | 3 | 1 | 33.3% | [0.8%, 90.6%] | 2.490-2.510 |' in table
    assert '| gpt | 1 | 0 | 0.0% | [0.0%, 97.5%] | 2.410-2.410 |' in table
    assert 'Stalled: aed_seed11, val estimate 3.100 at step 200, 3.000 at step 400.' in table
    (tmp_path / 'gpt_seed11' / 'summary.json').write_text(json.dumps(dict(
        commit='4843a3e9', tree_changed=False, threads=1, cpu='Xeon', cpu_isa='AVX512',
        torch='2.13.0+cpu')))
    assert stall.rate_table(str(tmp_path)).endswith(
        '\nWhere they ran: commit 4843a3e, 1 thread(s), Xeon (AVX512), torch 2.13.0+cpu.')
