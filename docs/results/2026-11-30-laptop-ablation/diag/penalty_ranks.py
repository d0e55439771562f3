"""Whether the per-tensor penalty follows the outliers across Table 5's 14 laptop rows: the Spearman rank correlation
of each row's Δ perplexity / perplexity (table5_bits.json) with the residual readers' max / median and with the first
token's kurtosis (each row's analysis.json). Reads this results folder only; numpy.
usage: python docs/results/2026-11-30-laptop-ablation/diag/penalty_ranks.py"""
import json
import os

import numpy as np

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ranks(x):
    return np.argsort(np.argsort(x))   # no ties among these values


def spearman(x, y):
    return float(np.corrcoef(ranks(np.asarray(x)), ranks(np.asarray(y)))[0, 1])


with open(os.path.join(HERE, 'table5.json')) as f:
    runs = {r['config'].split('/')[-1][:-3]: r['run_dir'] for r in json.load(f)['rows']}
with open(os.path.join(HERE, 'table5_bits.json')) as f:
    rows = json.load(f)['rows']
kurt = []
for r in rows:
    with open(os.path.join(HERE, runs[r['label']], 'analysis.json')) as f:
        kurt.append(json.load(f)['kurtosis_first'])
spread = [r['residual_max_over_median'] for r in rows]
print(f"{len(rows)} rows; max/median of the residual readers against E_m[κ_m,1]: {spearman(spread, kurt):.2f}")
for scheme in ('coarse7', 'coarse6', 'coarse5', 'coarse4'):
    rel = [r['delta'][scheme] / r['full'] for r in rows]
    print(f"{scheme}: Δ/PPL against max/median {spearman(rel, spread):.2f}, against E_m[κ_m,1] {spearman(rel, kurt):.2f}")
