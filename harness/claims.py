"""The paper's claims, checked on the laptop scale's tables (reproduce.py --goal --scale laptop): Table 5's ablation
claims on the first token (table5_claims), the run-to-run spread of the seed replicas that says which differences
mean something (spread), and the bit width at which per-tensor quantisation separates vanilla from softmax-1 +
OrthoAdam (quant_separation). Each returns [(text, ok)] with ok None where a number is missing; claim_lines turns
them into the lines reproduce.py prints; claim_series gives the claims' figure its curves. Data in, verdicts out:
no file is read here.

    python reproduce.py table5 --scale laptop --jobs 2 --goal
    python reproduce.py table2 table3 --scale laptop --jobs 2 --goal
"""
import math

# the keys the spread is measured on (analyze.py's JSON)
SPREAD_KEYS = ('ppl', 'kurtosis_first', 'kurtosis_rest', 'first_attn_argmax', 'first_attn_mass', 'max_abs_first')
# the per-tensor schemes whose bit width is swept (eval_quant.py's coarse<b> and moderate<b>; coarse8 = coarse)
BITS = (4, 5, 6, 7, 8)
QUANT_RATIO = 3.0      # vanilla's penalty at least this many times softmax-1 + OrthoAdam's ...
QUANT_BUDGET = 0.05    # ... while softmax-1 + OrthoAdam's stays within this share of its perplexity
QUANT_FLOOR = 0.01     # PPL: a penalty below this counts as this much (a ratio to ~0 means nothing)
INFO = 'info'          # a line shown beside the claims, not one of them


def value(results, key):
    """results[key] when it is a finite number, else None (a missing row or metric says nothing)."""
    v = results.get(key) if isinstance(results, dict) else None
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def spread(pairs, keys=SPREAD_KEYS):
    """{key: [(centre, factor)]} of the seed replicas [(results of seed 1337, results of seed 2)]: for each metric and
    each pair with both numbers, the geometric mean of the two and their max/min ratio (1.0 = identical); [] where no
    pair has them. Metrics here are positive and span decades (kurtosis 3 to 40), and a pair's ratio is the spread
    where its values are: vanilla's where the outliers are, softmax-1 + OrthoAdam's near a Gaussian's 3."""
    out = {}
    for key in keys:
        out[key] = sorted((math.sqrt(a * b), max(a, b) / min(a, b))
                          for a, b in ((value(x, key), value(y, key)) for x, y in pairs)
                          if a is not None and b is not None and min(a, b) > 0)
    return out


def spread_at(v, regimes):
    """The spread that judges the value v: the factor of the seed pair whose centre is nearest v on a log scale
    (spread()'s [(centre, factor)] of one metric); None without a pair or a positive v."""
    if not regimes or v is None or v <= 0:
        return None
    return min(regimes, key=lambda cf: abs(math.log(v / cf[0])))[1]


def _beyond(a, b, regimes, threshold):
    """For a claim on the ratio a / b of two rows' values: ' (beyond the seeds' spread x1.23)' when the two values differ
    by more than the larger of the spreads nearest each, ' (WITHIN ...)' otherwise, and '; within x1.51 of the
    threshold' when the ratio is that close to it: each value may move by its own factor, the ratio by their product.
    '' without a spread."""
    fa, fb = spread_at(a, regimes), spread_at(b, regimes)
    if fa is None or fb is None:
        return ''
    factor, ratio, both = max(fa, fb), a / b, fa * fb
    near = f"; within ×{both:.2f} of the threshold" if ratio / both <= threshold <= ratio * both else ''
    return f" ({'beyond' if max(a, b) / min(a, b) > factor else 'WITHIN'} the seeds' spread ×{factor:.2f}{near})"


def _near(v, threshold, regimes):
    """' (within the seeds' spread ×1.23 of the threshold)' when the spread nearest v could carry it across."""
    factor = spread_at(v, regimes)
    if factor is None or not v / factor <= threshold <= v * factor:
        return ''
    return f" (within the seeds' spread ×{factor:.2f} of the threshold)"


def _fmt(v, spec='.3g'):
    return '–' if v is None else format(v, spec)


def _all(oks):
    return None if any(ok is None for ok in oks) else all(oks)


