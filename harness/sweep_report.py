"""What reproduce.py makes of a sweep's results: each table in the paper's layout beside the paper's numbers (render:
Markdown and JSON), its figures (the probes' trajectories, Bigram-Backcopy's dynamics, where quantisation breaks by
bit width) and the goals of the scale (goal). A run is reproduce.py's Run (its cfg, name and the (table, row) pairs it
serves); results are read from its folder (analysis.json, quant.json, log.jsonl's probes)."""
import json
import os
import sys
from pathlib import Path

from harness import provenance
from harness.claims import (bits_table, claim_lines, claim_series, quant_separation, spread_lines, table5_claims,
                            value)
from harness.fileio import atomic_write, read_json, write_json
from harness.paper_tables import TABLES
from harness.recipe import LAPTOP_AS_WRITTEN, check_goal, check_laptop_goal, goal_text, laptop_measures, run_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def get(results, key):
    """A value of a result by its dotted key; a part that is a number indexes a list (per_layer.resid_peak.0)."""
    for part in key.split('.'):
        if isinstance(results, list) and part.isdigit():
            results = results[int(part)] if int(part) < len(results) else None
        else:
            results = results.get(part) if isinstance(results, dict) else None
    return results


def read_results(run_dir):
    """A run's analysis.json and quant.json, and the probes of its log.jsonl: by iteration ({"300": probe, ...}) and
    as (tokens seen, probe) in iteration order ('probes'; an event without its token count is left out). A file that
    cannot be read (e.g. truncated by a killed run) is named in one warning line and left out: its cells show '–'
    and the other rows render."""
    from harness.runs import read_probes   # torch: only when rendering
    log = os.path.join(run_dir, 'log.jsonl')
    events = read_probes(log) if os.path.isfile(log) else []
    out = {'probe': {str(e['iter']): e['probe'] for e in events},
           'probes': [(e['tokens'], e['probe']) for e in events if isinstance(e.get('tokens'), (int, float))]}
    for source, name in (('analysis', 'analysis.json'), ('quant', 'quant.json')):
        path = os.path.join(run_dir, name)
        if os.path.isfile(path):
            try:
                with open(path) as f:
                    data = json.load(f)
                out[source] = data['models'][0] if source == 'quant' else data
            except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
                print(f"warning: {path} cannot be read ({type(e).__name__}: {e}); its cells are left empty "
                      f"(delete it and run the same command without --render to measure again)", file=sys.stderr)
    return out


def cell(value, fmt):
    return '–' if value is None else format(value, fmt)


