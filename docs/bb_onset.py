"""Bigram-Backcopy at Guo et al.'s batch (512 sequences a step): when the sink starts, run by run, from committed logs
(no model runs). Run from anywhere (the default paths are this repository's):

    python docs/bb_onset.py                                  # docs/results/2026-11-28-bb512 -> onset.png there
    python docs/bb_onset.py RESULTS --out F.png

RESULTS holds pilots/<run>/log.jsonl (train.py's probes: attention on <s> from non-trigger queries in layer 0,
`first_attn_mass_nontrigger`; <s>'s value norm, `value_norm_first`) and guo_code/seed<N>.log (guo_ab.py's lines:
step, attention on <s>, value norm, seconds). Their released curve comes from docs/results/bb-guo-reference.json.
Prints the attention on <s> of every run at steps 0, 50, ..., 300 as a Markdown table and draws both quantities
against steps.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)   # the repository: this file is docs/bb_onset.py (not the working directory)
sys.path.insert(0, ROOT)
from harness.entry import early_exit_on_signal  # noqa: E402   first: a signal while the rest loads is one line
early_exit_on_signal(__name__)

from harness.entry import run_script  # noqa: E402
from harness.fileio import check_output, path_arg  # noqa: E402

OURS = (('bf16_s1337', 'ours, seed 1337 (bf16)'), ('fp32_s1337', 'ours, seed 1337 (fp32)'),
        ('bf16_s1', 'ours, seed 1'), ('bf16_s2', 'ours, seed 2'),
        ('guochain_s1337', "ours, seed 1337, their chain"), ('pool600k_s1337', 'ours, seed 1337, 600k sequences'))
THEIRS = ((42, 'their code, seed 42'), (1, 'their code, seed 1'), (2, 'their code, seed 2'))
STEPS = (0, 50, 100, 150, 200, 250, 300)
KEYS = ('first_attn_mass_nontrigger', 'value_norm_first')   # train.py's probe: attention on <s>, its value norm


def curves(results):
    """{label: (steps, attention on <s>, value norm of <s>)} for every run found under `results`."""
    out = {}
    ref = json.load(open(os.path.join(HERE, 'results', 'bb-guo-reference.json')))['curves']['1 layer, Adam']
    keep = [i for i, s in enumerate(ref['step']) if s <= 300]
    out['Guo et al., released (seed 42)'] = tuple([ref[k][i] for i in keep] for k in ('step', 'attn_on_s', 'value_norm_s'))
    for name, label in THEIRS:
        path = os.path.join(results, 'guo_code', f'seed{name}.log')
        if os.path.exists(path):
            out[label] = guo_log(path)
    for name, label in OURS:
        path = os.path.join(results, 'pilots', name, 'log.jsonl')
        if os.path.exists(path):
            probes = probe_log(path)
            if probes is None:
                continue
            steps = sorted(probes)
            out[label] = (steps, [probes[s][0] for s in steps], [probes[s][1] for s in steps])
    return out


def guo_log(path):
    """guo_ab.py's lines `step attention value-norm seconds` as (steps, attention, value norms); a line that is not
    that is a one-line exit naming the file and the line."""
    rows = []
    with open(path, errors='replace') as f:   # damaged bytes: a line that does not parse, named
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            r = line.split()
            try:
                rows.append([float(r[i]) for i in range(3)])
            except (ValueError, IndexError):
                shown = line.strip() if len(line.strip()) <= 80 else line.strip()[:77] + '...'
                sys.exit(f"bb_onset.py: error: {path} line {n}: {shown!r} is not guo_ab.py's `step attention "
                         f"value-norm seconds`; remove that line (or run guo_ab.py again)")
    return tuple([r[i] for r in rows] for i in range(3))


def probe_log(path):
    """{iteration: (attention on <s>, value norm of <s>)} of the probes in a train.py log.jsonl. A line that does not
    parse (cut by a killed run; a resumed run goes on after it) is skipped, as harness.recipe.run_state skips it, and
    so is a probe without either key (a log older than it), each with a warning; a log none of whose probes has both
    is left out (None)."""
    probes, cut, older, missing = {}, [], 0, set()
    with open(path, errors='replace') as f:   # damaged bytes: a line that does not parse, skipped
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                e = json.loads(line)
            except ValueError:
                cut.append(n)
                continue
            if not isinstance(e, dict) or 'iter' not in e or not isinstance(e.get('probe'), dict):
                continue
            if not all(k in e['probe'] for k in KEYS):
                older += 1
                missing |= {k for k in KEYS if k not in e['probe']}
                continue
            probes[e['iter']] = tuple(nan(e['probe'][k]) for k in KEYS)
    if cut:
        warn(f"{path} line{'s' if len(cut) > 1 else ''} {', '.join(map(str, cut))}: not JSON (cut by a killed run?), "
             f"skipped")
    if older:
        keys = [k for k in KEYS if k in missing]
        warn(f"{path}: {older} probe{'s' if older > 1 else ''} without {' or '.join(keys)} (a log older than "
             f"{'that key' if len(keys) == 1 else 'those keys'}), skipped{'' if probes else '; the run is left out'}")
        if not probes:
            return None
    return probes


def nan(x):
    """A probe's number; None (train.py writes NaN so) as NaN."""
    return float('nan') if x is None else x


