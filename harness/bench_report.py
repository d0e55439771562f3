"""What bench.py's numbers mean: the targets each ratio is judged against, the ratios derived from its rows,
the reasons to distrust a run, and the text report. bench.py measures; gpu_suite.py reads its JSON and reports it
with these same functions (no script imports another).
"""
import statistics


MAX_SPREAD = 0.10   # a ratio whose per-round values scatter more than this (IQR / median) is unreliable


def spread(values):
    """Interquartile range over the median (0 for fewer than 4 values' worth of quartiles)."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method='inclusive')
    return (q3 - q1) / statistics.median(values)


def fmt_bytes(n):
    return 'n/a' if n is None else f"{n / 2**20:,.1f} MiB"


def fmt_ratio(r, s=None):
    if r is None:
        return 'n/a'
    return f"{r:.3f}x" + ('' if s is None else f" ±{100 * s:.0f}%" + ('?' if s > MAX_SPREAD else ''))


ATTN_VARIANTS = {   # name in the JSON: what it runs (the first is every ratio's baseline)
    'softmax_sdpa': 'softmax, F.scaled_dot_product_attention (the kernel SDPA picks)',
    'softmax1': 'softmax-1 as the training path runs it (CUDA: the Triton kernel; CPU: the SDPA sink route)',
    'attn_bias': 'attention bias (a learnt key and value) as the training path runs it',
    'softmax1_sdpa_route': "softmax-1 by the SDPA sink route (CUDA's fallback; the CPU's path)",
    'softmax1_extra_key': 'softmax-1 through an extra zero key (the route dropout takes)',
    'softmax1_eager': 'softmax-1 with the T x T matrix materialised (the analysis path)',
}


def report(res):
    lines = [f"device: {res['device']} | torch {res['torch']} | {'quick' if res['quick'] else 'full'} | "
             f"times: min / median over rounds; ratios: median of per-round ratios ± spread (IQR / median)"]
    if res['attention']:
        names = list(ATTN_VARIANTS)
        lines += ['', f"1. attention forward+backward (ms; {res['attention'][0]['timing'].replace('_', ' ')} time); "
                  f"ratios over {names[0]}", f"{'B,H,T,d':<16} {'dtype':<9} " + ' '.join(f"{n:>19}" for n in names)]
        for r in res['attention']:
            ms = [f"{r[k]['min_s'] * 1e3:.3f} / {r[k]['median_s'] * 1e3:.3f}" for k in names]
            ratios = [fmt_ratio(r[attn_key(k)], r[attn_key(k) + '_spread']) for k in names[1:]]
            lines.append(f"{','.join(map(str, r['shape'])):<16} {r['dtype']:<9} " + ' '.join(f"{m:>19}" for m in ms))
            lines.append(f"{'':<16} {'ratio':<9} {'':>19} " + ' '.join(f"{x:>19}" for x in ratios))
    if res.get('tune'):
        lines += ['', '0. flash_sink tile shapes (ms, CUDA graph time; best first)']
        for r in res['tune']:
            f = sorted(r['forward_ms'].items(), key=lambda kv: kv[1])
            b = sorted(r['forward_backward_ms'].items(), key=lambda kv: kv[1])
            lines.append(f"{','.join(map(str, r['shape']))}: forward {', '.join(f'{k} {v:.3f}' for k, v in f)}")
            lines.append(f"{'':>{len(','.join(map(str, r['shape'])))}}  fwd+bwd {', '.join(f'{k} {v:.3f}' for k, v in b)}")
    if res['optimizer']:
        lines += ['', '2. optimizer step (ms) and state',
                  f"{'model':<6} {'params':>8} {'optimizer':<28} {'min / median':>17} {'state':>13} {'step/AdamW':>13}"
                  f" {'state/AdamW':>12}"]
        for r in res['optimizer']:
            lines.append(f"{r['model']:<6} {r['params'] / 1e6:>7.1f}M {r['optimizer']:<28} "
                         f"{r['min_s'] * 1e3:>7.1f} / {r['median_s'] * 1e3:>7.1f} {fmt_bytes(r['state_bytes']):>13} "
                         f"{fmt_ratio(r['step_over_adamw'], r['step_over_adamw_spread']):>13} "
                         f"{r['state_over_adamw']:>11.4f}x")
    if res['train']:
        lines += ['', '3. training step (forward, backward, clip, optimizer)',
                  f"{'model':<6} {'variant':<20} {'accum x B x T':>14} {'dtype':<9} {'compile':<7} {'min / median ms':>19}"
                  f" {'tokens/s':>10} {'MFU':>6} {'memory':>22} {'step/vanilla':>14}"]
        for r in res['train']:
            mfu = 'n/a' if r['mfu'] is None else f"{100 * r['mfu']:.1f}%"
            mem = f"{fmt_bytes(r['peak_memory_bytes'])} {'peak' if r['memory_kind'].startswith('cuda') else 'p+g+s'}"
            shape = f"{r['grad_accum']}x{r['batch_size']}x{r['block_size']}"
            ratio = fmt_ratio(r['step_over_vanilla'], r['step_over_vanilla_spread']) if 'step_over_vanilla' in r else '-'
            lines.append(f"{r['model']:<6} {r['variant']:<20} {shape:>14} {r['dtype']:<9} "
                         f"{str(r['compile']):<7} {r['min_s'] * 1e3:>8.1f} / {r['median_s'] * 1e3:>8.1f} "
                         f"{r['tokens_per_s']:>10,.0f} {mfu:>6} {mem:>22} {ratio:>14}")
    if res.get('bf16'):
        lines += ['', "4. a CPU config's training step by precision path (its model, optimizer and batch; speed-up: "
                      "fp32 eager's time / the path's, per round)",
                  f"{'config':<7} {'path':<14} {'tokens':>8} {'min / median ms':>21} {'tokens/s':>10} "
                  f"{'speed-up':>13} {'peak memory':>12}"]
        for r in res['bf16']:
            mem = 'n/a' if r['peak_memory_bytes'] is None else fmt_bytes(r['peak_memory_bytes'])
            lines.append(f"{r['case']:<7} {r['path']:<14} {r['tokens']:>8,} {r['min_s'] * 1e3:>9.1f} / "
                         f"{r['median_s'] * 1e3:>9.1f} {r['tokens_per_s']:>10,.0f} "
                         f"{fmt_ratio(r['speedup'], r['speedup_spread']):>13} {mem:>12}")
    cuda = res['device'].split(' ')[0] != 'cpu'
    lines += ['', f"targets ({'CUDA' if cuda else 'CPU'}; median ratios)",
              f"  {'target':<58} {'measured':>9} {'wanted':>9}  met"]
    for t in judge(res):
        value = 'n/a' if t['value'] is None else f"{t['value']:.3f}"
        met = {None: 'not measured' if t['value'] is None else 'no target here', True: 'yes', False: 'NO'}[t['met']]
        lines.append(f"  {t['name']:<58} {value:>9} {t['target']:>9}  {met}")
    if res['unreliable']:
        lines += ['', 'UNRELIABLE timings (rerun on an idle machine, or with more --repeats):']
        lines += [f"  {u}" for u in res['unreliable']]
    return '\n'.join(lines)


# (name, key of bench.py's JSON, comparison, target on CUDA, target on the CPU or None where it is CUDA's alone)
TARGETS = [('softmax-1 / softmax attention fwd+bwd (worst shape)', 'attn_softmax1_over_softmax', '<=', 1.03, 1.05),
           ('attention bias / softmax attention fwd+bwd (worst shape)', 'attn_bias_over_softmax', '<=', 1.05, None),
           ('OrthoAdam / fused AdamW step (largest model)', 'optim_step_orthoadam_over_adamw', '<=', 1.5, 4.0),
           ('OrthoAdam / AdamW optimizer state', 'optim_state_orthoadam_over_adamw', '<=', 1.05, 1.05),
           ('softmax-1 + OrthoAdam / vanilla training step, 60M', 'train_step_s1oa_over_vanilla_60m', '<=', 1.03, None),
           ('softmax-1 + OrthoAdam / vanilla training step, 130M', 'train_step_s1oa_over_vanilla_130m', '<=', 1.03,
            None),
           ('vanilla 130M MFU (paper batch, T = 256)', 'mfu_vanilla_130m', '>=', 0.45, None),
           ('bf16 compiled / fp32 eager tokens/s, config/laptop/base.py', 'bf16_speedup_laptop', '>=', None, 2.5)]


def judge(res):
    """Each target with its measured value and whether it is met (None: not measured on this device)."""
    cuda = not str(res.get('device', 'cpu')).startswith('cpu')
    out = []
    for name, key, op, on_cuda, on_cpu in TARGETS:
        target, value = on_cuda if cuda else on_cpu, res.get(key)
        met = None if value is None or target is None else (value >= target if op == '>=' else value <= target)
        out.append({'name': name, 'key': key, 'value': value, 'target': '-' if target is None else f"{op} {target}",
                    'met': met})
    return out


def derive(res):
    """The target ratios (TARGETS' keys) from the rows measured so far; None where not measured."""
    default = [r for r in res['optimizer'] if r['optimizer'] == 'orthoadam hadamard/residual']
    for key in ('softmax1_over_softmax', 'attn_bias_over_softmax', 'extra_key_over_softmax'):
        res['attn_' + key.removeprefix('attn_')] = max((r[key] for r in res['attention']), default=None)
    res['optim_state_orthoadam_over_adamw'] = default[-1]['state_over_adamw'] if default else None
    res['optim_step_orthoadam_over_adamw'] = default[-1]['step_over_adamw'] if default else None
    first = [r for r in res['train'] if 'step_over_vanilla' in r and (r['model'], r['block_size']) ==
             (res['train'][0]['model'], res['train'][0]['block_size'])]
    res['train_step_s1oa_over_vanilla'] = first[0]['step_over_vanilla'] if first else None
    res['train_step_s1oa_over_vanilla_by_accum'] = {str(r['grad_accum']): r['step_over_vanilla'] for r in first}
    for size in ('60m', '130m'):   # the paper's step: the first grad_accum measured at T = 256
        rows = [r for r in res['train'] if r['model'] == size and r['block_size'] == 256]
        ratio = [r['step_over_vanilla'] for r in rows if 'step_over_vanilla' in r]
        mfu = [r['mfu'] for r in rows if r['variant'] == 'vanilla']
        res[f'train_step_s1oa_over_vanilla_{size}'] = ratio[0] if ratio else None
        res[f'mfu_vanilla_{size}'] = mfu[0] if mfu else None
    for case, path in (('laptop', 'bf16 compiled'), ('bb', 'bf16 eager')):   # the path each config trains with
        rows = [r['speedup'] for r in res.get('bf16', ()) if (r['case'], r['path']) == (case, path)]
        res[f'bf16_speedup_{case}'] = rows[0] if rows else None
    return res


def attn_key(name):
    """The ratio key of an attention variant in bench.py's JSON rows: softmax1 -> softmax1_over_softmax,
    softmax1_extra_key -> extra_key_over_softmax, attn_bias -> attn_bias_over_softmax."""
    return ('softmax1' if name == 'softmax1' else name.removeprefix('softmax1_')) + '_over_softmax'


def unreliable(res, busy):
    """The reasons to distrust this run's ratios: a busy machine, and each ratio that scatters too much."""
    reasons = [busy] if busy else []
    for r in res['attention']:
        for key in ('softmax1_over_softmax', 'attn_bias_over_softmax', 'extra_key_over_softmax'):
            if r[key + '_spread'] > MAX_SPREAD:
                reasons.append(f"attn {','.join(map(str, r['shape']))} {key}: spread {100 * r[key + '_spread']:.0f}%")
    for r in res['optimizer']:
        if r['step_over_adamw_spread'] > MAX_SPREAD:
            reasons.append(f"optim {r['model']} {r['optimizer']}: spread {100 * r['step_over_adamw_spread']:.0f}%")
    for r in res.get('bf16', ()):
        if r['speedup_spread'] > MAX_SPREAD:
            reasons.append(f"bf16 {r['case']} {r['path']}: spread {100 * r['speedup_spread']:.0f}%")
    for r in res['train']:
        if r.get('step_over_vanilla_spread', 0) > MAX_SPREAD:
            reasons.append(f"train {r['model']} {r['grad_accum']}x{r['batch_size']}x{r['block_size']}: spread "
                           f"{100 * r['step_over_vanilla_spread']:.0f}%")
    return reasons
