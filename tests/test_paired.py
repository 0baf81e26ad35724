"""experiments/paired.py, the overfitting study's declared analysis: equal train loss as declared,
the pairing by seed, the stall rule, the intervals over all seeds and the new ones alone."""
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, 'experiments'))
import paired  # noqa: E402


def test_val_at_train_loss_is_linear_in_step_where_train_first_falls_to_it():
    est = {0: (5.0, 5.0), 200: (3.0, 3.2), 400: (2.0, 2.6), 600: (2.5, 2.9), 800: (1.0, 2.7)}
    assert paired.val_at_train_loss(est, 2.5) == pytest.approx(2.9)  # halfway from 200 to 400
    assert paired.val_at_train_loss(est, 3.0) == pytest.approx(3.2)
    assert paired.val_at_train_loss(est, 0.5) is None  # never reached


def fake_run(d, est, whole_last, whole_best):
    d.mkdir()
    (d / 'summary.json').write_text(json.dumps(dict(
        status='finished', step=max(est), whole_val_last=whole_last, whole_val_best=whole_best)))
    (d / 'log.jsonl').write_text(''.join(json.dumps(dict(type='est', step=s, train=t, val=v))
                                         + '\n' for s, (t, v) in est.items()))


def test_the_table_pairs_by_seed_and_applies_the_stall_rule(tmp_path):
    gpt = {0: (5.5, 5.5), 400: (2.4, 2.4), 800: (1.0, 1.6)}
    for name, shift in (('baseline', 0.0), ('baseline_seed2', 0.1), ('baseline_seed6', 0.2)):
        fake_run(tmp_path / name, {s: (t, v + shift) for s, (t, v) in gpt.items()},
                 1.6 + shift, 1.5 + shift)
    # the AED ends at train 1.2: the GPT's is there 6/7 of the way from step 400 to 800
    fake_run(tmp_path / 'aed_mse_possub', {0: (5.5, 5.5), 400: (2.5, 2.5), 800: (1.2, 1.5)},
             1.55, 1.45)
    fake_run(tmp_path / 'aed_mse_possub_seed2', {0: (5.5, 5.5), 400: (3.1, 3.1), 800: (1.2, 1.8)},
             1.8, 1.8)
    fake_run(tmp_path / 'aed_mse_possub_seed6', {0: (5.5, 5.5), 400: (2.5, 2.5), 800: (1.2, 1.7)},
             1.7, 1.6)
    (tmp_path / 'aed_mse_possub_seed9').mkdir()  # an unfinished one: no pair
    p = subprocess.run([sys.executable, os.path.join(ROOT, 'experiments', 'paired.py'),
                        str(tmp_path), '--steps=400,800', '--new=6',
                        f'--svg={tmp_path / "d.svg"}'], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    rows = {r.split(' | ')[0]: r for r in p.stdout.splitlines()}
    # end, best, step 400, step 800, equal train loss (the GPT's val there: 2.4 - 6/7 * 0.8)
    assert rows['| 1337'] == ('| 1337 | -0.050 | -0.050 | +0.100 | -0.100 | -0.214 | no | no |')
    assert rows['| 2'] == ('| 2 | +0.100 | +0.200 | +0.600 | +0.100 | -0.014 | yes | no |')
    assert '| all 3 | end | 3 | -0.017 | [' in p.stdout and '| 2 of 3 |' in p.stdout
    assert '| new 1 | end | 1 | -0.100 | (one seed) | 1 of 1 |' in p.stdout
    ET.parse(tmp_path / 'd.svg')  # well-formed
