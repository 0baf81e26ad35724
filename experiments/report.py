"""
Turn training run directories into the author's results table (markdown) and a chart of the
validation-loss curves (SVG, drawn by hand: no plotting library needed).

$ python experiments/report.py out-cpu-*
$ python experiments/report.py out-cpu-* --svg=experiments/results.svg --md=experiments/results.md

Options are --key=value after the run directories (python experiments/report.py --help lists them).

Each run directory is what train.py writes: log.jsonl (one JSON record per line: 'start' or
'resume', 'step', 'est', 'whole_val', 'stop') and summary.json. Train and val loss are the run's
last estimate (eval-mode cross-entropy, as the author reported them); best val is the lowest val
estimate and its step (an oracle early stop); whole val, the last and the best model's loss on all
of val.bin. The embedding loss is the unweighted training-batch embedding loss of the last step.
Runs that differ only in the seed are a group: the report gives each group's mean, sample standard
deviation and min-max of the final and of the best val loss; --compare, A - B paired by seed, with a
95% interval (A,B+C,D: both pairs' seed pairs pooled). Each run is given once, under a name (its
directory's) of its own: a repeat would count as more seeds. A key missing from a run's saved
config (the run predates it) means its default, read from train.py and model.py; a key train.py has
since dropped, held at the default it had (REMOVED_DEFAULTS), means what its absence does. Uses only
the standard library (numpy too with --floors).
"""
import ast
import json
import math
import os
import re
import statistics
import sys
import textwrap
from xml.sax.saxutils import escape

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
sys.path.insert(0, ROOT)  # for configurator.py, when run as python experiments/report.py
from configurator import ConfigError, die, load_config  # noqa: E402

# what the configs of one group's runs may differ in: the seed (it picks the members), and keys
# that say where a run was written, how it was watched or how long a rank waits, none of which
# changes a number (init_from neither: a resume is exact). Every other key counts, compile (the
# float order) and data_dir (the data) too; device and dtype as they resolved (config_key)
SEED_ONLY_KEYS = ('seed', 'out_dir', 'init_from', 'overwrite', 'wandb_log', 'wandb_project',
                  'wandb_run_name', 'log_interval', 'save_interval', 'ddp_timeout')
# keys train.py has had and dropped, with the default each had: a run that holds one at its default
# ran as a run without it does (a key train.py has now and a run lacks is its default, DEFAULTS)
REMOVED_DEFAULTS = {'embedding_agg_type': None}  # the learned aggregation (MEAN at None) went

# Tableau 10: distinct, readable on white, and still tellable apart by most colour-blind readers
COLORS = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f',
          '#edc948', '#b07aa1', '#ff9da7', '#9c755f', '#bab0ac']
DASHES = ['', '6,3', '2,2', '8,3,2,3']  # cycled once the colours run out


# options, parsed by configurator.py as train.py's keys are
OPTIONS = dict(
    svg='',       # write the chart here (val loss vs step, one line per run)
    md='',        # write the markdown table here (it is always printed)
    train=False,  # also draw the train-loss estimates, dashed
    ymin=None,    # fix the chart's loss axis (None: fit the curves, ignoring the step-0 estimate)
    ymax=None,    # (the same, at the top)
    title='',     # chart title ('' = a description of the curves)
    x='step',     # the chart's x axis: step, or epochs (passes over the training tokens)
    compare='',   # A,B: A - B paired by seed (A, B: a run, for its seed group); several: 'A,B;C,D';
                  # pooled into one sample: 'A,B+C,D'
    diag=False,   # also a table of the embedding loss's diagnostics (logged at every estimate)
    speed=False,  # also a table of each run's speed: median ms/step, tokens/s and MFU; peak memory
    floors='',    # a JSON of experiments/floors.py: the count-model floors under the table and
                  # on the chart
)


