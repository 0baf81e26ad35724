"""
The overfitting study's declared analysis (experiments/README.md, Declared next): AED - GPT paired
by seed, on all of val.bin at the end and at the best checkpoint (primary), in the val estimate at
given steps and at equal train loss (secondary), the stall rule applied, over every seed and over
the new seeds alone, with 95% t-intervals; and a chart of the paired difference by step.

$ python experiments/paired.py experiments/bytes_overfit --new=6,7,8,9,10 \
      --svg=experiments/bytes_overfit_diff.svg

Runs: <dir>/baseline[_seed<n>] (the GPT) and <dir>/aed_mse_possub[_seed<n>] (the AED); no suffix
is seed 1337. Equal train loss: L is the AED's train estimate at its last step; the GPT's val at L
is its val estimate where its train estimate first falls to L, linear in step between the two
estimates around it.
"""
import argparse
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import ci95, fmt_tick, nice_ticks, stats, wrap, write_atomic  # noqa: E402
from stall import STALL, STALL_STEP  # noqa: E402

GPT, AED = 'baseline', 'aed_mse_possub'


def read(run):
    """A finished run's committed logs: {'est': {step: (train, val)}, 'whole_last', ...}."""
    s = json.load(open(os.path.join(run, 'summary.json')))
    est = {}
    for line in open(os.path.join(run, 'log.jsonl')):
        r = json.loads(line)
        if r['type'] == 'est':  # a resumed run's later record of a step supersedes the earlier
            est[r['step']] = (r['train'], r['val'])
    return dict(est=est, whole_last=s['whole_val_last'], whole_best=s['whole_val_best'],
                finished=s['status'] == 'finished', last=s['step'])


def val_at_train_loss(est, target):
    """The val estimate where the train estimate first falls to target, linear in step between
    the estimates around it; None if it never does."""
    steps = sorted(est)
    for a, b in zip(steps, steps[1:]):
        (ta, va), (tb, vb) = est[a], est[b]
        if tb <= target < ta:
            return va + (ta - target) / (ta - tb) * (vb - va)
    return None


def pairs(folder):
    """{seed: (gpt, aed)} of the seeds whose two runs have finished."""
    out = {}
    for path in sorted(glob.glob(os.path.join(folder, GPT + '*'))):
        m = re.fullmatch(GPT + r'(?:_seed(\d+))?', os.path.basename(path))
        aed = os.path.join(folder, AED + os.path.basename(path)[len(GPT):])
        if not m or not os.path.isdir(aed):
            continue
        gpt, aed = read(path), read(aed)
        if gpt['finished'] and aed['finished']:
            out[int(m[1] or 1337)] = (gpt, aed)
    return out


def differences(gpt, aed, steps):
    """AED - GPT of one seed: {measure: difference or None}."""
    last = aed['last']
    d = {'end': aed['whole_last'] - gpt['whole_last'],
         'best': aed['whole_best'] - gpt['whole_best']}
    for s in steps:
        d[f'step {s:,}'] = aed['est'][s][1] - gpt['est'][s][1] if s in aed['est'] else None
    gpt_val = val_at_train_loss(gpt['est'], aed['est'][last][0])
    d['equal train loss'] = None if gpt_val is None else aed['est'][last][1] - gpt_val
    return d


def summary_rows(seeds, diffs, label):
    rows = []
    for measure in diffs[seeds[0]]:
        vals = [diffs[s][measure] for s in seeds if diffs[s][measure] is not None]
        if not vals:
            continue
        mean = stats(vals)[0]
        ci = ci95(vals) if len(vals) > 1 else "(one seed)"
        lower = sum(v < 0 for v in vals)
        rows.append(f"| {label} | {measure} | {len(vals)} | {mean:+.3f} | {ci} | {lower} of "
                    f"{len(vals)} |")
    return rows