def table5_claims(rows, spreads=None):
    """The paper's Table 5 claims on the laptop rows, measured on the first token's kurtosis E_m[κ_m,1]
    (kurtosis_first) and its attention share (first_attn_argmax). rows: {row number 1..14: analysis results or
    None}; spreads: spread()'s {key: [(centre, factor)]} or None. Returns [(text, ok)]."""
    k = {n: value(r, 'kurtosis_first') for n, r in rows.items()}
    a = {n: value(r, 'first_attn_argmax') for n, r in rows.items()}
    kr = {n: value(r, 'kurtosis_rest') for n, r in rows.items()}
    sk, sa = (spreads or {}).get('kurtosis_first'), (spreads or {}).get('first_attn_argmax')
    out = []

    def at_least(n, v, t):
        return None if v.get(n) is None else v[n] >= t

    def at_most(n, v, t):
        return None if v.get(n) is None else v[n] <= t

    oks = [x for n in (1, 2, 3, 4) for x in (at_least(n, a, 0.15), at_least(n, k, 15))]
    out.append(("(a) softmax + Adam, rows 1-4 (biases, none, no positions, rotary): %First Attn >= 0.15 and κ_first "
                ">= 15 in each: " + '; '.join(f"row {n} {_fmt(a.get(n))}{_near(a.get(n), 0.15, sa)}, "
                                              f"{_fmt(k.get(n))}{_near(k.get(n), 15, sk)}" for n in (1, 2, 3, 4)),
                _all(oks)))
    ratio = None if None in (a.get(5), a.get(2)) or not a[2] else a[5] / a[2]
    out.append((f"(b) softmax-1 (row 5): %First Attn <= 1/2 of row 2's: {_fmt(a.get(5))} / {_fmt(a.get(2))} = "
                f"{_fmt(ratio)}{_beyond(a.get(5), a.get(2), sa, 0.5)}", None if ratio is None else ratio <= 0.5))
    out.append(("(c) softmax-1 alone keeps the outliers, rows 5-7 (LayerNorm, RMSNorm-M, RMSNorm-S): κ_first >= 10: "
                + ', '.join(f"row {n} {_fmt(k.get(n))}{_near(k.get(n), 10, sk)}" for n in (5, 6, 7)),
                _all([at_least(n, k, 10) for n in (5, 6, 7)])))
    out.append((f"(d) RMSProp (row 8) keeps them, κ_first >= 10: {_fmt(k.get(8))}{_near(k.get(8), 10, sk)}; SGD with "
                f"and without momentum (rows 9, 10) remove them, <= 5: {_fmt(k.get(9))}{_near(k.get(9), 5, sk)}, "
                f"{_fmt(k.get(10))}{_near(k.get(10), 5, sk)}",
                _all([at_least(8, k, 10), at_most(9, k, 5), at_most(10, k, 5)])))
    ratio = None if None in (a.get(11), a.get(2)) or not a[2] else a[11] / a[2]
    out.append((f"(e) OrthoAdam + softmax-1 + RMSNorm-S (row 11): κ_first <= 5: {_fmt(k.get(11))}"
                f"{_near(k.get(11), 5, sk)}; %First Attn <= 1/2 of row 2's: {_fmt(a.get(11))} / {_fmt(a.get(2))} = "
                f"{_fmt(ratio)}{_beyond(a.get(11), a.get(2), sa, 0.5)}",
                _all([at_most(11, k, 5), None if ratio is None else ratio <= 0.5])))
    ratio = None if None in (a.get(12), a.get(11)) or not a[11] else a[12] / a[11]
    out.append((f"(f) OrthoAdam with softmax (row 12) brings first-token dominance back, %First Attn >= 2x row 11's: "
                f"{_fmt(a.get(12))} / {_fmt(a.get(11))} = {_fmt(ratio)}{_beyond(a.get(12), a.get(11), sa, 2)}",
                None if ratio is None else ratio >= 2))
    ratios = {n: None if None in (k.get(n), k.get(11)) or not k[11] else k[n] / k[11] for n in (13, 14)}
    out.append(("(g) OrthoAdam with RMSNorm-M (row 13) or LayerNorm (row 14) brings the outliers back, κ_first >= 2x "
                "row 11's (paper: 380.9 and 188.4 against 3.0): " + '; '.join(
                    f"row {n} {_fmt(k.get(n))} / {_fmt(k.get(11))} = {_fmt(ratios[n])}{_beyond(k.get(n), k.get(11), sk, 2)}"
                    for n in (13, 14)), _all([None if r is None else r >= 2 for r in ratios.values()])))
    out.append(("the other tokens' kurtosis E_m[κ_m,>1] by row: " + ', '.join(f"{n} {_fmt(kr.get(n))}"
                                                                            for n in sorted(kr)), INFO))
    m = {n: value(r, 'first_attn_mass') for n, r in rows.items()}   # softmax-1 can lower the weight, not the argmax

    def over(n, d):
        return _fmt(None if m.get(n) is None or not m.get(d) else m[n] / m[d])
    out.append(("the first token's mean attention weight by row: " + ', '.join(f"{n} {_fmt(m.get(n))}" for n in sorted(m))
                + f"; row 5 / row 2 {over(5, 2)}, row 11 / row 2 {over(11, 2)}, row 12 / row 11 {over(12, 11)}", INFO))
    return out