def render(name, runs, scale_name, scale, out='.', found=None):
    """(markdown, json) of one table from the results in the runs' folders (each named relative to `out`, the
    table's folder); `found`: found_results(runs) when the caller has read them already (one read, one warning a
    damaged file, for the tables, figures and goals of one command)."""
    table, found = TABLES[name], found_results(runs) if found is None else found
    header = list(table.label_names)
    for col, _, _, _, paper in table.columns:
        header += [f'{col}', f'{col} (paper)'] if paper else [col]
    lines, rows, notes = [], [], []
    run_of = {row.config: run for run in runs for tname, row in run.rows if tname == name}
    for row in table.rows:                                 # the paper's row order
        if row.config not in run_of:
            continue
        run = run_of[row.config]
        results = found[row.config]
        ours = {key: get(results.get(source, {}), key) for _, source, key, _, _ in table.columns}
        paper = dict(zip([c[2] for c in table.columns if c[4]], row.paper))
        cells = list(row.labels)
        for col, _, key, fmt, in_paper in table.columns:
            ours_fmt, paper_fmt = fmt if isinstance(fmt, tuple) else (fmt, fmt)
            cells.append(cell(ours[key], ours_fmt))
            if in_paper:
                cells.append(cell(paper[key], paper_fmt))
        state = run_state(run.cfg['out_dir'], run.cfg['max_iters'])
        if state['state'] == 'diverged':   # reported, never dropped: its cells are what was measured before (if any)
            e = state['event']
            notes.append(f"config/{row.config}.py DIVERGED at iteration {e['iter']} (val loss {e['val_loss']:.4g} > "
                         f"best {e['best_val_loss']:.4f} + ln {e['divergence_factor']:g}); its cells are empty")
        elif state['state'] == 'none':   # e.g. a results folder copied without the rows still training
            notes.append(f"config/{row.config}.py not trained: no log.jsonl in {os.path.relpath(run.cfg['out_dir'], out)}")
        elif state['state'] != 'finished':
            notes.append(f"config/{row.config}.py not finished: iteration {state['iter']} of {run.cfg['max_iters']}")
        lines.append(cells)
        measured = results.get('analysis') or results.get('quant') or {}
        rows.append({'config': f'config/{row.config}.py', 'run_dir': os.path.relpath(run.cfg['out_dir'], out),
                     'labels': list(row.labels), 'state': state['state'], 'iter': state['iter'], 'ours': ours,
                     'paper': paper, 'provenance': measured.get('provenance'),
                     'val_sha256': (measured.get('data') or {}).get('val_sha256')})
    ran = [run_of[row.config] for row in table.rows if row.config in run_of]
    as_written = name in LAPTOP_AS_WRITTEN and ran and all(o.startswith('--out_dir=') for r in ran for o in r.overrides)
    setting = 'each row as its config file says' if as_written else scale.description   # CPU-sized configs (the main
    # job's) at the paper scale: its description (C4, batch 512) is not theirs
    md = [f'**{table.title}** — scale `{scale_name}`: {setting}.', '',
          '| ' + ' | '.join(header) + ' |', '|' + '|'.join(' --- ' for _ in header) + '|']
    md += ['| ' + ' | '.join(c) + ' |' for c in lines] + ([''] + notes if notes else [])
    doc = {'table': name, 'title': table.title, 'scale': scale_name, 'scale_description': setting,
           'columns': [{'name': c[0], 'key': c[2], 'paper': c[4]} for c in table.columns], 'rows': rows,
           'provenance': provenance.record()}   # the rendering's; each row's measurement carries its own
    if name == 'table5' and scale_name == 'laptop':   # the claims and the spread beside the table they judge
        doc['claims'] = table5_verdicts(found)[0]
        md += ['', "The paper's claims on the first token, beside the seed replicas' spread (`--goal` prints the "
               "same lines):", '', '```', *doc['claims'], '```']
    return '\n'.join(md), doc


def draw_trajectories(name, runs, out):
    """<out>/<name>_trajectories.png: the probes that train.py logged at the evaluations of the table's runs, one
    line per run in the table's row order (plots.plot_trajectories); None when no run has a probe yet."""
    from harness import plots   # torch and matplotlib: only when drawing
    ordered = []
    for row in TABLES[name].rows:
        run = next((r for r in runs for t, rr in r.rows if t == name and rr is row), None)
        if run is not None and not any(r is run for r in ordered):
            ordered.append(run)
    logs = [(run.name, os.path.join(run.cfg['out_dir'], 'log.jsonl')) for run in ordered]
    logs = [(label, log) for label, log in logs if os.path.isfile(log)]
    panels = plots.TRAJECTORY_PANELS[:3] if name == 'main' else None   # the main job: kurtosis, max |x|, attention
    return plots.plot_trajectories(logs, os.path.join(out, f'{name}_trajectories.png'), panels) if logs else None


