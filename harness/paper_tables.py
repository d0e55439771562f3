"""The tables reproduce.py renders: each row's config (config/<table>/...) and label cells, the columns (which
result file and key each reads), and the paper's published numbers beside them. Data, no logic: reproduce.py
plans, runs and renders them."""
from dataclasses import dataclass

@dataclass
class Row:
    config: str                    # config/<config>.py
    labels: tuple                  # the row's label cells, as the paper prints them
    paper: tuple                   # the paper's numbers, in the order of the table's paper columns
    steps: int = 1                 # schedule factor (Table 5's SGD rows train 8x longer)


@dataclass
class Table:
    title: str
    label_names: tuple
    columns: tuple                 # (name, source 'analysis' | 'quant', key, format or (ours, paper's), in the paper?)
    rows: list


def _grid(size, model, n, numbers):
    flags = {'vanilla': ('✗', '✗'), 's1': ('✓', '✗'), 'oa': ('✗', '✓'), 's1oa': ('✓', '✓')}
    return [Row(f'table2/{size}_{v}', (model, n) + flags[v], nums) for v, nums in numbers.items()]


# Guo et al.'s released values for their 1-layer softmax + Adam run (the only one with all three curves): attention on
# <s> from non-trigger queries at step 300 and step 1,000, ||h_<s>|| after layer 0 and ||v_<s>|| in layer 0 at 1,000
# (docs/results/bb-guo-reference.json)
GUO_1L_ADAM = (0.560, 0.779, 27.0, 4.92)
# the residual-peak pilots (config/bb/pilots/): name, attention, optimizer
BB_PILOTS = (('3l_adam', 'softmax', 'Adam'), ('3l_sgd', 'softmax', 'SGD'), ('3l_orthoadam', 'softmax', 'OrthoAdam'))
# the laptop pilots (config/laptop/pilots/): name, the lever against config/laptop/base.py
LAPTOP_PILOTS = (('p01_bytes', 'the base at 1,500 steps: bytes, BOS at 0, T 256, 4 x 256, LR 2e-3, β2 0.95'),
                 ('p02_bb', "Bigram-Backcopy (Shakespeare's characters) instead of bytes, 1,500 steps"),
                 ('p03_wd05', 'weight decay 0.5 instead of 0.1, 900 steps (the base since)'),
                 ('p04_ctx512', 'context 512 (8 x 512 tokens a step) instead of 256, 900 steps'),
                 ('p05_constlr', 'a constant LR of 2e-3 instead of the cosine decay to 2e-4, 900 steps'),
                 ('p06_random', 'windows cut anywhere (an arbitrary byte at position 0) instead of at document starts, 900 steps'),
                 ('p07_archive', "the archive subset's 44,932 document starts instead of the CPU subset's 4,724, 900 steps"),
                 ('p08_archive1800', 'p07 for 1,800 steps (the cosine stretched to match)'))
T2 = ('ppl', 'kurtosis_first', 'kurtosis_rest', 'max_abs_first', 'max_abs_rest', 'first_attn_argmax')
Q = [('full', 'quant', 'ppl.full', ('.3f', '.2f'), True)] + [   # ours to 0.001: the laptop rows' Δ is 0.005-0.015
    (name, 'quant', f'{part}.{scheme}', ('.3f', '.2f'), True)
    for scheme, label in (('coarse', 'coarse'), ('moderate', 'moderate'), ('fine', 'fine'), ('zeropoint4', '4-bit'))
    for part, name in (('ppl', label), ('delta', 'Δ'))]