# table5_claims.png (reproduce.py draws it with Table 5): one panel a claim, the probe it is measured on against the
# tokens seen, for the rows it names; a pair (n, d) is row n's value over row d's at the steps both probed; the
# claim's thresholds dotted. (title, probe key, rows, thresholds)
CLAIM_PANELS = (
    ('(a) rows 1-4: κ_first ≥ 15', 'kurtosis_first', (1, 2, 3, 4), (15,)),
    ('(a) rows 1-4: %First Attn ≥ 0.15', 'first_attn_argmax', (1, 2, 3, 4), (0.15,)),
    ('(b) %First Attn, row 5 / row 2 ≤ 0.5', 'first_attn_argmax', ((5, 2),), (0.5,)),
    ('(c) rows 5-7: κ_first ≥ 10', 'kurtosis_first', (5, 6, 7), (10,)),
    ('(d) κ_first: RMSProp (8) ≥ 10, SGD (9, 10) ≤ 5', 'kurtosis_first', (8, 9, 10), (10, 5)),
    ('(e) row 11: κ_first ≤ 5', 'kurtosis_first', (11,), (5,)),
    ('(e) %First Attn, row 11 / row 2 ≤ 0.5', 'first_attn_argmax', ((11, 2),), (0.5,)),
    ('(f) %First Attn, row 12 / row 11 ≥ 2', 'first_attn_argmax', ((12, 11),), (2,)),
    ('(g) κ_first, rows 13 and 14 / row 11 ≥ 2', 'kurtosis_first', ((13, 11), (14, 11)), (2,)),
)


def claim_series(probes, finals, panels=CLAIM_PANELS):
    """The curves of the claims' figure: [(title, key, thresholds, [(label, [(tokens, value)], final)])] for each
    panel, from each row's probes ({row: [(tokens, probe)]}, log.jsonl's: a few validation documents) and its measured
    results ({row: analysis results}, analyze.py's: more documents, the table's numbers). A ratio's points are at the
    tokens both rows probed, its final the ratio of the two measured values; final is (the last point's tokens,
    value), None when a measurement or every probe is missing."""
    out = []
    for title, key, drawn, thresholds in panels:
        curves = []
        for spec in drawn:
            num, den = spec if isinstance(spec, tuple) else (spec, None)
            seen = {t: value(p, key) for t, p in probes.get(num) or []}
            fin = value(finals.get(num), key)
            if den is not None:
                under = {t: value(p, key) for t, p in probes.get(den) or []}
                seen = {t: v / under[t] for t, v in seen.items() if v is not None and under.get(t)}
                low = value(finals.get(den), key)
                fin = fin / low if fin is not None and low else None
            points = sorted((t, v) for t, v in seen.items() if v is not None)
            label = f'row {num}' if den is None else f'row {num} / row {den}'
            curves.append((label, points, (points[-1][0], fin) if points and fin is not None else None))
        out.append((title, key, thresholds, curves))
    return out


def spread_lines(pairs, labels):
    """The seed replicas, one line per pair with its ratio for each metric, and spread()'s regimes."""
    def ratio(x, y, key):
        a, b = value(x, key), value(y, key)
        return '' if a is None or b is None or min(a, b) <= 0 else f" (×{max(a, b) / min(a, b):.2f})"
    lines = [f"spread: {label}: " + ', '.join(f"{key} {_fmt(value(x, key))} / {_fmt(value(y, key))}{ratio(x, y, key)}"
                                              for key in SPREAD_KEYS) for (x, y), label in zip(pairs, labels)]
    lines.append("spread: a value is judged by the ratio of the pair nearest it (log scale), two values by the larger "
                 "of theirs")
    return lines, spread(pairs)


def quant_curve(quant, family):
    """{bits: (Δ perplexity, perplexity with the scheme)} of one eval_quant.py model entry for coarse or moderate at
    BITS (8 bits: the scheme's plain name, coarse / moderate, or family + '8')."""
    out = {}
    for b in BITS:
        names = (f'{family}{b}',) + ((family,) if b == 8 else ())
        for name in names:
            d = value((quant or {}).get('delta', {}), name)
            if d is not None:
                out[b] = (d, value(quant['ppl'], name))
                break
    return out