def draw_bits(name, runs, out, scale_name, found=None):
    """<out>/<name>_bits.{png,md,json}: where per-tensor quantisation breaks for the table's rows that have a
    quant.json (plots.plot_quant_bits, claims.bits_table), in the table's row order; None when none has one."""
    from harness import plots
    rows, seen, found = [], set(), found_results(runs) if found is None else found
    for row in TABLES[name].rows:
        run = next((r for r in runs for t, rr in r.rows if t == name and rr is row), None)
        quant = found[row.config].get('quant') if run is not None and run.name not in seen else None
        if quant:
            seen.add(run.name)
            rows.append((row.config.split('/')[-1], quant))
    if not rows:
        return None
    md, doc = bits_table(rows)
    title = (f"{TABLES[name].title.split(':')[0]} at the {scale_name} scale: per-tensor absmax quantisation "
             f"by bit width")
    with atomic_write(os.path.join(out, f'{name}_bits.md')) as f:
        f.write(f"**{title}** (Δ = quantised - full perplexity; max/median: the quantised layers' inputs, full "
                f"precision)\n\n{md}\n")
    write_json(os.path.join(out, f'{name}_bits.json'), {'table': name, 'scale': scale_name, 'rows': doc,
                                                        'provenance': provenance.record()}, indent=1)
    return plots.plot_quant_bits(rows, os.path.join(out, f'{name}_bits.png'), title)


def draw_claims(runs, out, found=None):
    """<out>/table5_claims.png: each of Table 5's claims (claims.CLAIM_PANELS) as the probes of the rows it names over
    training, with their measured values at the end (plots.plot_claims); None when no row has a probe yet."""
    from harness import plots
    probes, finals, found = {}, {}, found_results(runs) if found is None else found
    for run in runs:
        for name, row in run.rows:
            if name == 'table5':
                n = int(row.config.split('/')[1][:2])
                probes[n], finals[n] = found[row.config].get('probes', []), found[row.config].get('analysis')
    title = ("Table 5's claims over training: the probes (log.jsonl, a few validation documents) of the rows each "
             "claim names; ★ the measured value (analyze.py); dotted, the claim's threshold")
    return plots.plot_claims(claim_series(probes, finals), os.path.join(out, 'table5_claims.png'), title)


def draw_effects(name, runs, out, found=None):
    """<out>/<name>_effects.png: each row of the table as a point, its first token's kurtosis against its attention
    share and against its perplexity (plots.plot_effects; the mitigations: what each fix does at equal tokens), in
    the table's row order; None when no row is measured yet."""
    from harness import plots
    points, found = [], found_results(runs) if found is None else found
    for row in TABLES[name].rows:
        run = next((r for r in runs for t, rr in r.rows if t == name and rr is row), None)
        results = found[row.config].get('analysis') if run is not None else None
        if results:
            points.append((' '.join(row.labels), *(value(results, k) for k in ('kurtosis_first', 'first_attn_argmax',
                                                                                 'ppl'))))
    title = (f"{TABLES[name].title.split(':')[0]}: the first token's outliers, its attention and the perplexity, "
             f"a point a row")
    return plots.plot_effects(points, os.path.join(out, f'{name}_effects.png'), title)


def draw_bb_dynamics(name, runs, out):
    """<out>/<name>_dynamics.png: a Bigram-Backcopy table's rows' probes at layer 0 against steps, beside Guo et al.'s
    released curves (docs/results/bb-guo-reference.json; plots.plot_bb_dynamics); None when no run has a probe yet."""
    from harness import plots
    with open(os.path.join(ROOT, 'docs', 'results', 'bb-guo-reference.json')) as f:
        reference = json.load(f)['curves']
    logs = [(f"{row.labels[0]} L, {row.labels[1]} + {row.labels[2]} (LR {run.cfg['learning_rate']:g})",
             os.path.join(run.cfg['out_dir'], 'log.jsonl'), run.cfg['n_layer'])
            for row in TABLES[name].rows for run in runs for t, r in run.rows if r is row]
    logs = [entry for entry in logs if os.path.isfile(entry[1])]
    batches = sorted({r.cfg['batch_size'] * r.cfg['gradient_accumulation_steps'] for r in runs
                      if any(t == name for t, _ in r.rows)})
    note = (f"\nours at batch {'/'.join(map(str, batches))} (each row's LR in the legend); theirs at batch 512, "
            f"Adam LR 3e-4, SGD LR 0.03")
    return plots.plot_bb_dynamics(logs, reference, os.path.join(out, f'{name}_dynamics.png'), note) if logs else None