def parse_args(argv):
    # configurator would read these as config files
    dirs = [a for a in argv if not a.startswith('-')]
    try:
        opts = load_config(OPTIONS, [a for a in argv if a.startswith('-')], sources=[__file__])
    except ConfigError as e:
        die(e)
    for key in ('ymin', 'ymax'):
        if isinstance(opts[key], (bool, str)):  # a None default accepts these too
            die(f"--{key} must be a number, got '{opts[key]}'")
    if opts['x'] not in ('step', 'epochs'):
        die(f"--x must be step or epochs, got '{opts['x']}'")
    if opts['compare']:
        comps = [[p.split(',') for p in c.split('+')] for c in opts['compare'].split(';')]
        if not all(len(p) == 2 and all(p) for c in comps for p in c):
            die("--compare takes pairs of names, A,B or A,B;C,D (A,B+C,D: pooled); "
                f"got '{opts['compare']}'")
        opts['compare'] = comps
    if not dirs:
        die("no run directories given (usage: python experiments/report.py out-dir [out-dir ...] "
            "[--svg=PATH] [--md=PATH])")
    # a name stands for one run in the table, its seed group and --compare: a run given twice, or a
    # working copy beside its committed copy, would be counted as another seed or replace one
    paths, names = {}, {}
    for d in dirs:
        real, name = os.path.realpath(d), os.path.basename(os.path.normpath(d))
        if real in paths:
            die(f"{d}: given twice (as {paths[real]} too); give each run once")
        if name in names:
            die(f"two runs named '{name}' ({names[name]} and {d}); give one of them")
        paths[real] = names[name] = d
    return dirs, opts


# -----------------------------------------------------------------------------
# reading runs

def train_defaults():
    """train.py's keys and defaults, read from its source (importing train.py would train): its
    `key = literal` lines between its two `# ---` lines, then model.py's ModelConfig fields."""
    defaults = {}
    with open(os.path.join(ROOT, "train.py")) as f, open(os.path.join(ROOT, "model.py")) as g:
        src = f.read().split("\n# " + "-" * 77 + "\n")[1] + g.read().split("class ModelConfig:")[1]
    for m in re.finditer(r"^ *(\w+)(?:: [^=]+)? = (.+?)(?:  #.*)?$", src.split("\n\n    def")[0],
                         re.M):
        try:
            defaults.setdefault(m[1], ast.literal_eval(m[2]))
        except (ValueError, SyntaxError):
            pass  # not a literal: not a key
    return defaults


DEFAULTS = train_defaults()


def config_key(config, facts):
    # what the runs of one group agree on: the config, defaults filled in, without SEED_ONLY_KEYS;
    # None without a saved config (such a run is a group of its own)
    if not config:
        return None
    key = {k: v for k, v in {**DEFAULTS, **config}.items() if k not in SEED_ONLY_KEYS
           and not (k in REMOVED_DEFAULTS and k not in DEFAULTS and v == REMOVED_DEFAULTS[k])}
    for k in ('device', 'dtype'):  # 'auto' as it resolved; a GPU's index (cuda:0) changes nothing
        key[k] = str(facts.get(k) or key[k]).split(':')[0]
    return key


def read_log(path):
    # a resumed run appends to the log: a 'resume' record at step s means everything logged after
    # step s by the earlier process (steps it took after its last checkpoint) never happened
    records = []
    with open(path) as f:
        lines = f.read().splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines):
                break  # a run killed mid-write can leave a half line at the end
            raise ValueError(f"line {n} is not JSON") from None
        if rec.get('type') == 'resume':
            records = [r for r in records
                       if r['type'] in ('start', 'resume') or r['step'] <= rec['step']]
        records.append(rec)
    return records