TABLES = {
    'main': Table(
        "The main job (ours): the paper's effect in ten minutes on two CPU cores, the same small model trained twice on "
        "the bytes of the pinned corpus's CPU subset, vanilla (softmax, AdamW) and with both fixes (softmax-1, "
        "OrthoAdam) (config/main_vanilla.py, config/main.py)",
        ('Model', 'Attention', 'Optimizer'),
        (('PPL', 'analysis', 'ppl', '.3f', False), ('E_m[κ_m,1]', 'analysis', 'kurtosis_first', '.1f', False),
         ('E_m[κ_m,>1]', 'analysis', 'kurtosis_rest', '.2f', False),
         ('First Attn (argmax)', 'analysis', 'first_attn_argmax', '.3f', False),
         ('First mass', 'analysis', 'first_attn_mass', '.3f', False),
         ('E_m[max|X_m,1,d|]', 'analysis', 'max_abs_first', '.1f', False)),
        [Row('main_vanilla', ('vanilla', 'softmax', 'AdamW'), ()),
         Row('main', ('softmax-1 + OrthoAdam', 'softmax-1', 'OrthoAdam'), ())]),
    'table2': Table(
        "Table 2: softmax-1 and OrthoAdam in GPT-2 and Llama-2 (E_m = mean over layers)",
        ('Model', '#Parameters', 'Softmax+1?', 'OrthoAdam?'),
        tuple((name, 'analysis', key, fmt, True) for name, key, fmt in zip(
            ('PPL', 'E_m[κ_m,1]', 'E_m[κ_m,>1]', 'E_m[X_m,1,d]', 'E_m[X_m,>1,d]', '%First Attn'), T2,
            (('.3f', '.1f'), '.1f', '.1f', '.1f', '.1f', '.3f'))),   # PPL: ours to 0.1% (the laptop rows' is ~2.8)
        _grid('gpt2_60m', 'GPT2', '60M', {'vanilla': (31.9, 313.8, 77.9, 1856.1, 266.6, 0.489),
                                          's1': (31.6, 105.6, 81.4, 304.9, 259.0, 0.021),
                                          'oa': (32.4, 260.8, 10.6, 1419.9, 114.7, 0.365),
                                          's1oa': (31.8, 7.6, 7.0, 92.8, 87.8, 0.019)})
        + _grid('gpt2_130m', 'GPT2', '130M', {'vanilla': (22.9, 514.9, 141.5, 7018.1, 1014.8, 0.527),
                                              's1': (22.7, 175.4, 144.2, 1134.3, 967.5, 0.024),
                                              'oa': (23.1, 446.4, 20.2, 4285.0, 433.4, 0.424),
                                              's1oa': (22.8, 10.1, 7.3, 318.1, 261.6, 0.019)})
        + _grid('gpt2_350m', 'GPT2', '350M', {'vanilla': (16.4, 820.3, 161.8, 40196.0, 3801.1, 0.579),
                                              's1oa': (16.3, 3.1, 3.1, 388.1, 333.3, 0.021)})
        + _grid('gpt2_1.4b', 'GPT2', '1.4B', {'vanilla': (13.4, 1656.5, 351.9, 56798.3, 7051.2, 0.648),
                                              's1oa': (13.3, 3.1, 3.0, 181.9, 132.1, 0.033)})
        + _grid('llama2_130m', 'Llama2', '130M', {'vanilla': (17.4, 435.0, 170.0, 4622.7, 1627.4, 0.105),
                                                  's1': (17.2, 208.2, 181.2, 1340.4, 1229.5, 0.016),
                                                  'oa': (17.4, 435.8, 169.5, 4685.9, 1629.1, 0.103),
                                                  's1oa': (17.3, 4.2, 6.9, 161.1, 157.0, 0.017)})),
    'table3': Table(
        "Table 3: perplexity under absmax int8 (coarse / moderate / fine) and zeropoint int4 weights (Δ = quantised - full)",
        ('Model', '#Parameters', 'OA + S1?'), tuple(Q),
        [Row(f'table2/{size}_{v}', (model, n, '✓' if v == 's1oa' else '✗'), nums) for size, model, n, v, nums in (
            ('gpt2_60m', 'GPT2', '60M', 'vanilla', (31.88, 43.53, 11.65, 34.87, 2.99, 32.15, 0.27, 68.5, 36.6)),
            ('gpt2_60m', 'GPT2', '60M', 's1oa', (31.83, 32.30, 0.47, 32.18, 0.35, 31.89, 0.06, 33.9, 2.1)),
            ('gpt2_130m', 'GPT2', '130M', 'vanilla', (22.89, 46.49, 23.60, 28.31, 5.42, 23.07, 0.18, 679.9, 657.0)),
            ('gpt2_130m', 'GPT2', '130M', 's1oa', (22.78, 23.21, 0.43, 23.10, 0.32, 22.83, 0.05, 24.0, 1.2)),
            ('gpt2_350m', 'GPT2', '350M', 'vanilla', (16.37, 52.49, 36.12, 19.92, 3.55, 16.50, 0.13, 118507.1, 118490.7)),
            ('gpt2_350m', 'GPT2', '350M', 's1oa', (16.31, 16.50, 0.19, 16.46, 0.15, 16.33, 0.02, 17.1, 0.8)),
            ('gpt2_1.4b', 'GPT2', '1.4B', 'vanilla', (13.44, 45.05, 31.61, 15.19, 1.75, 13.68, 0.24, 3577.7, 3564.3)),
            ('gpt2_1.4b', 'GPT2', '1.4B', 's1oa', (13.33, 13.45, 0.12, 13.43, 0.10, 13.34, 0.01, 13.6, 0.2)),
            ('llama2_130m', 'Llama2', '130M', 'vanilla', (17.39, 43.61, 26.22, 24.46, 7.07, 17.69, 0.30, 21.5, 4.1)),
            ('llama2_130m', 'Llama2', '130M', 's1oa', (17.31, 20.85, 3.54, 20.11, 2.80, 17.38, 0.07, 19.7, 2.4)))]),
    'table5': Table(
        "Table 5: ablation on GPT-2 130M (Kurtosis and Max Abs. Act. are E_m over the non-first tokens; "
        "*SGD rows train 8x longer)",
        ('Biases', 'Position Encoding', 'Normalisation', 'Optimizer', 'Softmax+1?'),
        (('PPL', 'analysis', 'ppl', ('.3f', '.1f'), True),   # ours to 0.1%: the laptop rows' PPL is ~2.8
         ('Kurtosis', 'analysis', 'kurtosis_rest', '.1f', True),
         ('%First Attn', 'analysis', 'first_attn_argmax', '.3f', True),
         ('Max Abs. Act.', 'analysis', 'max_abs_rest', '.1f', True),
         ('E_m[κ_m,1]', 'analysis', 'kurtosis_first', '.1f', False)),
        [Row(f'table5/{name}', labels, nums, 8 if name.startswith(('09', '10')) else 1) for name, labels, nums in (
            ('01_biases', ('✓', 'Absolute', 'LayerNorm', 'Adam', '✗'), (26.9, 291.7, 0.333, 1675.9)),
            ('02_no_biases', ('✗', 'Absolute', 'LayerNorm', 'Adam', '✗'), (26.9, 263.7, 0.308, 1104.0)),
            ('03_pos_none', ('✗', 'None', 'LayerNorm', 'Adam', '✗'), (27.4, 283.3, 0.197, 1478.7)),
            ('04_pos_rotary', ('✗', 'Rotary', 'LayerNorm', 'Adam', '✗'), (25.6, 391.9, 0.336, 2577.4)),
            ('05_softmax1', ('✗', 'Absolute', 'LayerNorm', 'Adam', '✓'), (26.5, 244.7, 0.022, 648.6)),
            ('06_rmsnorm_m', ('✗', 'Absolute', 'RMSNorm-M', 'Adam', '✓'), (26.6, 230.4, 0.026, 628.6)),
            ('07_rmsnorm_s', ('✗', 'Absolute', 'RMSNorm-S', 'Adam', '✓'), (26.6, 140.0, 0.020, 432.0)),
            ('08_rmsprop', ('✗', 'Absolute', 'RMSNorm-S', 'RMSProp', '✓'), (27.4, 70.5, 0.021, 302.2)),
            ('09_sgd_momentum', ('✗', 'Absolute', 'RMSNorm-S', 'SGD w/mom*', '✓'), (25.3, 5.0, 0.019, 17.8)),
            ('10_sgd', ('✗', 'Absolute', 'RMSNorm-S', 'SGD w/o mom*', '✓'), (33.4, 3.2, 0.017, 13.1)),
            ('11_orthoadam', ('✗', 'Absolute', 'RMSNorm-S', 'OrthoAdam', '✓'), (26.8, 3.0, 0.022, 43.5)),
            ('12_orthoadam_softmax', ('✗', 'Absolute', 'RMSNorm-S', 'OrthoAdam', '✗'), (27.3, 323.0, 0.231, 726.4)),
            ('13_orthoadam_rmsnorm_m', ('✗', 'Absolute', 'RMSNorm-M', 'OrthoAdam', '✓'), (26.7, 380.9, 0.025, 737.2)),
            ('14_orthoadam_layernorm', ('✗', 'Absolute', 'LayerNorm', 'OrthoAdam', '✓'), (26.6, 188.4, 0.023, 514.6)))]),
    'table6': Table(
        "Table 6: longer training sequences (absmax int8; Δ = quantised - full)",
        ('Model Size', 'Setup'), tuple(Q[:7]),
        [Row(f'table2/{size}_{v}' if T == 256 else f'table6/{size}_seq{T}_{v}',
             (f'{size.split("_")[1].upper()}-{T}', 'Vanilla' if v == 'vanilla' else 'S1+OA'), nums)
         for size, T, v, nums in (
            ('gpt2_60m', 256, 'vanilla', (31.88, 43.53, 11.65, 34.87, 2.99, 32.15, 0.27)),
            ('gpt2_60m', 512, 'vanilla', (32.66, 48.55, 15.89, 37.24, 4.58, 33.07, 0.41)),
            ('gpt2_60m', 1024, 'vanilla', (33.52, 57.68, 24.16, 38.22, 4.70, 33.80, 0.28)),
            ('gpt2_60m', 256, 's1oa', (31.93, 32.46, 0.53, 32.32, 0.39, 32.00, 0.07)),
            ('gpt2_60m', 512, 's1oa', (31.83, 32.30, 0.06, 32.18, 0.35, 31.89, 0.47)),
            ('gpt2_60m', 1024, 's1oa', (32.25, 32.85, 0.60, 32.73, 0.48, 32.32, 0.07)),
            ('gpt2_130m', 256, 'vanilla', (22.89, 46.49, 23.60, 28.31, 5.42, 23.07, 0.18)),
            ('gpt2_130m', 512, 'vanilla', (22.80, 42.34, 19.54, 28.14, 5.34, 22.98, 0.18)),
            ('gpt2_130m', 1024, 'vanilla', (22.93, 38.78, 15.85, 29.04, 6.11, 23.16, 0.23)),
            ('gpt2_130m', 256, 's1oa', (22.78, 23.21, 0.43, 23.10, 0.32, 22.83, 0.05)),
            ('gpt2_130m', 512, 's1oa', (22.73, 23.16, 0.43, 23.04, 0.31, 22.79, 0.06)),
            ('gpt2_130m', 1024, 's1oa', (23.87, 23.28, 0.41, 23.19, 0.32, 22.94, 0.07)))]),
    'mitigations': Table(
        "Mitigations (ours, not the paper's): published fixes of attention sinks and outlier activations on one "
        "model, data and budget (E_m = mean over layers; first mass = attention weight on the first token; "
        "1-Σp = weight no real token received: a sink's share, or weight clipped away, or sigmoid's unnormalised "
        "rows; Δ = quantised - full PPL)",
        ('Row', 'Attention', 'Optimizer'),
        # perplexities and Δ to 3 decimals: at the laptop scale (PPL ~2.8) coarse int8 moves them by 0.005-0.024;
        # coarse6 / coarse4 are where per-tensor codes begin to separate the rows there (at scales that quantise
        # only Table 3's four schemes: '–')
        (('PPL', 'analysis', 'ppl', '.3f', False), ('E_m[κ_m,1]', 'analysis', 'kurtosis_first', '.1f', False),
         ('E_m[κ_m,>1]', 'analysis', 'kurtosis_rest', '.1f', False),
         ('%First Attn', 'analysis', 'first_attn_argmax', '.3f', False),
         ('First mass', 'analysis', 'first_attn_mass', '.3f', False),
         ('1-Σp', 'analysis', 'attn_nowhere', '.3f', False),
         ('E_m[X_m,1,d]', 'analysis', 'max_abs_first', '.1f', False),
         ('E_m[X_m,>1,d]', 'analysis', 'max_abs_rest', '.1f', False),
         ('Δ 4-bit ZP', 'quant', 'delta.zeropoint4', '.3f', False),
         ('Δ coarse int8', 'quant', 'delta.coarse', '.3f', False),
         ('Δ coarse6', 'quant', 'delta.coarse6', '.3f', False), ('Δ coarse4', 'quant', 'delta.coarse4', '.3f', False)),
        [Row(f'mitigations/{name}', (name[:2], attn, opt), ()) for name, attn, opt in (
            ('01_vanilla', 'softmax', 'Adam'), ('02_softmax1', 'softmax-1', 'Adam'),
            ('03_clipped', 'clipped softmax', 'Adam'), ('04_gated', 'gated', 'Adam'),
            ('05_sigmoid', 'sigmoid', 'Adam'), ('06_attn_bias', 'softmax + bias k/v', 'Adam'),
            ('07_sink_token', 'softmax + sink token', 'Adam'), ('08_orthoadam', 'softmax', 'OrthoAdam'),
            ('09_muon', 'softmax', 'Muon'), ('10_softmax1_orthoadam', 'softmax-1', 'OrthoAdam'),
            ('11_clipped_orthoadam', 'clipped softmax', 'OrthoAdam'), ('12_softpick', 'softpick', 'Adam'),
            ('13_relu', 'ReLU', 'Adam'))]),
    'spread': Table(
        "The run-to-run spread at the laptop scale (ours): the laptop base (vanilla) and softmax-1 + OrthoAdam, each "
        "trained with a second seed (other initial weights and order of windows); reproduce.py table5 --scale laptop "
        "trains these rows too, and its --goal says which differences between Table 5's rows exceed this spread",
        ('Row', 'Seed'),
        (('PPL', 'analysis', 'ppl', '.3f', False), ('E_m[κ_m,1]', 'analysis', 'kurtosis_first', '.1f', False),
         ('E_m[κ_m,>1]', 'analysis', 'kurtosis_rest', '.2f', False),
         ('%First Attn', 'analysis', 'first_attn_argmax', '.3f', False),
         ('First mass', 'analysis', 'first_attn_mass', '.3f', False),
         ('E_m[X_m,1,d]', 'analysis', 'max_abs_first', '.1f', False),
         ('Δ coarse int8', 'quant', 'delta.coarse', '.3f', False), ('Δ coarse6', 'quant', 'delta.coarse6', '.3f', False),
         ('Δ coarse5', 'quant', 'delta.coarse5', '.3f', False), ('Δ coarse4', 'quant', 'delta.coarse4', '.3f', False)),
        [Row(f'laptop/{name}', (label, seed), ()) for name, label, seed in (
            ('base', 'vanilla', '1337'), ('seeds/vanilla_seed2', 'vanilla', '2'),
            ('seeds/s1oa', 'softmax-1 + OrthoAdam', '1337'), ('seeds/s1oa_seed2', 'softmax-1 + OrthoAdam', '2'))]),
    'pilots': Table(
        "The sink pilots (ours): vanilla 60M, a BOS at position 0 of every window or not, weight decay 0.1 or "
        "0.5 on matrices; the trajectories (pilots_trajectories.png) show when the sink appears",
        ('BOS at 0', 'Weight decay'),
        (('PPL', 'analysis', 'ppl', '.2f', False), ('E_m[κ_m,1]', 'analysis', 'kurtosis_first', '.1f', False),
         ('E_m[κ_m,>1]', 'analysis', 'kurtosis_rest', '.1f', False),
         ('%First Attn', 'analysis', 'first_attn_argmax', '.3f', False),
         ('First mass', 'analysis', 'first_attn_mass', '.3f', False),
         ('E_m[X_m,1,d]', 'analysis', 'max_abs_first', '.1f', False)),
        [Row(f'pilots/bos{b}_wd{w}', ('✓' if b else '✗', f'0.{w[1]}'), ()) for b in (0, 1) for w in ('01', '05')]),
    'bb': Table(
        "Guo et al.'s Bigram-Backcopy (2024) at their batch: the attention sink and the value-state drain in one layer, "
        "and the fixes; ours after 1,000 steps of 512 sequences in bf16, theirs from their released curves (`<s>` = the "
        "first token; L0 = layer 0; @300: the training probe at step 300, 64 sequences; the rest: analyze.py at the end; "
        "peak and drain: `<s>` over the median token)",
        ('Layers', 'Attention', 'Optimizer'),
        (('Attn on `<s>` @300', 'probe', '300.per_layer.first_attn_mass_nontrigger.0', '.3f', True),
         ('Attn on `<s>` (L0, non-trigger queries)', 'analysis', 'per_layer.first_attn_mass_nontrigger.0', '.3f', True),
         ('‖h_`<s>`‖ after L0', 'analysis', 'per_layer.resid_norm_first.0', '.1f', True),
         ('‖v_`<s>`‖ L0', 'analysis', 'per_layer.value_norm_first.0', '.2f', True),
         ('h peak', 'analysis', 'resid_peak', '.2f', False),
         ('v drain', 'analysis', 'value_drain_min', '.2f', False),
         ('PPL', 'analysis', 'ppl', '.3f', False)),
        [Row(f'bb/1l_{attn}_{opt}', ('1', label, name), GUO_1L_ADAM if (attn, opt) == ('softmax', 'adam') else (None,) * 4)
         for attn, opt, label, name in (
             ('softmax', 'adam', 'softmax', 'Adam'), ('relu', 'adam', 'ReLU', 'Adam'), ('softmax', 'sgd', 'softmax', 'SGD'),
             ('softmax1', 'adam', 'softmax-1', 'Adam'), ('softmax', 'orthoadam', 'softmax', 'OrthoAdam'),
             ('softmax1', 'orthoadam', 'softmax-1', 'OrthoAdam'))]),
    'bb_pilots': Table(
        "The residual-state peak in 3 layers (ours): Guo et al.'s 3-layer Bigram-Backcopy model at LR 2e-3 and batch "
        "64 for 2,500 steps (theirs: 3e-4 and 512; their Adam run's `<s>` reached 4x the other tokens' norm after "
        "layer 0 at 10,000 steps, SGD stayed flat); peak L0: `<s>`'s norm after layer 0 over the median token's",
        ('Layers', 'Attention', 'Optimizer'),
        (('peak L0', 'analysis', 'per_layer.resid_peak.0', '.2f', False),
         ('‖h_`<s>`‖ after L0', 'analysis', 'per_layer.resid_norm_first.0', '.1f', False),
         ('h peak', 'analysis', 'resid_peak', '.2f', False),
         ('Attn on `<s>` (L0)', 'analysis', 'per_layer.first_attn_mass_nontrigger.0', '.3f', False),
         ('Attn on `<s>` (L1)', 'analysis', 'per_layer.first_attn_mass_nontrigger.1', '.3f', False),
         ('v drain', 'analysis', 'value_drain_min', '.2f', False),
         ('PPL', 'analysis', 'ppl', '.3f', False)),
        [Row(f'bb/pilots/{name}', ('3', attn, opt), ()) for name, attn, opt in BB_PILOTS]),
    'laptop_pilots': Table(
        "The laptop pilots (ours): Table 2's vanilla 60M row at the laptop scale (config/laptop/base.py), one lever "
        "changed per pilot; which setting shows the paper's phenomena on two CPU cores (peak: the first token's "
        "hidden-state norm over the median token's, max over layers; max/median: its largest channel over its "
        "median channel)",
        ('Pilot', 'Lever'),
        (('PPL', 'analysis', 'ppl', '.2f', False), ('E_m[κ_m,1]', 'analysis', 'kurtosis_first', '.1f', False),
         ('E_m[κ_m,>1]', 'analysis', 'kurtosis_rest', '.1f', False),
         ('%First Attn', 'analysis', 'first_attn_argmax', '.3f', False),
         ('First mass', 'analysis', 'first_attn_mass', '.3f', False),
         ('h peak', 'analysis', 'resid_peak', '.2f', False),
         ('max/median', 'analysis', 'max_over_median_first', '.1f', False),
         ('E_m[X_m,1,d]', 'analysis', 'max_abs_first', '.1f', False)),
        [Row(f'laptop/pilots/{name}', (name[:3], lever), ()) for name, lever in LAPTOP_PILOTS]),
}