def chart(by_seed, title):
    """SVG: the mean over seeds of AED - GPT in the val estimate at each step, its 95% t band, and
    the whole-val difference at the end (a dot)."""
    steps = sorted(set.intersection(*(set(a['est']) & set(g['est']) for g, a in by_seed.values())))
    points = []
    for s in steps:
        d = [a['est'][s][1] - g['est'][s][1] for g, a in by_seed.values()]
        mean = stats(d)[0]
        lo, hi = (map(float, ci95(d).strip('[]').split(', ')) if len(d) > 1 else (mean, mean))
        points.append((s, mean, lo, hi))
    points = [p for p in points if p[0] >= 400]  # the first estimates' differences dwarf the rest
    end = [a['whole_last'] - g['whole_last'] for g, a in by_seed.values()]
    W, H, left, right, top, bottom = 760, 400, 70, 20, 40, 50
    pw, ph = W - left - right, H - top - bottom
    xmax = max(p[0] for p in points)
    yticks, ystep = nice_ticks(min(min(p[2] for p in points), min(end), 0.0),
                               max(max(p[3] for p in points), max(end), 0.0))
    y0, y1 = yticks[0], yticks[-1]
    xticks, xstep = nice_ticks(0, xmax)
    X = lambda s: left + pw * s / xmax  # noqa: E731
    Y = lambda v: top + ph * (y1 - v) / (y1 - y0)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="12">', f'<rect width="{W}" height="{H}" '
           f'fill="white"/>', f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="14">'
           f'{title}</text>']
    for t in yticks:
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{Y(t):.1f}" y2="{Y(t):.1f}" '
                   f'stroke="{"#000" if t == 0 else "#ddd"}"/><text x="{left - 6}" '
                   f'y="{Y(t) + 4:.1f}" text-anchor="end">{fmt_tick(t, ystep)}</text>')
    for t in xticks:
        out.append(f'<text x="{X(t):.1f}" y="{top + ph + 18}" text-anchor="middle">'
                   f'{fmt_tick(t, xstep)}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{H - 10}" text-anchor="middle">step</text>')
    band = [(X(s), Y(hi)) for s, _, _, hi in points] + [(X(s), Y(lo)) for s, _, lo, _ in
                                                          reversed(points)]
    out.append('<polygon fill="#4e79a7" fill-opacity="0.2" points="'
               + ' '.join(f'{x:.1f},{y:.1f}' for x, y in band) + '"/>')
    out.append('<polyline fill="none" stroke="#4e79a7" stroke-width="2" points="'
               + ' '.join(f'{X(s):.1f},{Y(m):.1f}' for s, m, _, _ in points) + '"/>')
    mean_end = stats(end)[0]
    out.append(f'<circle cx="{X(xmax):.1f}" cy="{Y(mean_end):.1f}" r="4" fill="#e15759"/>'
               f'<text x="{X(xmax) - 8:.1f}" y="{Y(mean_end) - 8:.1f}" text-anchor="end" '
               f'fill="#e15759">all of val.bin at the end: {mean_end:+.3f}</text>')
    out.append(f'<text x="{left + 8}" y="{top + 14}">AED - GPT, val estimate: mean over '
               f'{len(end)} seeds and its 95% t band (below 0: the AED is lower)</text></svg>')
    return '\n'.join(out) + '\n'


def main():
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument('folder')
    p.add_argument('--new', default='', help='the new seeds, comma-separated: also alone')
    p.add_argument('--steps', default='4000,4800,5600', help='the estimate steps compared')
    p.add_argument('--svg', help='write the chart of the paired difference by step here')
    args = p.parse_args()
    by_seed = pairs(args.folder)
    if not by_seed:
        sys.exit(f"error: no finished pair of {GPT}[_seed<n>] and {AED}[_seed<n>] in "
                 f"{args.folder}")
    steps = [int(s) for s in args.steps.split(',')]
    diffs = {seed: differences(g, a, steps) for seed, (g, a) in by_seed.items()}
    seeds = sorted(by_seed, key=lambda s: (s != 1337, s))  # the study's order: 1337, 2, 3, ...
    lines = ["AED - GPT by seed (negative: the AED is lower); whole val: all of val.bin; steps "
             "and equal train loss: the val estimate; stalled: the val estimate at step "
             f"{STALL_STEP} is {STALL} or more.", "",
             "| seed | " + " | ".join(diffs[seeds[0]]) + " | AED stalled | GPT stalled |",
             "|---|" + "---|" * (len(diffs[seeds[0]]) + 2)]
    for seed in seeds:
        g, a = by_seed[seed]
        cells = ["-" if v is None else f"{v:+.3f}" for v in diffs[seed].values()]
        stalled = ["yes" if r['est'].get(STALL_STEP, (0, 0))[1] >= STALL else "no" for r in (a, g)]
        lines.append(f"| {seed} | " + " | ".join(cells + stalled) + " |")
    lines += ["", "| seeds | measure | n | mean | 95% CI (t) | AED lower |",
              "|---|---|---|---|---|---|"]
    lines += summary_rows(seeds, diffs, f"all {len(seeds)}")
    new = [s for s in seeds if str(s) in args.new.split(',')]
    if new:
        lines += summary_rows(new, diffs, f"new {len(new)}")
    print(wrap('\n'.join(lines)))
    if args.svg:
        write_atomic(args.svg, chart(by_seed, f"AED - GPT by step, {len(seeds)} seeds"))


if __name__ == '__main__':
    main()