def load_run(run_dir):
    if not os.path.isdir(run_dir):
        die(f"{run_dir}: no such run directory")
    log_path = os.path.join(run_dir, 'log.jsonl')
    if not os.path.isfile(log_path):
        die(f"{run_dir}: no log.jsonl (not a train.py run directory?)")
    try:
        records = read_log(log_path)
    except (ValueError, KeyError, TypeError) as e:
        die(f"{log_path}: cannot read it ({e})")
    summary = {}
    summary_path = os.path.join(run_dir, 'summary.json')
    if os.path.isfile(summary_path):
        try:
            with open(summary_path) as f:
                summary = json.load(f)
        except json.JSONDecodeError:
            die(f"{summary_path}: not valid JSON")
    starts = [r for r in records if r['type'] in ('start', 'resume')]
    steps = [r for r in records if r['type'] == 'step']
    ests = [r for r in records if r['type'] == 'est']
    if not starts or not ests:
        die(f"{log_path}: no loss estimate logged yet (the run has not reached its first estimate)")
    last = steps[-1] if steps else {}
    config = dict(summary.get('config') or starts[-1].get('config') or {})
    # all of val.bin at the end; the log's record only if no estimate came after it (a resume that
    # trains further drops it from summary.json)
    whole = summary if 'whole_val_last' in summary else next((
        r for r in records[::-1] if r['type'] == 'whole_val' and r['step'] >= ests[-1]['step']), {})

    def where(fmt):  # what a fact was in the run's processes (a resumed run may go on elsewhere)
        return ' / '.join(dict.fromkeys(fmt(s) for s in starts if 'threads' in s)) or None
    return {
        'name': os.path.basename(os.path.normpath(run_dir)), 'dir': run_dir,
        'config': config, 'key': config_key(config, summary or starts[-1]),
        'seed': config.get('seed'),
        'curve': [(r['step'], r['train'], r['val']) for r in ests],  # (step, train, val)
        'epochs_at': [r['epochs'] for r in ests],
        # the embedding loss's diagnostics
        'diag': [(r['step'], r['emb_diag']) for r in ests if r.get('emb_diag')],
        'train': ests[-1]['train'], 'val': ests[-1]['val'],
        'best_val': min(r['val'] for r in ests),
        'best_step': min(ests, key=lambda r: r['val'])['step'],
        'emb': last.get('emb'),
        'params': summary.get('params'), 'train_tokens': summary.get('train_tokens'),
        'step': ests[-1]['step'] if not steps else max(last['step'], ests[-1]['step']),
        'tokens': summary.get('tokens_seen', last.get('tokens', 0)),
        'epochs': summary.get('epochs', last.get('epochs')),
        'wall': summary.get('wall_time_s', max(last.get('time', 0), ests[-1].get('time', 0))),
        'status': summary.get('status', 'no summary.json'),
        # the first step pays for compiling and warm-up
        'timed': [r for r in steps if r['step'] >= 2 and 'ms' in r],
        'hardware': summary.get('gpu') or summary.get('device') or '?',
        'dtype': summary.get('dtype', '?'),
        'compiled': summary.get('compiled'), 'peak_mib': summary.get('peak_gpu_memory_mib'),
        'whole_last': whole.get('whole_val_last'), 'whole_best': whole.get('whole_val_best'),
        'whole_tokens': whole.get('whole_val_tokens'),
        'commit': where(lambda s: (s.get('commit') or '?')[:7] + '+' * bool(s.get('tree_changed'))),
        'threads': where(lambda s: str(s['threads'])),
        'cpu': where(lambda s: f"{s.get('cpu') or '?'} ({s.get('cpu_count') or '?'} CPUs)"),
        'isa': where(lambda s: s.get('cpu_isa') or '?'),
    }


# -----------------------------------------------------------------------------
# the table

def fmt_tokens(n):
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n:,}"


def fmt_wall(s):
    return f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s"


def table(runs):
    whole = any(r['whole_last'] is not None for r in runs)  # the columns once a run has them
    lines = ["| run | train loss | val loss | best val (step) | embedding loss | params | seed "
             "| steps | epochs | tokens | wall time |"
             + (" whole val (last) | whole val (best) |" if whole else ""),
             "|---" * (11 + 2 * whole) + "|"]
    for r in runs:
        name = r['name'] if r['status'] == 'finished' else f"{r['name']} ({r['status']})"
        emb = f"{r['emb']:.3e}" if r['emb'] is not None else "N/A"
        params = f"{r['params']:,}" if r['params'] is not None else "?"
        seed = str(r['seed']) if r['seed'] is not None else "?"
        epochs = f"{r['epochs']:.2f}" if r['epochs'] is not None else "?"
        more = f" {fmt_loss(r['whole_last'])} | {fmt_loss(r['whole_best'])} |" if whole else ""
        lines.append(f"| {name} | {r['train']:.3f} | {r['val']:.3f} | "
                     f"{r['best_val']:.3f} ({r['best_step']:,}) | "
                     f"{emb} | {params} | {seed} | {r['step']:,} | {epochs} | "
                     f"{fmt_tokens(r['tokens'])} | "
                     f"{fmt_wall(r['wall'])} |" + more)
    lines += ["", "Best val is the lowest val estimate: an oracle early stop, picked on the "
                  "batches it is measured on."]
    if whole:
        n = ', '.join(f"{t:,}" for t in sorted({r['whole_tokens'] or 0 for r in runs} - {0}))
        lines[-1] += (" Whole val: the last model's and the best estimate's loss on all of val.bin "
                      f"({n} tokens, the same for every seed)")
        old = any(r['whole_last'] is None for r in runs)
        lines[-1] += "; '-': the run predates it." if old else "."
    return lines