def quant_separation(vanilla, s1oa):
    """Where per-tensor quantisation separates the models: for each family (coarse, moderate) and bit width, vanilla's
    penalty over softmax-1 + OrthoAdam's (a penalty below QUANT_FLOOR counts as that) and softmax-1 + OrthoAdam's
    penalty over its own perplexity. The goal is met at a width where the ratio is >= QUANT_RATIO and the share
    <= QUANT_BUDGET. vanilla, s1oa: eval_quant.py model entries. Returns (lines, verdict): a line per family and
    width, then the verdict line; verdict None when no width was measured."""
    lines, widths, measured = [], [], 0
    full = value((s1oa or {}).get('ppl', {}), 'full')
    for family in ('coarse', 'moderate'):
        cv, cs = quant_curve(vanilla, family), quant_curve(s1oa, family)
        for b in BITS:
            if b not in cv or b not in cs or full is None:
                lines.append(f"{family}{b}: not measured")
                continue
            (dv, _), (ds, _) = cv[b], cs[b]
            ratio, share = dv / max(ds, QUANT_FLOOR), ds / full
            measured += 1
            if ratio >= QUANT_RATIO and share <= QUANT_BUDGET:
                widths.append(f'{family}{b}')
            lines.append(f"{family}{b}: Δ vanilla {dv:+.3f}, Δ s1+OA {ds:+.3f} ({share:.1%} of its {full:.3f}), "
                         f"ratio {ratio:.2f}: {'separates' if f'{family}{b}' in widths else 'does not separate'}")
    verdict = None if not measured else bool(widths)
    lines.append(f"quantisation goal (vanilla's penalty >= {QUANT_RATIO:g}x s1+OA's, s1+OA's <= {QUANT_BUDGET:.0%}): "
                 + ('MISSING (no width measured)' if verdict is None else
                    f"met at {', '.join(widths)}" if verdict else 'not met at any width'))
    return lines, verdict


def claim_lines(results, name):
    """[(text, ok)] as printed lines ('met: ...', 'not met: ...', 'MISSING: ...', INFO lines 'measured (not a claim):
    ...') and one verdict line, met when every claim is."""
    word = lambda ok: 'measured (not a claim)' if ok == INFO else 'met' if ok else 'MISSING' if ok is None else 'not met'
    lines = [f"{word(ok)}: {text}" for text, ok in results]
    claims = [ok for _, ok in results if ok != INFO]
    verdict = all(claims)
    return lines + [f"{name}: {'met' if verdict else 'not met'} ({sum(1 for ok in claims if ok)} of {len(claims)} "
                    f"met)"], verdict


def bits_table(rows):
    """(markdown, json rows) of where per-tensor quantisation breaks, one row per model: full-precision perplexity,
    Δ under coarse<b> and moderate<b> at each of BITS, and the measured max|x| / median|x| of the quantised inputs:
    the largest over the layers that read the normalised residual stream (eval_quant.RESIDUAL_READERS: where the
    hidden state's outlier channels enter), and the largest over all layers (the MLP's GELU outputs, whose medians
    are near 0, set it). rows: [(label, eval_quant.py model entry)]."""
    header = (['row', 'full'] + [f'{f}{b} Δ' for f in ('coarse', 'moderate') for b in reversed(BITS)]
              + ['max/median, residual readers (largest layer)', 'max/median, all layers (largest)'])
    lines, out = ['| ' + ' | '.join(header) + ' |', '|' + '|'.join(' --- ' if i == 0 else ' ---: '
                                                                  for i in range(len(header))) + '|'], []
    for label, quant in rows:
        full = value((quant or {}).get('ppl', {}), 'full')
        curves = {f: quant_curve(quant, f) for f in ('coarse', 'moderate')}
        inputs = (quant or {}).get('inputs') or {}
        residual = inputs.get('residual') or {}
        high, everywhere = value(residual, 'max_over_median_max'), value(inputs, 'max_over_median_max')
        cells = [label, _fmt(full, '.3f')] + [_fmt(curves[f].get(b, (None,))[0], '+.3f') for f in ('coarse', 'moderate')
                                              for b in reversed(BITS)]
        cells += [f"{_fmt(high, '.1f')}" + (f" ({residual['layer']})" if residual.get('layer') else ''),
                  _fmt(everywhere, ',.0f')]
        lines.append('| ' + ' | '.join(cells) + ' |')
        out.append({'label': label, 'full': full, 'delta': {f'{f}{b}': curves[f].get(b, (None,))[0]
                                                            for f in ('coarse', 'moderate') for b in BITS},
                    'residual_max_over_median': high, 'residual_layer': residual.get('layer'),
                    'all_max_over_median': everywhere, 'all_layer': inputs.get('layer')})
    return '\n'.join(lines), out
