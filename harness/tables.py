"""Tables of measured models (analyze.py, eval_quant.py, intervene.py, reproduce.py): run labels, the rows of the
paper's tables as text or Markdown, saved JSON results read back, JSON-safe values (NaN as null), and train.py's
progress lines of an evaluation and a probe (ppl_text, probe_text)."""
import glob
import json
import math
import os

SUMMARY_KEYS = ('ppl', 'kurtosis_first', 'kurtosis_rest', 'max_abs_first', 'max_abs_rest', 'first_attn_argmax',
                'first_attn_mass', 'norm_ratio_first', 'norm_ratio_rest', 'kurtosis_norm_ratio_corr_first',
                'kurtosis_norm_ratio_corr_rest')


def run_label(name):
    """'out/x/ckpt.pt' -> 'x', 'runs/y.pt' -> 'y', 'meta-llama/Llama-2-7b-hf' -> 'Llama-2-7b-hf', 'm/z.gguf' -> 'z'."""
    name = name.rstrip('/')
    if os.path.basename(name) == 'ckpt.pt':
        name = os.path.dirname(name) or name
    base = os.path.basename(name) or name
    return base[:-3] if base.endswith('.pt') else base[:-5] if base.endswith('.gguf') else base


def unique_labels(labels):
    """Labels with a repeated one numbered by its position: ['x', 'x', 'y'] -> ['x-1', 'x-2', 'y']."""
    return [x if labels.count(x) == 1 else f'{x}-{i + 1}' for i, x in enumerate(labels)]


def _fmt(value, spec):
    return 'n/a' if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def attention_name(config):
    """The attention a model runs, by its config's name (a public model's: softmax), with attn_bias or sink_token."""
    return config.get('attn', 'softmax') + ''.join(f' + {k}' for k in ('attn_bias', 'sink_token') if config.get(k))


def model_cells(label, config):
    """Model, #Params, Attention, Optimizer cells of a table row (public weights were trained elsewhere: n/a)."""
    n = config['n_params']
    size = f'{n / 1e9:.1f}B' if n >= 1e9 else f'{n / 1e6:.1f}M' if n >= 1e6 else f'{n / 1e3:.1f}K'
    return [label, size, attention_name(config), config.get('optimizer') or 'n/a']


def table_rows(results):
    """Tables, one row per model: Table 2's layout, then norm ratios, correlations (Table 9), mass; and for
    sink-token models the sink's own numbers."""
    table2 = (['Model', '#Params', 'Attention', 'Optimizer', 'PPL', 'E_m[κ_m,1]', 'E_m[κ_m,>1]',
               'E_m[max|X_m,1,d|]', 'E_m[max|X_m,>1,d|]', 'First Attn', sink_rate_header(results)],
              [model_cells(run_label(r['model']), r['config']) + [_fmt(r['ppl'], '.2f')]
               + [_fmt(r[k], '.1f') for k in ('kurtosis_first', 'kurtosis_rest', 'max_abs_first', 'max_abs_rest')]
               + [_fmt(r['first_attn_argmax'], '.3f'), sink_rate_cell(r, results)] for r in results])
    keys = ('norm_ratio_first', 'norm_ratio_rest', 'kurtosis_norm_ratio_corr_first', 'kurtosis_norm_ratio_corr_rest',
            'first_attn_mass', 'attn_nowhere', 'attn_empty')
    table9 = (['Model', 'Norm ratio 1', 'Norm ratio >1', 'Corr κ~ratio 1', 'Corr κ~ratio >1', 'First mass', 'Nowhere',
               'Empty rows'],
              [[run_label(r['model'])] + [_fmt(r.get(k), '.3f') for k in keys] for r in results])
    sinks = [r for r in results if 'sink_kurtosis' in r]
    if not sinks:
        return [table2, table9]
    keys = ('sink_kurtosis', 'sink_max_abs', 'sink_attn_mass', 'sink_attn_argmax')
    sink = (['Model', 'Sink E_m[κ]', 'Sink E_m[max|X|]', 'Sink mass', 'Sink argmax'],
            [[run_label(r['model'])] + [_fmt(r[k], f) for k, f in zip(keys, ('.1f', '.1f', '.3f', '.3f'))] for r in sinks])
    return [table2, table9, sink]


def sink_rate_header(results):
    """'Sink rate (ε=0.3)' when every result used the same ε (files written before sink_rate existed: n/a)."""
    eps = {r.get('sink_eps') for r in results} - {None}
    return f'Sink rate (ε={eps.pop():g})' if len(eps) == 1 else 'Sink rate'


def sink_rate_cell(r, results):
    cell = _fmt(r.get('sink_rate'), '.3f')
    return cell if '=' in sink_rate_header(results) or r.get('sink_eps') is None else f"{cell} (ε={r['sink_eps']:g})"


def text_table(header, rows):
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: '  '.join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return '\n'.join([line(header), '  '.join('-' * w for w in widths)] + [line(r) for r in rows])


def markdown_table(header, rows):
    line = lambda cells: '| ' + ' | '.join(str(c).replace('|', '\\|') for c in cells) + ' |'
    rule = '|' + '|'.join(['---'] + ['---:'] * (len(header) - 1)) + '|'
    return '\n'.join([line(header), rule] + [line(r) for r in rows])


def load_results(paths):
    """Result dicts from JSON files and folders of JSON files (sorted), in the order given."""
    files = []
    for p in paths:
        found = sorted(glob.glob(os.path.join(p, '*.json'))) if os.path.isdir(p) else [p]
        if not found or not all(os.path.isfile(f) for f in found):
            raise ValueError(f"--table {p}: no such JSON file or folder of JSON files")
        files += found
    results = []
    for f in files:
        try:
            with open(f) as fh:
                r = json.load(fh)
        except ValueError:
            r = None
        if not (isinstance(r, dict) and all(k in r for k in SUMMARY_KEYS + ('model', 'config', 'per_layer'))):
            raise ValueError(f"{f} is not an analyze.py JSON file")
        results.append(r)
    return results


def json_safe(x):
    """x with every non-finite float replaced by None (JSON has no NaN/inf)."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [json_safe(v) for v in x]
    return None if isinstance(x, float) and not math.isfinite(x) else x


def probe_text(iter_num, p):
    """The progress line of a probe (None: nothing was counted, e.g. no document longer than one token)."""
    f = _fmt
    return (f"probe iter {iter_num} ({p['documents']} docs): kurtosis first {f(p['kurtosis_first'], '.2f')} rest "
            f"{f(p['kurtosis_rest'], '.2f')} | max |x| first {f(p['max_abs_first'], '.3g')} rest "
            f"{f(p['max_abs_rest'], '.3g')} | first attn {f(p['first_attn_argmax'], '.3f')} (mass "
            f"{f(p['first_attn_mass'], '.3f')}, nowhere {f(p['attn_nowhere'], '.3f')}) | resid peak "
            f"{f(p['resid_peak'], '.3g')} | value drain {f(p['value_drain'], '.3g')} (min {f(p['value_drain_min'], '.3g')})")


def ppl_text(ppl):
    """Perplexity for a progress line: evaluate() caps it at exp(700) (~1e304) to stay finite."""
    return f"{ppl:.2f}" if ppl < 1e6 else f"{ppl:.3g}" if ppl < 1e304 else '>1e304'