def read_floors(path, runs):
    # experiments/floors.py's JSON, with where the runs stand against the floors: the whole-val
    # loss of each run's best model (what an early stop would keep) against the lowest floor and,
    # where the JSON has modified Kneser-Ney, each group's between which two floors
    from floors import floors_line
    try:
        with open(path) as f:
            r = json.load(f)
    except (OSError, ValueError) as e:
        die(f"--floors: cannot read {path} ({getattr(e, 'strerror', None) or e})")
    r['named'] = named_floors(r)
    lowest = min(r['named'].values())
    scored = [x for x in runs if x['whole_best'] is not None]
    other = [x['name'] for x in scored if x['train_tokens'] not in (None, r['train_tokens'])]
    scored = [x for x in scored if x['name'] not in other]
    if scored:
        below = sum(x['whole_best'] < lowest for x in scored)
        r['line'] = (f"{floors_line(r)} Runs whose best model is below the lowest floor on all of "
                     f"val.bin: {below} of {len(scored)}"
                     + (f" (not counted, trained on another slice: {', '.join(other)})." if other
                        else "."))
        if 'floors_mkn' in r:
            r['line'] += " Where the best models stand: " + "; ".join(
                stand(name, [x['whole_best'] for x in group], r['named'])
                for name, group in groups_of(scored).items()) + "."
    else:
        r['line'] = floors_line(r)
    return r


def named_floors(r):
    # {name: loss}: every order of interpolated Kneser-Ney, and modified Kneser-Ney's top order
    named = {f"{n}-gram": v for n, v in r['floors'].items()}
    if 'floors_mkn' in r:
        n, v = list(r['floors_mkn'].items())[-1]
        named[f"modified KN {n}-gram"] = v
    return named


def stand(name, losses, named):
    # a group's losses against the floors: below the lowest floor above them all, above the
    # highest below them all, and how many are below each floor inside their range
    lo, hi, n = min(losses), max(losses), len(losses)
    over = [k for k in named if named[k] > hi]
    under = [k for k in named if named[k] < lo]
    parts = [f"below the {min(over, key=named.get)}"] if over else []
    parts += [f"{sum(x < named[k] for x in losses)} of {n} below the {k}"
              for k in sorted(named, key=named.get, reverse=True) if lo <= named[k] <= hi]
    parts += [f"above the {max(under, key=named.get)}"] if under else []
    span = f"{n} runs, {lo:.3f}-{hi:.3f}" if n > 1 else f"{lo:.3f}"
    return f"{name} ({span}) " + ", ".join(parts)


def where_lines(runs):
    """The runs grouped by where they ran: commit, torch threads, CPU (and GPU); of a run from
    before train.py recorded these, the device its log names."""
    groups = {}
    for r in runs:
        gpu = f", {r['hardware']}" if r['hardware'] not in ('cpu', '?') else ""
        where = ("commit, threads and CPU not recorded (the run predates it); "
                 f"device {r['hardware']}")
        if r['threads']:
            where = (f"commit {r['commit']}, {r['threads']} thread(s), {r['cpu']}, "
                     f"{r['isa']}{gpu}")
        groups.setdefault(where, []).append(r['name'])
    return [f"- {where}: {', '.join(names)}" for where, names in groups.items()]


def fmt_loss(v):
    return f"{v:.3f}" if v is not None else "-"


def speed_table(runs):
    where = any(r['threads'] for r in runs)  # where it ran, once a run records it
    head = ("run | hardware | dtype | compiled | steps timed | ms/step | tokens/s | MFU | "
            "peak GPU memory" + (" | commit | threads | CPU" if where else ""))
    lines = [f"| {head} |", "|---" * (head.count('|') + 1) + "|"]
    for r in runs:
        t = r['timed']

        def median(key):
            return statistics.median(x[key] for x in t)
        ms_tok = f"{median('ms'):,.0f} | {median('tok_s'):,.0f}" if t else "N/A | N/A"
        mfu = (f"{100 * median('mfu'):.1f}%" if t and all(x.get('mfu') is not None for x in t)
               else "N/A")
        peak = f"{r['peak_mib']:,} MiB" if r['peak_mib'] is not None else "N/A"
        more = "".join(f" {r[k] or '-'} |" for k in ('commit', 'threads', 'cpu') if where)
        lines.append(f"| {r['name']} | {r['hardware']} | {r['dtype']} | "
                     f"{'yes' if r['compiled'] else 'no'} | {len(t)} | "
                     f"{ms_tok} | {mfu} | {peak} |" + more)
    return lines


