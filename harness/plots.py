"""The figures analyze.py draws (Fig. 1, Appendices E, I, J, K, L and the probe trajectories), each from measured
results; matplotlib is imported only when a figure is drawn."""
import math

import numpy as np

from harness.fileio import atomic_write
from harness.runs import read_log, read_probes
from harness.tables import run_label


TOP_CHANNELS = 12


def _pyplot():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path):
    """The figure as a PNG file, written atomically (fileio.atomic_write: a link at path is replaced, not followed)."""
    with atomic_write(path, 'wb') as f:
        fig.savefig(f, format='png', dpi=100, bbox_inches='tight')
    _pyplot().close(fig)
    return path


def plot_attention_maps(runs, path):
    """Fig. 1a: attention averaged over all heads and layers, first document."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(runs), figsize=(4.6 * len(runs), 4.2), squeeze=False, layout='constrained')
    for ax, (label, ex) in zip(axes[0], runs):
        im = ax.imshow(ex['attn'], cmap='viridis', vmin=0)
        ax.set(title=f"{label}\nmean over heads and layers", xlabel='key position', ylabel='query position')
        fig.colorbar(im, ax=ax)
    fig.suptitle('Attention map of the first validation document (key 0 = first token)')
    return _save(fig, path)


def plot_hidden_states(runs, path):
    """Fig. 1b: |hidden state| (mean over layers) of the largest channels across positions, log colour scale."""
    plt = _pyplot()
    from matplotlib.colors import LogNorm
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4.2), squeeze=False, layout='constrained')
    for ax, (label, ex) in zip(axes[0], runs):
        h = ex['hidden']                                      # (T, C)
        top = np.argsort(-h.max(0))[:TOP_CHANNELS]
        others = np.delete(h, top, axis=1)
        img = np.concatenate([h[:, top].T, np.median(others, axis=1)[None]]) if others.size else h[:, top].T
        norm = LogNorm(vmin=max(np.percentile(img, 5), img.max() * 1e-4, 1e-12), vmax=max(img.max(), 1e-11))
        im = ax.imshow(img, aspect='auto', cmap='magma', interpolation='nearest', norm=norm)
        ax.set_yticks(range(len(img)), [f'ch {c}' for c in top] + (['median of others'] if others.size else []))
        ax.set(title=f'{label}: top {len(top)} channels', xlabel='token position')
        fig.colorbar(im, ax=ax, label='|activation| (log scale)')
    fig.suptitle('|Hidden state| averaged over layers, first validation document')
    return _save(fig, path)


def layer_panels(n_layer):
    """Appendix J/K's panels: the mean over layers, the first layer, and the layers at 1/4 and 3/4 of the depth."""
    picks = dict.fromkeys([0, n_layer // 4, (3 * n_layer) // 4])
    return [('mean over layers', None)] + [(f'layer {m + 1}', m) for m in picks]


def plot_attention_layers(runs, path):
    """Appendix K: attention of the first document averaged over heads, per selected layer (one row per model)."""
    plt = _pyplot()
    cols = max(len(layer_panels(len(ex['attn_layers']))) for _, ex in runs)
    fig, axes = plt.subplots(len(runs), cols, figsize=(3.6 * cols, 3.4 * len(runs)), squeeze=False, layout='constrained')
    for row, (label, ex) in zip(axes, runs):
        for ax, (title, m) in zip(row, layer_panels(len(ex['attn_layers']))):
            im = ax.imshow(ex['attn'] if m is None else ex['attn_layers'][m], cmap='viridis', vmin=0)
            ax.set(title=title, xlabel='key', ylabel=f'{label}\nquery' if m is None else 'query')
            fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle('Attention maps of the first validation document, mean over heads (key 0 = first token)')
    return _save(fig, path)


def plot_hidden_layers(runs, path):
    """Appendix J: |hidden state| of the first document in the channels holding the largest activations, for the
    mean over layers and selected layers (one row per model), log colour scale."""
    plt = _pyplot()
    from matplotlib.colors import LogNorm
    cols = max(len(layer_panels(len(ex['hidden_layers']))) for _, ex in runs)
    fig, axes = plt.subplots(len(runs), cols, figsize=(4.2 * cols, 3.4 * len(runs)), squeeze=False, layout='constrained')
    for row, (label, ex) in zip(axes, runs):
        for ax, (title, m) in zip(row, layer_panels(len(ex['hidden_layers']))):
            h = ex['hidden'] if m is None else ex['hidden_layers'][m]                   # (T, C)
            top = np.argsort(-h.max(0))[:TOP_CHANNELS]
            img = h[:, top].T
            norm = LogNorm(vmin=max(img.max() * 1e-4, 1e-12), vmax=max(img.max(), 1e-11))
            im = ax.imshow(img, aspect='auto', cmap='magma', interpolation='nearest', norm=norm)
            ax.set_yticks(range(len(top)), [f'ch {c}' for c in top], fontsize=7)
            ax.set(title=title, xlabel='token position')
            if m is None:
                ax.set_ylabel(label)
            fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(f'|Hidden state| of the first validation document, the {TOP_CHANNELS} channels with the largest values')
    return _save(fig, path)


def _log_scale_if_wide(ax, values):
    """A log y-axis when the values (None = missing) are positive and span more than a factor of 10."""
    values = np.array([math.nan if v is None else v for v in values], dtype=float)
    if np.isfinite(values).any() and np.nanmin(values) > 0 and np.nanmax(values) > 10 * np.nanmin(values):
        ax.set_yscale('log')


def plot_layer_progression(results, path):
    """Appendix I: per-layer metrics against the layer index normalised to [0, 1]."""
    plt = _pyplot()
    panels = [('first_attn_argmax', 'first_attn_mass', 'first-token attention', False, 'argmax share', 'mass'),
              ('kurtosis_first', 'kurtosis_rest', 'kurtosis (raw, Gaussian 3)', True, 'first token', 'other tokens'),
              ('norm_ratio_first', 'norm_ratio_rest', 'ℓ∞ / ℓ2 norm ratio', False, 'first token', 'other tokens'),
              ('max_abs_first', 'max_abs_rest', 'max |activation|', True, 'first token', 'other tokens')]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (solid, dashed, title, log, l1, l2) in zip(axes.flat, panels):
        for i, r in enumerate(results):
            y1, y2 = (np.array(r['per_layer'][k], dtype=float) for k in (solid, dashed))
            x = np.linspace(0, 1, len(y1)) if len(y1) > 1 else np.zeros(1)
            ax.plot(x, y1, '-o', color=f'C{i}', ms=3, label=run_label(r['model']))
            ax.plot(x, y2, '--', color=f'C{i}', alpha=0.6)
        ax.set(title=f'{title} (solid: {l1}, dashed: {l2})', xlabel='layer index (normalised)')
        if log:
            _log_scale_if_wide(ax, [v for r in results for k in (solid, dashed) for v in r['per_layer'][k]])
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def plot_training_curves(runs, path):
    """Appendix L: training loss and validation loss against iterations, from each run's log.jsonl."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (label, log) in enumerate(runs):
        train, val = read_log(log)
        ax.plot([e['iter'] for e in train], [e['loss'] for e in train], '-', color=f'C{i}', label=f'{label} train')
        ax.plot([e['iter'] for e in val], [e['val_loss'] for e in val], 'o--', color=f'C{i}', ms=4,
                label=f'{label} val')
    ax.set(xlabel='iteration', ylabel='loss (nats/token)', title='Training curves (log.jsonl)')
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


# the panels of trajectories.png: (title, [(probe key, line style, what the line is)]); a dotted line is drawn only
# for a run whose probes carry its key (first_attn_mass_nontrigger: data whose meta.json names "triggers")
TRAJECTORY_PANELS = [
    ('kurtosis (raw, Gaussian 3)', [('kurtosis_first', '-o', 'first token'), ('kurtosis_rest', '--', 'other tokens')]),
    ('max |activation|', [('max_abs_first', '-o', 'first token'), ('max_abs_rest', '--', 'other tokens')]),
    ('first-token attention', [('first_attn_argmax', '-o', 'argmax share'), ('first_attn_mass', '--', 'mass')]),
    ('attention mass (query > 0)', [('first_attn_mass', '-o', 'on the first token'),
                                    ('attn_nowhere', '--', 'nowhere: max(0, 1 - row sum)'),
                                    ('first_attn_mass_nontrigger', ':', 'first token, non-trigger queries')]),
    ('residual-state peak (max over layers)', [('resid_peak', '-o', '||h_0|| / median ||h_t||'),
                                               ('max_over_median_first', '--', 'max |h_0,c| / median |h_0,c|')]),
    ("the first token's norms", [('resid_norm_first', '-o', '||h_0|| (max over layers)'),
                                 ('value_norm_first', '--', '||v_0|| (mean over heads, layers)')]),
    ('value drain ||v_0|| / median ||v_t||', [('value_drain', '-o', 'mean over heads, layers'),
                                              ('value_drain_min', '--', 'the most drained head')]),
    ('attention rows (query > 0)', [('attn_row_sum', '-o', 'row sum'), ('attn_empty', '--', 'share of empty rows')]),
]

LINE_NAMES = {'-o': 'solid', '--': 'dashed', ':': 'dotted'}


def plot_trajectories(runs, path, panels=None):
    """Outlier dynamics: every probe of each run's log.jsonl (train.py's probe_docs at evaluations, and every
    probe_interval iterations between them; runs.read_probes) against the tokens seen, one colour per run, in the
    panels of TRAJECTORY_PANELS: kurtosis and max |activation| of the first token (solid) and of the other tokens
    (dashed), first-token attention (argmax share solid, mass dashed), the attention mass on the first token beside
    the mass that went nowhere, the residual-state peak, the first token's norms, the value drain, the rows' sums.
    A probe of an older log without a key leaves a gap. A log y-axis where a panel's values span more than a factor
    of 10. panels: a subset of TRAJECTORY_PANELS (the main job draws the first three, in one row). Runs without
    probes are left out; returns None when none has one."""
    plt = _pyplot()
    from matplotlib.ticker import EngFormatter
    curves = [(label, read_probes(log)) for label, log in runs]
    curves = [(label, evals) for label, evals in curves if evals]
    if not curves:
        return None
    colors = [f'C{i}' for i in range(10)] if len(curves) <= 10 else list(plt.cm.tab20.colors)
    panels = panels or TRAJECTORY_PANELS
    rows = 1 if len(panels) <= 4 else 2
    cols = math.ceil(len(panels) / rows)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4.6 * rows), layout='constrained', squeeze=False)
    axes = list(axes.flat)
    for ax, (title, lines) in zip(axes, panels):
        for i, (label, evals) in enumerate(curves):
            x = [e['tokens'] for e in evals]
            for n, (key, style, _) in enumerate(lines):
                if style == ':' and not any(key in e['probe'] for e in evals):
                    continue
                y = [math.nan if e['probe'].get(key) is None else e['probe'][key] for e in evals]
                ax.plot(x, y, style, color=colors[i % len(colors)], ms=3, alpha=1 if n == 0 else 0.6,
                        label=label if n == 0 else None)
        legend = (',\n' if len(lines) > 2 else ', ').join(f"{LINE_NAMES[style]}: {what}" for _, style, what in lines)
        ax.set(title=f'{title}\n({legend})', xlabel='tokens seen')
        ax.title.set_fontsize(9)
        ax.xaxis.set_major_formatter(EngFormatter())
        _log_scale_if_wide(ax, [e['probe'].get(k) for _, evals in curves for e in evals for k, _, _ in lines])
        ax.grid(alpha=0.3)
    docs = sorted({e['probe'].get('documents') for _, evals in curves for e in evals} - {None})
    fig.suptitle('Outlier dynamics during training: the probes of log.jsonl '
                 f"({'/'.join(map(str, docs)) or 'the first'} validation documents; each metric's mean over layers, E_m, "
                 f"unless a panel says otherwise)")
    fig.legend(*axes[0].get_legend_handles_labels(), loc='outside right upper', fontsize=8)
    return _save(fig, path)


def plot_optimizer_basis(runs, path):
    """Appendix E: per layer, MLP output-feature weight norms (left) and second-moment sums (right)."""
    plt = _pyplot()
    fig, axes = plt.subplots(len(runs), 2, figsize=(12, 3.6 * len(runs)), squeeze=False)
    for (left, right), (label, (norms, moments, note)) in zip(axes, runs):
        colors = plt.cm.viridis(np.linspace(0, 0.9, len(norms)))
        for m, (w, v) in enumerate(zip(norms, moments)):
            left.plot(w, color=colors[m], lw=0.8, label=f'layer {m + 1}')
            if v is not None:
                right.plot(v, color=colors[m], lw=0.8, label=f'layer {m + 1}')
        left.set(title=f'{label}: ‖W_out[d, :]‖ of the MLP output weight', xlabel='output feature d', ylabel='norm')
        right.set(title=f'{label}: Σ second moments over row d\n{note}', xlabel='row d of the state',
                  ylabel='sum of v')
        if any(v is not None for v in moments):
            right.set_yscale('log')
        else:
            right.text(0.5, 0.5, 'no second moments', ha='center', transform=right.transAxes)
        left.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return _save(fig, path)


# the extreme-token table (reproduce.py bb): per panel, the probe key of our runs (and the layer it is read at) and
# the curve of Guo et al.'s released dynamics drawn beside them (paper_tables.GUO_CURVES)
BB_PANELS = (('attention on <s> from non-trigger queries (layer 0)', 'first_attn_mass_nontrigger', 'attn_on_s'),
             ('‖h_<s>‖ after layer 0 (the residual-state peak)', 'resid_norm_first', 'resid_norm_s'),
             ('‖v_<s>‖ in layer 0 (the value-state drain)', 'value_norm_first', 'value_norm_s'))


def plot_bb_dynamics(runs, reference, path, note=''):
    """The extreme-token dynamics of reproduce.py's Bigram-Backcopy rows against training steps, in three panels
    (BB_PANELS), each read at layer 0 from the probes of log.jsonl: attention on <s> from the queries that are not
    triggers, the norm of <s>'s hidden state after the layer, and the norm of <s>'s value vector. runs: (label,
    log.jsonl, n_layer); one colour per variant, 1 layer solid, 3 layers dashed. reference: Guo et al.'s released
    curves ({label: {'step': [...], key: [...]}}), drawn in black and grey up to our last step. None when no run
    has a probe."""
    plt = _pyplot()
    curves = [(label, read_probes(log), n_layer) for label, log, n_layer in runs]
    curves = [c for c in curves if c[1]]
    if not curves:
        return None
    last = max(e['iter'] for _, evals, _ in curves for e in evals)

    def variant(label):   # '1 L, softmax + Adam (LR 0.0003)' -> 'softmax + Adam': one colour per variant
        return label.split(', ')[-1].split(' (')[0]

    variants = list(dict.fromkeys(variant(label) for label, _, _ in curves))
    fig, axes = plt.subplots(1, 3, figsize=(19, 5.2), layout='constrained')
    for ax, (title, key, theirs) in zip(axes, BB_PANELS):
        for label, evals, n_layer in curves:
            y = [(e['probe'].get('per_layer') or {}).get(key, [None])[0] for e in evals]
            ax.plot([e['iter'] for e in evals], [math.nan if v is None else v for v in y], '-' if n_layer == 1 else '--',
                    color=f"C{variants.index(variant(label)) % 10}", label=label)
        for i, (name, curve) in enumerate(reference.items()):   # one shade per curve, in every panel alike
            if theirs in curve:
                steps = [s for s in curve['step'] if s <= last]
                ax.plot(steps, curve[theirs][:len(steps)], ':' if i == 0 else '-.', lw=2,
                        color=('black', '0.3', '0.55', '0.75')[i % 4], label=f'Guo et al.: {name}')
        ax.set(title=title, xlabel='training step')
        if key == 'resid_norm_first':   # a norm can grow a hundredfold (ReLU attention's <s>): a log axis keeps the rest
            ax.set_yscale('log')
        ax.title.set_fontsize(10)
        ax.grid(alpha=0.3)
    fig.suptitle('Extreme-token dynamics on Bigram-Backcopy: ours (probes of log.jsonl, layer 0) beside Guo et al. '
                 f'(2024, their released curves){note}', fontsize=11)
    handles = {h.get_label(): h for ax in axes for h in ax.get_legend_handles_labels()[0]}
    fig.legend(list(handles.values()), list(handles), loc='outside right upper', fontsize=8)
    return _save(fig, path)


def plot_quant_bits(rows, path, title):
    """Where per-tensor quantisation breaks: left, each row's perplexity under coarse<b> (solid) and moderate<b>
    (dashed) over its full-precision perplexity, against the bit width b (log scale); right, the measured ratio max|x| /
    median|x| of the quantised layers' inputs (eval_quant.py's inputs, the layer where it is largest), with 2^b marked:
    a per-tensor step of max / (2^(b-1) - 1) rounds the median input to 0 once the ratio passes about 2^b. Two bars a
    row: the layers that read the normalised residual stream (eval_quant.RESIDUAL_READERS, where the hidden state's
    outlier channels enter; the bar that differs between models), and all layers (lighter: the MLP's GELU outputs,
    whose medians are near 0 in every model, set it). rows: [(label, eval_quant.py model entry)];
    claims.quant_curve reads the curves."""
    from harness.claims import BITS, quant_curve
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 0.28 * len(rows) + 4.2), layout='constrained',
                                      gridspec_kw={'width_ratios': [1.3, 1]})
    colours = plt.get_cmap('tab20' if len(rows) > 10 else 'tab10')
    for i, (label, quant) in enumerate(rows):
        full = quant.get('ppl', {}).get('full')
        for family, style in (('coarse', '-'), ('moderate', '--')):
            curve = quant_curve(quant, family)
            if curve and full:
                bits = sorted(curve)
                left.plot(bits, [curve[b][1] / full for b in bits], style, marker='o', ms=3, color=colours(i % 20),
                          label=label if family == 'coarse' else None)
    left.set(xlabel='bits (weights and activations, absmax per tensor)', ylabel='perplexity / full-precision perplexity',
             yscale='log', xticks=list(BITS), title='coarse<b> (solid): W, X, Y; moderate<b> (dashed): W, X')
    from matplotlib.ticker import FormatStrFormatter
    left.yaxis.set_major_formatter(FormatStrFormatter('%.2f'))
    left.yaxis.set_minor_formatter(FormatStrFormatter('%.2f'))
    left.grid(alpha=0.3, which='both')
    left.legend(fontsize=7, loc='upper right')
    inputs = [(q.get('inputs') or {}) for _, q in rows]
    residual = [(i.get('residual') or {}).get('max_over_median_max') for i in inputs]
    everywhere = [i.get('max_over_median_max') for i in inputs]
    ys, h, colour = np.arange(len(rows)), 0.4, [colours(i % 20) for i in range(len(rows))]
    right.barh(ys - h / 2, [r or 0 for r in residual], height=h, color=colour,
               label='layers reading the residual stream (attention QKV, MLP in)')
    right.barh(ys + h / 2, [r or 0 for r in everywhere], height=h, color=colour, alpha=0.3,
               label='all layers (set by the GELU outputs)')
    right.set_yticks(ys, [label for label, _ in rows], fontsize=7)
    right.invert_yaxis()
    right.legend(fontsize=7, loc='lower right')
    for b in BITS:
        right.axvline(2 ** b, color='grey', lw=0.8, ls=':')
        right.text(2 ** b, 1.0, f'{b}', fontsize=7, ha='center', va='bottom', color='grey',
                   transform=right.get_xaxis_transform())   # above the panel, clear of the bars and the legend
    right.set(xscale='log', xlim=(1, max([2 ** max(BITS) * 2] + [r * 1.5 for r in residual + everywhere if r])),
              xlabel='max|x| / median|x| of the quantised inputs (largest layer, mean over documents)')
    right.set_title('what a per-tensor scale spans (dotted: 2^b, b = 4..8)', pad=14)
    fig.suptitle(title)
    return _save(fig, path)


def plot_claims(series, path, title):
    """Table 5's claims over training, one panel a claim (claims.claim_series): the probe the claim is measured on
    against the tokens seen, for each row it names (or the ratio of two rows), its thresholds dotted, and each row's
    measured value (analyze.py's, on more documents than the probes) as a star at its last probe. A log y-axis where
    a panel spans more than a factor of 10. None when no row has a probe."""
    if not any(points for _, _, _, curves in series for _, points, _ in curves):
        return None
    plt = _pyplot()
    from matplotlib.ticker import EngFormatter, FormatStrFormatter
    cols, rows = 3, math.ceil(len(series) / 3)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.7 * rows), layout='constrained', squeeze=False)
    for ax, (name, _, thresholds, curves) in zip(axes.flat, series):
        for i, (label, points, final) in enumerate(curves):
            if points:
                ax.plot(*zip(*points), '-o', ms=3, color=f'C{i}', label=label)
            if final:
                ax.plot(*final, '*', ms=12, color=f'C{i}', markeredgecolor='black', markeredgewidth=0.6)
        for t in thresholds:
            ax.axhline(t, color='grey', ls=':', lw=1.2)
        ax.set(title=name, xlabel='tokens seen')
        ax.title.set_fontsize(10)
        ax.xaxis.set_major_formatter(EngFormatter())
        _log_scale_if_wide(ax, [v for _, points, final in curves for v in [y for _, y in points] + [final and final[1]]]
                           + list(thresholds))
        if ax.get_yscale() == 'log':   # kurtosis 3 to 60: plain numbers, not powers of ten
            ax.yaxis.set_major_formatter(FormatStrFormatter('%g'))
            ax.yaxis.set_minor_formatter(FormatStrFormatter('%g'))
        ax.grid(alpha=0.3)
        if any(points for _, points, _ in curves):
            ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(series):]:
        ax.set_visible(False)
    fig.suptitle(title)
    return _save(fig, path)


def plot_effects(points, path, title):
    """Each row of a table as one point (the mitigations: what each fix does, at equal tokens): left, the first
    token's kurtosis E_m[κ_m,1] (log x; a Gaussian's 3 marked) against its attention share %First Attn; right, the
    same kurtosis against the perplexity. points: [(label, kurtosis_first, first_attn_argmax, ppl)], a missing value
    None (that point is not drawn in the panels that need it). None when no point has a kurtosis."""
    drawn = [p for p in points if p[1] is not None]
    if not drawn:
        return None
    plt = _pyplot()
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2), layout='constrained')
    colors = [f'C{i}' for i in range(10)] if len(drawn) <= 10 else list(plt.cm.tab20.colors)
    for ax, (k, name) in zip(axes, ((2, '%First Attn (argmax share on the first token)'), (3, 'perplexity'))):
        for i, p in enumerate(drawn):
            if p[k] is not None:
                ax.plot(p[1], p[k], 'o', ms=7, color=colors[i % len(colors)], label=p[0] if k == 2 else None)
                ax.annotate(p[0].split(' ')[0], (p[1], p[k]), xytext=(4, 4), textcoords='offset points', fontsize=8)
        ax.axvline(3, color='grey', ls=':', lw=1)
        ax.set(xscale='log', xlabel='E_m[κ_m,1] (the first token\'s kurtosis; dotted: a Gaussian\'s 3)', ylabel=name)
        ax.xaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))   # 2, 5, 10, 20, 50: plain numbers
        ax.xaxis.set_major_formatter(FormatStrFormatter('%g'))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3, which='both')
    fig.legend(loc='outside right center', fontsize=8)
    fig.suptitle(title)
    return _save(fig, path)