def goal(runs, scale_name, tables, found=None):
    """Print the goals of the tables at this scale; True when every one is met. Table 2 / 3: recipe.check_laptop_goal
    at the laptop scale (with where quantisation separates the pair: claims.quant_separation), else recipe.check_goal,
    on the 60M vanilla and softmax-1 + OrthoAdam rows. Table 5 at the laptop scale: the paper's claims on its rows
    (claims.table5_claims), beside the seed replicas' spread (the spread table's rows)."""
    found = found_results(runs) if found is None else found
    laptop, ok = scale_name == 'laptop', True
    if 'main' in tables:
        lines, met = goal_text(main_goal(runs), 'main job goal')
        print('\n'.join(lines))
        ok = met and ok
    if {'table2', 'table3'} & set(tables) or not (laptop and 'table5' in tables or 'main' in tables):
        ok = pair_goal(found, laptop, 'table3' in tables) and ok
    if laptop and 'table5' in tables:
        lines, met = table5_verdicts(found)
        print('\n'.join(lines))
        ok = met and ok
    return ok


def found_results(runs):
    """{row config: read_results of its run} for every row the runs serve."""
    found = {}
    for run in runs:
        for _, row in run.rows:
            found.setdefault(row.config, read_results(run.cfg['out_dir']))
    return found


def table5_verdicts(found):
    """(lines, met): the seed replicas' spread (the spread table's rows) and the paper's Table 5 claims on the
    first token beside it (claims.table5_claims), as --goal prints them and table5.md ends at the laptop scale."""
    pairs = [(found.get(a, {}).get('analysis'), found.get(b, {}).get('analysis')) for a, b in (
        ('laptop/base', 'laptop/seeds/vanilla_seed2'), ('laptop/seeds/s1oa', 'laptop/seeds/s1oa_seed2'))]
    lines, factors = spread_lines(pairs, ['vanilla, seeds 1337 / 2', 'softmax-1 + OrthoAdam, seeds 1337 / 2'])
    rows = {int(c.split('/')[1][:2]): r.get('analysis') for c, r in found.items() if c.startswith('table5/')}
    claim, met = claim_lines(table5_claims(rows, factors), 'table5 claims at the laptop scale')
    return lines + claim, met


MAIN_RATIO, MAIN_PPL = 3.0, 0.03   # the main job's goal: vanilla's first-token kurtosis >= 3x the fixed model's,
# at perplexities within 3% of each other


def main_pair(runs):
    """The main job's two results (analysis.json of config/main_vanilla.py and config/main.py), None where missing."""
    found = {row.config: read_results(run.cfg['out_dir']).get('analysis') for run in runs for t, row in run.rows
             if t == 'main'}
    return found.get('main_vanilla'), found.get('main')


def main_summary(runs):
    """The sentence the main job ends with: the first token's kurtosis of both models side by side, with their
    perplexities; None while either is not measured."""
    v, s = main_pair(runs)
    kv, ks = get(v or {}, 'kurtosis_first'), get(s or {}, 'kurtosis_first')
    pv, ps = get(v or {}, 'ppl'), get(s or {}, 'ppl')
    if None in (kv, ks, pv, ps):
        return None
    same = abs(ps / pv - 1) <= MAIN_PPL
    return (f"vanilla's first token: kurtosis {kv:.1f} (a Gaussian's is 3); with softmax-1 + OrthoAdam {ks:.1f}, "
            f"{kv / ks:.1f}x less, at {'the same' if same else 'another'} perplexity ({pv:.3f} and {ps:.3f}, "
            f"{ps / pv - 1:+.1%})")