def groups_of(runs):
    # {name: [runs]}: runs with equal config_keys, in any order given. In name order, a run joins
    # the first group of its config that lacks its seed: a second run at a seed (a re-run) starts a
    # group of its own; a group is named after its first run by name. Groups are listed in the order
    # their runs are given, a group's runs by name.
    groups = []
    for r in sorted(runs, key=lambda r: (r['name'], r['dir'])):
        for group in groups:
            if (r['key'] is not None and group[0]['key'] == r['key']
                    and r['seed'] not in {g['seed'] for g in group}):
                group.append(r)
                break
        else:
            groups.append([r])
    order = {id(r): i for i, r in enumerate(runs)}
    return {g[0]['name']: g for g in sorted(groups, key=lambda g: min(order[id(r)] for r in g))}


def stats(values):
    # mean, sample standard deviation (n - 1), min, max
    n, mean = len(values), sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, std, min(values), max(values)


# Student's t: its 0.975 quantiles for 1-30 degrees of freedom (as any statistics table has them);
# past 30 the first terms of its expansion around the normal's 1.96, within 1e-4 of the exact value
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042)


def t975(df):
    if df <= len(T975):
        return T975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def ci95(values):
    # the 95% confidence interval of the mean of n >= 2 values: mean ± t(0.975, n-1) * sd / sqrt(n)
    mean, std, _, _ = stats(values)
    half = t975(len(values) - 1) * std / math.sqrt(len(values))
    return f"[{mean - half:+.3f}, {mean + half:+.3f}]"


def fmt_stats(values, signed=False):
    mean, std, lo, hi = stats(values)
    f = '+.3f' if signed else '.3f'
    if len(values) == 1:
        return f"{mean:{f}} (one seed: no spread yet)"
    return f"{mean:{f}} ± {std:.3f} (min {lo:{f}}, max {hi:{f}})"


def seed_groups(runs):
    # the seed noise: mean, std and min-max of the runs that differ only in the seed
    lines = []
    for name, group in groups_of(runs).items():
        if len({r['seed'] for r in group}) < 2:
            continue
        lines.append(f"- {name}: {len(group)} seeds ({', '.join(str(r['seed']) for r in group)}): "
                     f"final val {fmt_stats([r['val'] for r in group])}; "
                     f"best val {fmt_stats([r['best_val'] for r in group])}")
        if all(r['whole_last'] is not None for r in group):
            lines[-1] += (f"; whole val, last {fmt_stats([r['whole_last'] for r in group])}, "
                          f"best {fmt_stats([r['whole_best'] for r in group])}")
    return lines