def warn(text):
    print(f"bb_onset.py: warning: {text}", file=sys.stderr, flush=True)


def table(runs):
    lines = ['| run | ' + ' | '.join(f'step {s}' for s in STEPS) + ' |', '| --- |' + ' ---: |' * len(STEPS)]
    for label, (steps, attn, _) in runs.items():
        at = dict(zip(steps, attn))
        lines.append(f'| {label} | ' + ' | '.join(f'{at[s]:.3f}' if s in at else '–' for s in STEPS) + ' |')
    return '\n'.join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('results', nargs='?', type=path_arg,
                   help='the results folder (default docs/results/2026-11-28-bb512 of this repository)')
    p.add_argument('--out', type=path_arg, help='the figure (default RESULTS/onset.png)')
    args = p.parse_args(argv)
    if args.results is None:   # the repository's, wherever the command runs; named as before from its root
        args.results = os.path.relpath(os.path.join(ROOT, 'docs', 'results', '2026-11-28-bb512'))
    if not os.path.isdir(os.path.join(args.results, 'pilots')):
        sys.exit(f"bb_onset.py: error: {args.results} has no pilots/ folder: pass the results folder of the batch-512 "
                 f"pilots")
    out = args.out or os.path.join(args.results, 'onset.png')
    try:
        check_output(out, '--out', inputs=[os.path.join(args.results, 'pilots'), os.path.join(args.results, 'guo_code')],
                     make=True)
    except ValueError as e:
        sys.exit(f"bb_onset.py: error: {e}")
    runs = curves(args.results)
    print(table(runs))
    draw(runs, out)
    print(f'wrote {out}')


def draw(runs, out):
    from harness.plots import _pyplot, _save   # matplotlib, once every input has been read
    fig, axes = _pyplot().subplots(1, 2, figsize=(11, 4))
    for label, (steps, attn, value) in runs.items():
        style = dict(color='black', lw=2) if label.startswith('Guo') else \
            dict(ls='--', marker='.') if label.startswith('their') else dict(marker='o', ms=3)
        axes[0].plot(steps, attn, label=label, **style)
        axes[1].plot(steps, value, label=label, **style)
    axes[0].set(xlabel='step (512 sequences of 256 tokens)', ylabel='attention on <s> (non-trigger queries)')
    axes[1].set(xlabel='step (512 sequences of 256 tokens)', ylabel='||v_<s>||, layer 0')
    axes[0].legend(fontsize=7)
    fig.suptitle('1-layer softmax + Adam at Guo et al.\'s batch: the onset of the sink, seed by seed')
    _save(fig, out)


if __name__ == '__main__':
    run_script(main)
