"""Bigram-Backcopy at Guo et al.'s batch (512 sequences a step): when the sink starts, run by run, from committed logs
(no model runs). Run from the repository root:

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
sys.path.insert(0, os.path.dirname(HERE))
from harness.entry import run_script  # noqa: E402
from harness.fileio import check_output  # noqa: E402
from harness.plots import _pyplot, _save  # noqa: E402

OURS = (('bf16_s1337', 'ours, seed 1337 (bf16)'), ('fp32_s1337', 'ours, seed 1337 (fp32)'),
        ('bf16_s1', 'ours, seed 1'), ('bf16_s2', 'ours, seed 2'),
        ('guochain_s1337', "ours, seed 1337, their chain"), ('pool600k_s1337', 'ours, seed 1337, 600k sequences'))
THEIRS = ((42, 'their code, seed 42'), (1, 'their code, seed 1'), (2, 'their code, seed 2'))
STEPS = (0, 50, 100, 150, 200, 250, 300)


def curves(results):
    """{label: (steps, attention on <s>, value norm of <s>)} for every run found under `results`."""
    out = {}
    ref = json.load(open(os.path.join(HERE, 'results', 'bb-guo-reference.json')))['curves']['1 layer, Adam']
    keep = [i for i, s in enumerate(ref['step']) if s <= 300]
    out['Guo et al., released (seed 42)'] = tuple([ref[k][i] for i in keep] for k in ('step', 'attn_on_s', 'value_norm_s'))
    for name, label in THEIRS:
        path = os.path.join(results, 'guo_code', f'seed{name}.log')
        if os.path.exists(path):
            rows = [line.split() for line in open(path) if line.strip()]
            out[label] = tuple([float(r[i]) for r in rows] for i in range(3))
    for name, label in OURS:
        path = os.path.join(results, 'pilots', name, 'log.jsonl')
        if os.path.exists(path):
            probes = {}
            for line in open(path):
                e = json.loads(line)
                if 'probe' in e:
                    probes[e['iter']] = (e['probe']['first_attn_mass_nontrigger'], e['probe']['value_norm_first'])
            steps = sorted(probes)
            out[label] = (steps, [probes[s][0] for s in steps], [probes[s][1] for s in steps])
    return out


def table(runs):
    lines = ['| run | ' + ' | '.join(f'step {s}' for s in STEPS) + ' |', '| --- |' + ' ---: |' * len(STEPS)]
    for label, (steps, attn, _) in runs.items():
        at = dict(zip(steps, attn))
        lines.append(f'| {label} | ' + ' | '.join(f'{at[s]:.3f}' if s in at else '–' for s in STEPS) + ' |')
    return '\n'.join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('results', nargs='?', default=os.path.join('docs', 'results', '2026-11-28-bb512'))
    p.add_argument('--out', help='the figure (default RESULTS/onset.png)')
    args = p.parse_args(argv)
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
    print(f'wrote {out}')


if __name__ == '__main__':
    run_script(main)