def compare(runs, pairs):
    # A - B, paired by seed: with one seed, two configs see the same training and estimate batches.
    # A and B: a run, standing for its group. Several pairs: their seed pairs pooled into one
    # sample, which needs pairs that share no run
    groups = groups_of(runs)
    group_of = {r['name']: group for group in groups.values() for r in group}
    matched = []
    for a, b in pairs:
        for name in (a, b):
            if name not in group_of:
                die(f"--compare: no run or group named '{name}' "
                    f"(groups: {', '.join(groups)})")
        by_seed = [{r['seed']: r for r in group_of[name]} for name in (a, b)]
        seeds = [s for s in by_seed[0] if s in by_seed[1]]
        if not seeds:
            die(f"--compare: {a} and {b} have no seed in common")
        matched += [(by_seed[0][s], by_seed[1][s]) for s in seeds]
    used = [r['name'] for pair in matched for r in pair]
    if len(pairs) > 1 and len(set(used)) < len(used):
        shared = next(n for n in used if used.count(n) > 1)
        die(f"--compare: pooled pairs share the run {shared} (pool pairs with no run in common)")
    a, b = pairs[0]
    if len(pairs) == 1:
        seeds = ', '.join(str(x['seed']) for x, _ in matched)
        head, first = f"{a} - {b}, paired by seed ({seeds})", a
    else:
        head = f"{' and '.join(f'{a} - {b}' for a, b in pairs)}, pooled ({len(matched)} seed pairs)"
        first = "the first"
    final = [x['val'] - y['val'] for x, y in matched]
    best = [x['best_val'] - y['best_val'] for x, y in matched]
    lines = [f"- {head}: "
             f"final val {fmt_stats(final, signed=True)}; best val {fmt_stats(best, signed=True)}; "
             f"{first} lower in {sum(d < 0 for d in final)} of {len(final)} (final), "
             f"{sum(d < 0 for d in best)} of {len(best)} (best)"]
    if len(matched) > 1:
        lines.append(f"  - 95% CI of the mean (t, n={len(matched)}): final val {ci95(final)}, "
                     f"best val {ci95(best)}")
    # all of val.bin, where both runs of a pair were scored on the same tokens
    whole = [(x, y) for x, y in matched
             if x['whole_last'] is not None and y['whole_last'] is not None
             and x['whole_tokens'] == y['whole_tokens']]
    if whole:
        last, best = ([x[k] - y[k] for x, y in whole] for k in ('whole_last', 'whole_best'))
        n = len(whole)

        def cell(d):
            return fmt_stats(d, signed=True) + (f", 95% CI {ci95(d)}" if n > 1 else "")
        seeds = ', '.join(str(x['seed']) for x, _ in whole)
        which = f"paired by seed ({seeds})" if len(pairs) == 1 else f"{n} of the seed pairs"
        lines.append(f"  - whole val, {which}: last {cell(last)}; "
                     f"best {cell(best)}; {first} lower in {sum(d < 0 for d in last)} of {n} "
                     f"(last), {sum(d < 0 for d in best)} of {n} (best)")
    return lines


DIAG_COLUMNS = [('loss', 'loss', '.2e'), ('loss_no_affine', 'loss without LN affine', '.3f'),
                ('ln_a_weight_rms', 'ln_a weight RMS', '.3f'),
                ('ln_b_weight_rms', 'ln_b weight RMS', '.3f'),
                ('ln_bias_gap_rms', 'bias gap RMS', '.3f'), ('avg_spread', 'avg spread', '.3f'),
                ('target_spread', 'target spread', '.3f'), ('cos_no_affine', 'cosine', '.3f')]


def diag_table(runs, rows=8):
    # the embedding loss's diagnostics at about `rows` of each run's estimates (the first, the last,
    # evenly between); a column only where the run logged it (train.py's diagnostics changed)
    lines = []
    for r in runs:
        if not r['diag']:
            continue
        pick = sorted({round(i * (len(r['diag']) - 1) / (rows - 1)) for i in range(rows)})
        cols = [c for c in DIAG_COLUMNS if any(d.get(c[0]) is not None for _, d in r['diag'])]
        lines += [f"\n{r['name']}:\n", "| step | " + " | ".join(c[1] for c in cols) + " |",
                  "|---" * (len(cols) + 1) + "|"]
        for step, d in (r['diag'][i] for i in pick):
            cells = [format(d[k], f) if d.get(k) is not None else "N/A" for k, _, f in cols]
            lines.append(f"| {step:,} | " + " | ".join(cells) + " |")
    return lines


# -----------------------------------------------------------------------------
# the chart

def nice_ticks(lo, hi, n=6):
    # round tick values (1, 2, 5 x 10^k apart) covering [lo, hi]
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    t = first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 10))
        t += step
    return ticks, step


def fmt_tick(v, step):
    decimals = max(0, -math.floor(math.log10(step))) if step < 1 else 0
    return f"{v:.{decimals}f}" if decimals else f"{v:,.0f}"