def main_goal(runs):
    """[(criterion, value, ok)] of the main job's goal (recipe.goal_text prints them)."""
    v, s = main_pair(runs)
    kv, ks = get(v or {}, 'kurtosis_first'), get(s or {}, 'kurtosis_first')
    pv, ps = get(v or {}, 'ppl'), get(s or {}, 'ppl')
    ratio = None if None in (kv, ks) or not ks else kv / ks
    gap = None if None in (pv, ps) or not pv else abs(ps / pv - 1)
    return [(f'vanilla E_m kurtosis first >= {MAIN_RATIO:g}x s1+OA (ratio)', ratio,
             None if ratio is None else ratio >= MAIN_RATIO),
            (f'perplexities within {MAIN_PPL:.0%} (|s1+OA / vanilla - 1|)', gap, None if gap is None else gap <= MAIN_PPL)]


def pair_goal(found, laptop, quant):
    """The goal of Table 2's 60M pair (vanilla, softmax-1 + OrthoAdam); at the laptop scale also the measures it
    shows without requiring them and, with Table 3 (quant), where per-tensor quantisation separates the two: a goal
    of its own (claims.quant_separation)."""
    pair = [found.get(f'table2/gpt2_60m_{v}') for v in ('vanilla', 's1oa')]
    if None in pair:
        print("goal: needs the rows table2/gpt2_60m_vanilla and table2/gpt2_60m_s1oa (of table2 or table3)",
              file=sys.stderr)
        return False
    (v, s) = pair
    lines, ok = goal_text((check_laptop_goal if laptop else check_goal)(v.get('analysis'), s.get('analysis'),
                                                                       v.get('quant'), s.get('quant')),
                          'laptop goal' if laptop else 'sink goal')
    print('\n'.join(lines))
    if laptop:   # shown, not required (recipe.check_laptop_goal says why)
        for name, a, b in laptop_measures(v.get('analysis'), s.get('analysis'), v.get('quant'), s.get('quant')):
            print(f"measured (not required): {name}: vanilla {cell(a, '.4g')}, s1+OA {cell(b, '.4g')}")
        if quant:
            lines, separated = quant_separation(v.get('quant'), s.get('quant'))
            print('\n'.join(lines))
            ok = ok and bool(separated)
            seeds = [found.get(c, {}).get('quant') for c in ('laptop/seeds/vanilla_seed2', 'laptop/seeds/s1oa_seed2')]
            if None not in seeds:   # the seed replicas (Table 5 brings them): the same question on a second pair,
                lines, _ = quant_separation(*seeds)   # shown beside the goal, which stays the table's pair's
                print('\n'.join(f"seed 2 (not the goal's pair): {line}" for line in lines))
    return ok


def headline(run_dir):
    """What a finished row (its folder) measured, for the sweep's [done] line: analysis.json's perplexity, the first
    token's and the other tokens' kurtosis and %First Attn, and quant.json's Δ under coarse (W8A8 per tensor) where
    measured; '' when there is no analysis."""
    a = read_json(Path(run_dir, 'analysis.json'))
    if value(a, 'ppl') is None:
        return ''
    parts = [f"PPL {a['ppl']:.3f}"] + [f"{label} {a[key]:.{digits}f}" for key, label, digits in (
        ('kurtosis_first', 'E_m[κ_m,1]', 2), ('kurtosis_rest', 'E_m[κ_m,>1]', 2), ('first_attn_argmax', '%First', 3))
        if value(a, key) is not None]
    models = read_json(Path(run_dir, 'quant.json'))
    models = models.get('models') if isinstance(models, dict) else None
    coarse = value(models[0].get('delta'), 'coarse') if isinstance(models, list) and models and isinstance(
        models[0], dict) else None
    return ', '.join(parts + ([f"Δ coarse {coarse:+.3f}"] if coarse is not None else []))