def svg_chart(runs, train=False, ymin=None, ymax=None, title=None, xaxis='step', floors=None):
    if xaxis == 'epochs':
        # the same curves against passes over the training tokens (train.py logs them with each
        # estimate)
        runs = [dict(r, curve=[(e, t, v) for e, (_, t, v) in zip(r['epochs_at'], r['curve'])])
                for r in runs]
    W, H = 900, 480
    left, right, top, bottom = 70, 290, 40, 50  # plot margins; the legend sits on the right
    pw, ph = W - left - right, H - top - bottom
    xmax = max(max(s for s, _, _ in r['curve']) for r in runs) or 1
    # the step-0 estimate (~ln(vocab) = 10.8) would flatten everything else: fit the y axis to the
    # later points and let the first segment enter from above the plot (clipped)
    ys = [v for r in runs for s, t, v in r['curve'] if s > 0 or len(r['curve']) == 1]
    if train:
        ys += [t for r in runs for s, t, v in r['curve'] if s > 0 or len(r['curve']) == 1]
    floors = floors or {}
    ys += list(floors.values())
    lo = ymin if ymin is not None else min(ys)
    hi = ymax if ymax is not None else max(ys)
    if hi <= lo:
        lo, hi = lo - 0.5, lo + 0.5
    pad = 0.03 * (hi - lo)
    lo, hi = (lo if ymin is not None else lo - pad), (hi if ymax is not None else hi + pad)
    xticks, xstep = nice_ticks(0, xmax)
    yticks, ystep = nice_ticks(lo, hi)
    yticks = [t for t in yticks if lo <= t <= hi]

    def px(step):
        return left + pw * step / xmax

    def py(loss):
        return top + ph * (hi - loss) / (hi - lo)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<defs><clipPath id="plot"><rect x="{left}" y="{top}" width="{pw}" height="{ph}"/>'
           f'</clipPath></defs>']
    out.append(f'<text x="{left + pw / 2}" y="{top - 15}" text-anchor="middle" font-size="14">'
               + escape(title or ("train and " if train else "")
                        + "validation loss (eval-mode cross-entropy estimates)")
               + '</text>')
    # grid and ticks
    for t in xticks:
        x = px(t)
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" '
                   f'stroke="#e5e5e5"/>')
        out.append(f'<text x="{x:.1f}" y="{top + ph + 18}" text-anchor="middle">'
                   f'{fmt_tick(t, xstep)}</text>')
    for t in yticks:
        y = py(t)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" '
                   f'stroke="#e5e5e5"/>')
        out.append(f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">'
                   f'{fmt_tick(t, ystep)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" '
               f'stroke="#333"/>')
    out.append(f'<text x="{left + pw / 2}" y="{H - 12}" text-anchor="middle">'
               f'{"epochs (tokens seen / training tokens)" if xaxis == "epochs" else "step"}'
               f'</text>')
    out.append(f'<text transform="translate(18 {top + ph / 2}) rotate(-90)" text-anchor="middle">'
               f'{"loss (thick: val, thin dashed: train)" if train else "val loss"}</text>')
    placed, labels = [], []  # (y, right end, width) of each label: an overlapping one moves left
    for name, v in floors.items():  # the count-model floors: grey, dotted, named at the right
        if lo <= v <= hi:
            out.append(f'<line x1="{left}" y1="{py(v):.1f}" x2="{left + pw}" y2="{py(v):.1f}" '
                       f'stroke="#888" stroke-dasharray="1,3"/>')
            y = py(v) - 4 if py(v) - 4 > top + 12 else py(v) + 14  # under a line at the top
            label = f"{name} {v:.3f}"
            x, w = left + pw - 4, 7 * len(label)  # about 7 px a character at font-size 12
            while hit := [r - w_ for y_, r, w_ in placed
                          if abs(y - y_) < 12 and r - w_ < x and x - w < r]:
                x = min(hit) - 8
            placed.append((y, x, w))
            labels.append(f'<text x="{x}" y="{y:.1f}" text-anchor="end" fill="#666" '
                          f'stroke="white" stroke-width="3" paint-order="stroke">{escape(label)}'
                          f'</text>')
    # a colour per config; another seed of the same config gets its colour with a dash pattern
    group_of = {id(r): name for name, group in groups_of(runs).items() for r in group}
    styles, seen = [], {}
    for r in runs:
        key = group_of[id(r)]
        if key in seen:
            color, n = seen[key]
            seen[key] = (color, n + 1)
            styles.append((color, DASHES[(n + 1) % len(DASHES)] or DASHES[1]))
        else:
            n_colors = len({c for c, _ in seen.values()})
            color = COLORS[n_colors % len(COLORS)]
            seen[key] = (color, 0)
            styles.append((color, DASHES[(n_colors // len(COLORS)) % len(DASHES)]))
    # one path per run (plus a dashed one per run for the train estimates)
    for r, (color, dash) in zip(runs, styles):
        series = [(2, dash)] + ([(1, '4,3')] if train else [])
        for col, dasharray in series:
            d = ' '.join(f"{'M' if j == 0 else 'L'}{px(p[0]):.1f},{py(p[col]):.1f}"
                         for j, p in enumerate(r['curve']))
            da = f' stroke-dasharray="{dasharray}"' if dasharray else ''
            width = 2 if col == 2 else 1.2
            out.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="{width}"{da} '
                       f'clip-path="url(#plot)"><title>{escape(r["name"])}</title></path>')
        # the final value as a dot, so close curves can still be read off
        s, _, v = r['curve'][-1]
        if lo <= v <= hi:
            out.append(f'<circle cx="{px(s):.1f}" cy="{py(v):.1f}" r="3" fill="{color}"/>')
    out += labels  # over the curves, on a white outline: readable where a curve passes
    # legend, with each run's final val loss
    for i, (r, (color, dash)) in enumerate(zip(runs, styles)):
        y = top + 10 + 20 * i
        da = f' stroke-dasharray="{dash}"' if dash else ''
        out.append(f'<line x1="{left + pw + 15}" y1="{y}" x2="{left + pw + 40}" y2="{y}" '
                   f'stroke="{color}" stroke-width="2"{da}/>')
        out.append(f'<text x="{left + pw + 46}" y="{y + 4}">'
                   f'{escape(r["name"])} ({r["val"]:.3f})</text>')
    out.append('</svg>')
    return '\n'.join(out) + '\n'


def wrap(md, width=100):
    """Prose and list items re-flowed to width columns (a list item's lines under its text); table
    rows, which cannot wrap, as they are."""
    out = []
    for line in md.split('\n'):
        if len(line) <= width or line.startswith('|'):
            out.append(line)
            continue
        text = line.lstrip()
        indent = ' ' * (len(line) - len(text) + (2 if text.startswith('- ') else 0))
        out += textwrap.wrap(line, width, subsequent_indent=indent, break_long_words=False,
                             break_on_hyphens=False)
    return '\n'.join(out)


def write_atomic(path, text):
    tmp = path + '.tmp'
    try:
        with open(tmp, 'w') as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        die(f"cannot write {path}: {e.strerror}")


# -----------------------------------------------------------------------------

if __name__ == '__main__':
    dirs, opts = parse_args(sys.argv[1:])
    runs = [load_run(d) for d in dirs]
    lines = table(runs)
    groups = seed_groups(runs)
    md = '\n'.join(lines) + '\n'
    floors = None
    if opts['floors']:
        floors = read_floors(opts['floors'], runs)
        md += '\n' + floors['line'] + '\n'
    datasets = {r['name']: {**DEFAULTS, **r['config']}['dataset'] for r in runs}
    if len(set(datasets.values())) > 1:  # each loss is on its own val.bin
        md += ("\nThese runs are on different datasets, so their losses do not compare: "
               + ', '.join(f"{name} on {d}" for name, d in datasets.items()) + '.\n')
    if where := where_lines(runs):
        md += ("\nWhere they ran (commit, '+': its .py files changed; torch threads; CPU, its "
               "instruction set; GPU):\n\n" + '\n'.join(where) + '\n')
    if groups:
        md += ('\nSeeds (runs that differ only in the seed; mean ± sample std, and min-max):\n\n'
               + '\n'.join(groups) + '\n')
    if opts['compare']:
        md += ('\nDifference (negative: the first is lower):\n\n'
               + '\n'.join(line for pairs in opts['compare'] for line in compare(runs, pairs))
               + '\n')
    if opts['diag'] and any(r['diag'] for r in runs):
        md += ('\nThe embedding loss at the estimates (on one fixed training batch, without '
               'dropout; the LayerNorm weights are 1 at init; spread: the std over positions, '
               'averaged over channels):\n'
               + '\n'.join(diag_table(runs)) + '\n')
    if opts['speed']:
        md += ('\nSpeed (medians over the logged steps after the first, which pays for compiling; '
               'train.py times a step without the estimates):\n\n' + '\n'.join(speed_table(runs))
               + '\n')
    md = wrap(md)
    print(md, end='')
    if opts['md']:
        write_atomic(opts['md'], md)
    if opts['svg']:
        write_atomic(opts['svg'], svg_chart(runs, opts['train'], opts['ymin'], opts['ymax'],
                                            opts['title'], opts['x'],
                                            floors and floors['named']))
