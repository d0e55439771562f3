"""Validation perplexity under the paper's basic quantisation schemes (section 5.2, Tables 1, 3 and 6).

    python eval_quant.py --ckpt out/gpt2_130m/ckpt.pt out/gpt2_130m_s1oa/ckpt.pt --json out/quant_130m.json
    python eval_quant.py --init_from gpt2 gpt2-medium --schemes zeropoint4          # Table 1 (transformers)
    python eval_quant.py --init_from model.Q4_1.gguf --data data/offline_smollm2 --max_docs 200   # a GGUF file
    python eval_quant.py --ckpt out/main/ckpt.pt --data data/offline --max_docs 200
    python eval_quant.py --ckpt out/main/ckpt.pt --schemes fine,fine_channel,absmax4,zeropoint3g64
    python eval_quant.py --ckpt out/main --schemes coarse6 --full_precision '*.mlp.c_proj'   # which layers cost
    python eval_quant.py --table out/quant_130m.json out/quant_350m.json            # runs side by side, Markdown

Quantisation is simulated: a tensor is quantised to integer codes and dequantised straight back to float.
Only Linear layers (and transformers' Conv1D, GPT-2's Linear with its weight stored transposed as
(in, out)) are quantised; embeddings, norms and softmax stay in full precision. Weights are quantised
once, in place; activation scales are computed dynamically in every forward pass.

    scheme                      weights W                  input activations X   output activations Y
    coarse                      absmax8 per tensor         absmax8 per tensor    absmax8 per tensor
    moderate                    absmax8 per tensor         absmax8 per tensor    -
    fine                        absmax8 per output channel absmax8 per token     -
    fine_channel                absmax8 per output channel absmax8 per channel   -
    zeropoint4                  zeropoint4 per out channel -                     -
    coarse<b>, moderate<b>      coarse and moderate with b = 2..8 bits (coarse8 = coarse, moderate8 = moderate)
    absmax<b>, zeropoint<b>     b = 2..8 bits per output channel, weights only
    absmax<b>g<G>, zeropoint<b>g<G>   ... per group of G consecutive inputs of each output channel

Absmax (Dettmers et al. 2022): s = max|x| / (2^(b-1) - 1), codes round(x / s) in [-(2^(b-1) - 1), 2^(b-1) - 1]
(+-127 for 8 bits), x_hat = codes * s. Zeropoint: s = (max x - min x) / (2^b - 1), zero point z = round(-min x / s),
codes clamp(round(x / s) + z, 0, 2^b - 1), x_hat = (codes - z) * s: the minimum maps to the lowest code 0 and all
2^b codes are used (Dettmers et al.'s 8-bit form spreads the range over the 255 signed codes -127..127).
round() is round-half-to-even; since z is rounded, an extreme value can land one code outside and is clamped.
coarse quantises a layer's output after its bias.

"fine" is LLM.int8's vector-wise quantisation: one scale per token (row of X) and one per output channel
(row of W), so X W^T = diag(s_X) (codes_X codes_W^T) diag(s_W) runs as an integer matmul. "fine_channel"
gives each input feature its own scale instead (over the batch's tokens): it isolates outlier feature
channels, but those scales sit on the summed axis and cannot be factored out of an integer matmul.
Per-tensor and per-channel activation scales span one forward pass, i.e. the --batch_size documents of a
batch (their real tokens: padding is ignored; a batch holds documents of similar length, see analyze.py);
per-token scales do not depend on the batch.

--full_precision PATTERNS (comma-separated, shell-style, matched against module names such as
transformer.h.0.mlp.c_proj) leaves the matching layers in full precision: which layers a scheme's penalty comes
from. Every pattern must match a quantisable layer.

The LM head is not quantised unless --lm_head: in our models and GPT-2 it is the token embedding matrix
(tied), and the paper keeps embeddings in full precision. With --lm_head a tied head gets a private quantised
copy and the embedding stays exact. Memory: at most one extra copy of the quantised weights (the originals, on
the CPU), from which they are restored bit for bit after each scheme.

Perplexity: exp of the mean next-token NLL over the first --max_docs validation documents, each truncated to
the block size, exactly as analyze.py (same batches, same --data default, tokenizer check and --bos).
Progress (docs/s, ETA) goes to stderr, the table (the layout of Table 3) to stdout.

--json PATH: {"format": 1, "schemes": [names], "lm_head": bool, "models": [{"model" (the --ckpt/--init_from
spec), "label", "kind" ("ours" | "hf"), "config" (as analyze.py: model_args or HF config, n_params, optimizer,
...), "quantised_layers": [module names], "full_precision": [--full_precision's patterns], "ppl": {"full",
<scheme>: float}, "delta": {<scheme>: ppl - full},
"seconds": {"full", <scheme>}, "inputs": {"per_layer": {name: {"max_abs", "median_abs",
"max_over_median"}}, "max_over_median_max", "layer" (the layer of that maximum), "max_over_median_mean", "residual":
{the same three over the layers that read the normalised residual stream: RESIDUAL_READERS}} (each quantised layer's
input in the full-precision pass: the largest and the median |x| over a batch's real tokens, and their ratio, means
over the batches; what a per-tensor scale spans), "data": {"dir", "val_sha256", "tokenizer", "stand_in_for_c4", "max_docs", "documents",
"predicted_tokens", "block_size", "batch_size", "bos"}}], "provenance": harness/provenance.py's record}; paths are
relative to the working directory (no absolute path); a perplexity that is not finite is null. It is
rewritten after each model; its folder is created before the first model runs. --table reads such files and
prints one Markdown table, a row per model.
"""
from harness.entry import early_exit_on_signal   # first: a signal while torch loads is one line, not a traceback
early_exit_on_signal(__name__)

import argparse
import fnmatch
import json
import math
import re
import sys
import time
from contextlib import contextmanager

import torch
import torch.nn as nn

from harness import devices, measure, provenance, runs, tables
from harness.entry import run_script
from harness.fileio import check_output, comma_list, integer, model_label, path_arg, portable_path, write_json

PAPER_SCHEMES = ('coarse', 'moderate', 'fine', 'zeropoint4')     # the column order of Table 3


# ----------------------------------------------------------------------------- quantisers

def absmax_codes(x, bits=8, dim=None, valid=None):
    """(codes, scale) of absmax quantisation. dim: the axes one scale spans, None = the whole tensor, -1 = one
    scale per row (token, or output channel of an (out, in) weight), (0, 1) = one per column of a (B, T, C)
    activation. valid: bool mask over x.shape[:-1]; rows outside it do not enter the scale."""
    qmax = 2 ** (bits - 1) - 1
    x = x.float()
    a = x.abs() if valid is None else x.abs() * valid.unsqueeze(-1)
    amax = a.amax() if dim is None else a.amax(dim, keepdim=True)
    scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
    return torch.clamp(torch.round(x / scale), -qmax, qmax), scale


def absmax(x, bits=8, dim=None, valid=None):
    """Absmax quantise -> dequantise, in x's dtype."""
    codes, scale = absmax_codes(x, bits, dim, valid)
    return (codes * scale).to(x.dtype)


def zeropoint_codes(x, bits=4, dim=None):
    """(codes, scale, zero) of zeropoint quantisation; the minimum of each slice maps to code 0.
    A constant slice c gets scale |c| and is reproduced exactly."""
    qmax = 2 ** bits - 1
    x = x.float()
    lo = x.amin() if dim is None else x.amin(dim, keepdim=True)
    hi = x.amax() if dim is None else x.amax(dim, keepdim=True)
    scale = torch.where(hi > lo, (hi - lo) / qmax, lo.abs().clamp_min(1e-12))
    zero = torch.round(-lo / scale)
    return torch.clamp(torch.round(x / scale) + zero, 0, qmax), scale, zero


def zeropoint(x, bits=4, dim=None):
    """Zeropoint quantise -> dequantise, in x's dtype."""
    codes, scale, zero = zeropoint_codes(x, bits, dim)
    return ((codes - zero) * scale).to(x.dtype)


# ----------------------------------------------------------------------------- schemes
# Each scheme quantises a weight w (viewed as (out, in)) in place and returns the quantisers of the layer's
# input and output activations, q(x, valid) -> x_hat, or None where they stay in full precision.

def per_tensor8(x, valid=None):
    return absmax(x, 8, None, valid)


def coarse(w):
    w.copy_(absmax(w, 8))
    return per_tensor8, per_tensor8


def moderate(w):
    w.copy_(absmax(w, 8))
    return per_tensor8, None


def per_tensor(bits):
    """The per-tensor absmax quantiser of activations at `bits` bits."""
    return lambda x, valid=None: absmax(x, bits, None, valid)


def coarse_bits(w, bits):
    """coarse at `bits` bits: weights, inputs and outputs absmax per tensor (coarse8 is coarse)."""
    w.copy_(absmax(w, bits))
    return per_tensor(bits), per_tensor(bits)


def moderate_bits(w, bits):
    """moderate at `bits` bits: weights and inputs absmax per tensor (moderate8 is moderate)."""
    w.copy_(absmax(w, bits))
    return per_tensor(bits), None


def fine(w):
    w.copy_(absmax(w, 8, dim=1))
    return (lambda x, valid=None: absmax(x, 8, dim=-1)), None


def fine_channel(w):
    w.copy_(absmax(w, 8, dim=1))
    return (lambda x, valid=None: absmax(x, 8, dim=tuple(range(x.dim() - 1)), valid=valid)), None


def weight_only(w, method, bits, group_size=None):
    """absmax/zeropoint weights of `bits` bits, one scale per output channel or per group of group_size inputs."""
    out_features, in_features = w.shape
    g = group_size or in_features
    quantise = WEIGHT_METHODS[method]
    w.copy_(quantise(w.reshape(out_features, in_features // g, g), bits, dim=-1).reshape(out_features, in_features))
    return None, None


# the scheme names: these four, coarse<bits> and moderate<bits> (the per-tensor schemes at fewer bits), and
# <method><bits>[g<group>] for each weight-only method (zeropoint4 is Table 1's)
ACTIVATION_SCHEMES = {'coarse': coarse, 'moderate': moderate, 'fine': fine, 'fine_channel': fine_channel}
PER_TENSOR_BITS = {'coarse': coarse_bits, 'moderate': moderate_bits}
WEIGHT_METHODS = {'absmax': absmax, 'zeropoint': zeropoint}
SCHEME_HELP = ', '.join([*ACTIVATION_SCHEMES, *(f'{m}<bits>' for m in PER_TENSOR_BITS),
                         *(f'{m}<bits>[g<group>]' for m in WEIGHT_METHODS)])


def parse_scheme(name):
    """Scheme name -> (function of w, group size or None). ValueError with a one-line message."""
    if name in ACTIVATION_SCHEMES:
        return ACTIVATION_SCHEMES[name], None
    m = re.fullmatch(rf"({'|'.join(PER_TENSOR_BITS)})(\d+)", name)
    if m:
        bits = int(m[2])
        if not 2 <= bits <= 8:
            raise ValueError(f"scheme {name!r}: bit width {bits} is not supported, use 2 to 8 bits")
        return (lambda w: PER_TENSOR_BITS[m[1]](w, bits)), None
    m = re.fullmatch(rf"({'|'.join(WEIGHT_METHODS)})(\d+)(?:g(\d+))?", name)
    if not m:
        raise ValueError(f"unknown scheme {name!r}; choose from {SCHEME_HELP}")
    bits, group = int(m[2]), int(m[3]) if m[3] else None
    if not 2 <= bits <= 8:
        raise ValueError(f"scheme {name!r}: bit width {bits} is not supported, use 2 to 8 bits")
    if group is not None and group < 1:
        raise ValueError(f"scheme {name!r}: group size must be >= 1")
    return (lambda w: weight_only(w, m[1], bits, group)), group


# ----------------------------------------------------------------------------- applying a scheme to a model

def is_linear(module):
    return isinstance(module, nn.Linear) or type(module).__name__ == 'Conv1D'    # transformers' Conv1D (GPT-2)


def weight_matrix(module):
    """The weight as an (out, in) view: nn.Linear stores (out, in), Conv1D stores (in, out) for y = x W + b."""
    return module.weight if isinstance(module, nn.Linear) else module.weight.t()


def quantisable_layers(model, lm_head=False):
    """[(name, module)] of the Linear/Conv1D layers a scheme quantises; the output head only with lm_head."""
    head = model.get_output_embeddings() if hasattr(model, 'get_output_embeddings') else getattr(model, 'lm_head', None)
    return [(n, m) for n, m in model.named_modules() if is_linear(m) and (lm_head or m is not head)]


def keep_full_precision(layers, patterns):
    """layers without the ones a pattern of `patterns` (shell-style, on the module name) names; each pattern must name
    one, and one layer must be left to quantise."""
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(n, pattern) for n, _ in layers):
            raise ValueError(f"--full_precision {pattern} matches none of the quantisable layers (such as "
                             f"{', '.join(n for n, _ in layers[:3])}); use a pattern like '*.mlp.c_proj'")
    left = [(n, m) for n, m in layers if not any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if not left:
        raise ValueError(f"--full_precision {','.join(patterns)} leaves no layer to quantise")
    return left


def check_groups(layers, group_sizes):
    for g in group_sizes:
        for name, m in layers:
            n_in = weight_matrix(m).shape[1]
            if g is not None and n_in % g:
                raise ValueError(f"group size {g} does not divide the {n_in} inputs of layer {name}; "
                                 f"pick a divisor of every layer's input size")


def backup_weights(model, layers):
    """{name: CPU copy} of every weight a scheme will overwrite in place. A head tied to an embedding is
    not copied: it is untied during quantisation and its original parameter lives on in the embedding."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return {n: m.weight if id(m.weight) in embeddings else m.weight.detach().to('cpu', copy=True) for n, m in layers}


@contextmanager
def quantised(layers, backup, scheme, batch=None):
    """Within the block the layers run `scheme`; afterwards every weight is restored exactly and the hooks
    are gone. batch['valid'] is the (B, T) mask of real tokens of the running batch (or None)."""
    batch = {} if batch is None else batch
    handles = []
    try:
        for name, m in layers:
            if backup[name] is m.weight:     # tied head: quantise a private copy
                m.weight = nn.Parameter(m.weight.detach().clone(), requires_grad=False)
            with torch.no_grad():
                q_in, q_out = scheme(weight_matrix(m))
            if q_in is not None:
                handles.append(m.register_forward_pre_hook(
                    lambda mod, args, q=q_in: (q(args[0], rows(batch, args[0])),) + tuple(args[1:])))
            if q_out is not None:
                handles.append(m.register_forward_hook(lambda mod, args, y, q=q_out: q(y, rows(batch, y))))
        yield
    finally:
        for h in handles:
            h.remove()
        for name, m in layers:
            if isinstance(backup[name], nn.Parameter):
                m.weight = backup[name]
            else:
                with torch.no_grad():
                    m.weight.copy_(backup[name])


@contextmanager
def input_statistics(layers, batch, stats):
    """Within the block every forward pass adds, per layer, the largest and the median |x| of the layer's input over
    the batch's real tokens to stats[name] (sums and a count): what a per-tensor absmax scale has to span. A step of
    max|x| / (2^(b-1) - 1) rounds every |x| below half of it to 0, so once max / median passes about 2^b the median
    input is lost (coarse<b>, moderate<b>)."""
    def hook(name):
        def record(module, args):
            x = args[0].detach().float()
            valid = rows(batch, x)
            a = (x[valid] if valid is not None else x).abs().flatten()
            if a.numel():
                high, mid = a.max().item(), a.median().item()
                s = stats.setdefault(name, {'max_abs': 0.0, 'median_abs': 0.0, 'max_over_median': 0.0, 'n': 0,
                                            'n_ratio': 0})
                s['max_abs'] += high
                s['median_abs'] += mid
                s['n'] += 1
                if mid > 0:   # a median of 0 (half the inputs exactly 0) has no ratio
                    s['max_over_median'] += high / mid
                    s['n_ratio'] += 1
        return record
    handles = [m.register_forward_pre_hook(hook(name)) for name, m in layers]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


# the layers that read the normalised residual stream, where the hidden state's outlier channels enter a matmul:
# attention's and the MLP's input projections (ours and GPT-2's c_attn, c_fc, c_gate; Llama's q/k/v, gate and up)
RESIDUAL_READERS = ('c_attn', 'c_fc', 'c_gate', 'q_proj', 'k_proj', 'v_proj', 'gate_proj', 'up_proj')


def input_summary(stats):
    """{'per_layer': {name: {max_abs, median_abs, max_over_median}} (means over the forward passes),
    'max_over_median_max' and its 'layer', 'max_over_median_mean' (over layers), and 'residual': the same three over
    the RESIDUAL_READERS layers only} of input_statistics' sums. The other layers' inputs (the MLP's GELU output,
    attention's output) have medians near 0, so their ratios run to thousands in any model."""
    per_layer = {name: {'max_abs': s['max_abs'] / s['n'], 'median_abs': s['median_abs'] / s['n'],
                        'max_over_median': s['max_over_median'] / s['n_ratio'] if s['n_ratio'] else None}
                 for name, s in stats.items() if s['n']}

    def summary(names):
        ratios = {n: per_layer[n]['max_over_median'] for n in names if per_layer[n]['max_over_median'] is not None}
        top = max(ratios, key=ratios.get) if ratios else None
        return {'max_over_median_max': ratios[top] if top else None, 'layer': top,
                'max_over_median_mean': sum(ratios.values()) / len(ratios) if ratios else None}
    readers = [n for n in per_layer if n.rsplit('.', 1)[-1] in RESIDUAL_READERS]
    return {**summary(per_layer), 'residual': summary(readers), 'per_layer': per_layer}


def rows(batch, x):
    """The valid-token mask of the batch if it lines up with x's leading axes, else None (all rows count)."""
    valid = batch.get('valid')
    return valid if valid is not None and tuple(valid.shape) == tuple(x.shape[:-1]) else None


# ----------------------------------------------------------------------------- evaluation

def perplexity(lm, data_dir, max_docs, batch_size, device, batch, label):
    """(ppl, documents, predicted tokens) as measure.perplexity, with batch['valid'] set to each batch's
    real-token mask for the activation quantisers."""
    try:
        total, count, docs = measure.nll_total(lm, data_dir, max_docs, batch_size, device, label,
                                               on_batch=lambda mask: batch.__setitem__('valid', mask))
    finally:
        batch['valid'] = None
    mean = total / count
    return (math.exp(mean) if mean < 700 else math.inf), docs, count      # exp overflows past ~709 nats


def evaluate(lm, schemes, data_dir, max_docs, batch_size, device, lm_head=False, full_precision=()):
    """Perplexity of one model in full precision and under each scheme (the layers full_precision's patterns name
    left unquantised); a JSON-ready dict."""
    meta = measure.check_data(data_dir, lm)
    layers = quantisable_layers(lm.model, lm_head)
    if not layers:
        raise ValueError(f"{lm.name} has no Linear or Conv1D layers to quantise")
    layers = keep_full_precision(layers, full_precision)
    check_groups(layers, [group for _, group in schemes.values()])
    backup = backup_weights(lm.model, layers)
    batch, label = {'valid': None}, tables.run_label(lm.name)
    ppl, seconds = {}, {}
    for name in ('full', *schemes):
        t0 = time.time()
        if name == 'full':
            with input_statistics(layers, batch, stats := {}):
                ppl[name], docs, tokens = perplexity(lm, data_dir, max_docs, batch_size, device, batch,
                                                     f"{label} full")
        else:
            with quantised(layers, backup, schemes[name][0], batch):
                ppl[name] = perplexity(lm, data_dir, max_docs, batch_size, device, batch, f"{label} {name}")[0]
        seconds[name] = round(time.time() - t0, 2)
    return dict(model=model_label(lm.name), label=label, kind=lm.kind, config=lm.config,
                quantised_layers=[n for n, _ in layers], full_precision=list(full_precision),
                ppl=ppl, delta={s: ppl[s] - ppl['full'] for s in schemes}, seconds=seconds,
                inputs=input_summary(stats),
                data=dict(dir=portable_path(data_dir), val_sha256=measure.val_sha256(meta), tokenizer=meta['tokenizer'],
                          stand_in_for_c4=meta.get('stand_in_for_c4'),
                          max_docs=max_docs, documents=docs, predicted_tokens=tokens, block_size=lm.block_size,
                          batch_size=batch_size, bos=lm.bos))


# ----------------------------------------------------------------------------- tables and JSON

def fmt(value):
    return '-' if value is None else 'nan' if math.isnan(value) else 'inf' if math.isinf(value) else f"{value:.2f}"


def table(models, schemes=None):
    """(header, rows) in the layout of Table 3: model, size, attention, optimizer, full, then PPL and Δ
    for each scheme (the union of the models' schemes, in order, unless given)."""
    if schemes is None:
        schemes = list(dict.fromkeys(s for m in models for s in m['delta']))
    header = ['Model', '#Params', 'Attention', 'Optimizer', 'full'] + [c for s in schemes for c in (s, 'Δ')]
    rows = []
    for m in models:
        rows.append(tables.model_cells(m['label'], m['config']) + [fmt(m['ppl']['full'])]
                    + [fmt(v) for s in schemes for v in (m['ppl'].get(s), m['delta'].get(s))])
    return header, rows


def write_results(path, models, schemes, lm_head, device=None):
    write_json(path, {'format': 1, 'schemes': list(schemes), 'lm_head': lm_head, 'models': tables.json_safe(models),
                      'provenance': provenance.record(device)}, indent=1)


def read_runs(paths):
    """Models of several --json files, in order, with a caption line per file."""
    models, captions = [], []
    for path in paths:
        try:
            with open(path) as f:
                run = json.load(f)
        except FileNotFoundError:
            raise ValueError(f"--table {path}: no such file") from None
        except ValueError:
            run = None
        if not isinstance(run, dict) or run.get('format') != 1 or not isinstance(run.get('models'), list):
            raise ValueError(f"--table {path} is not an eval_quant.py JSON file (written by --json)")
        for m in run['models']:
            m['ppl'] = {k: math.nan if v is None else v for k, v in m['ppl'].items()}
            m['delta'] = {k: math.nan if v is None else v for k, v in m['delta'].items()}
            models.append(m)
        d = run['models'][0]['data'] if run['models'] else {}
        captions.append(f"`{path}`: {d.get('dir')} val, {d.get('documents', 0):,} documents, "
                        f"{d.get('predicted_tokens', 0):,} predicted tokens, batch size {d.get('batch_size')}, "
                        f"LM head {'quantised' if run.get('lm_head') else 'full precision'}")
    return models, captions


# ----------------------------------------------------------------------------- command line

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument('--ckpt', nargs='+', default=[], type=path_arg, metavar='PATH',
                   help='train.py checkpoints (ckpt.pt or its folder)')
    p.add_argument('--init_from', nargs='+', default=[], type=path_arg, metavar='NAME',
                   help='Hugging Face models (local files only): gpt2, gpt2-medium, a local Llama folder, ...')
    p.add_argument('--schemes', default=','.join(PAPER_SCHEMES), help=f"comma-separated, from {SCHEME_HELP} "
                   f"(default: {','.join(PAPER_SCHEMES)})")
    p.add_argument('--lm_head', action='store_true', help='also quantise the output head (default: full precision)')
    p.add_argument('--full_precision', default='', metavar='PATTERNS', help="comma-separated shell-style patterns of "
                   "layer names left in full precision, e.g. '*.mlp.c_proj' (default: none)")
    p.add_argument('--data', default=None, type=path_arg, help='prepared dataset folder (prepare_c4.py); its val '
                   'split is used '
                   '(default: a checkpoint\'s own training data, data/c4 for Hugging Face models)')
    p.add_argument('--bos', default='auto', help="token prepended to every document: auto (the model's convention), "
                   "none, eot (the data's document separator) or a token id")
    p.add_argument('--max_docs', type=integer, default=100_000, help='first N validation documents (0 = all)')
    p.add_argument('--batch_size', type=integer, default=8, help='documents per forward pass (per-tensor scales span it)')
    p.add_argument('--block_size', type=integer, default=None, help='max tokens per document (default: as analyze.py)')
    p.add_argument('--device', default='auto', help="'auto' (cuda if available), 'cpu', 'cuda', 'cuda:1', ...")
    p.add_argument('--json', metavar='PATH', type=path_arg,
                   help='write the results of all models to PATH (format: see above)')
    p.add_argument('--table', nargs='+', type=path_arg, metavar='JSON',
                   help='render saved --json files side by side as Markdown')
    args = p.parse_args(argv)
    try:
        if args.table:
            models, captions = read_runs(args.table)
            print(tables.markdown_table(*table(models)) + '\n\n' + '\n'.join(f'- {c}' for c in captions))
            return
        schemes = {s: parse_scheme(s) for s in comma_list(args.schemes)}
        if not schemes:
            raise ValueError(f"--schemes is empty; choose from {SCHEME_HELP}")
        keep = comma_list(args.full_precision)
        specs = args.ckpt + args.init_from
        if not specs:
            p.error('nothing to evaluate: give --ckpt PATH..., --init_from NAME... or --table JSON...')
        if args.block_size is not None and args.block_size < 2:   # one token per document: no metric has a token to use
            raise ValueError(f"--block_size must be >= 2 (a document needs two tokens for a perplexity and a first "
                             f"token beside the others), got {args.block_size}")
        for c in args.ckpt:
            runs.check_ckpt(c)
        if args.batch_size < 1 or args.max_docs < 0:
            raise ValueError("--batch_size must be >= 1 and --max_docs >= 0")
        device = devices.choose_device(args.device)
        if args.json:   # the folder exists before any model runs; the file is none of the inputs
            inputs = runs.read_paths(args.ckpt, [args.data or 'data/c4'], args.init_from)
            check_output(args.json, '--json', inputs=inputs, make=True)
        if args.data is not None or args.init_from:      # fail before loading any model
            measure.data_or_hint(args.data or 'data/c4', args.init_from[0] if args.init_from else None)
        models = []
        for spec in specs:
            lm = runs.load_model(spec, device, args.block_size)
            data = args.data or lm.data or 'data/c4'
            lm = measure.choose_bos(lm, args.bos, measure.data_or_hint(data, spec if lm.kind == 'hf' else None))
            models.append(evaluate(lm, schemes, data, args.max_docs or None, args.batch_size, device,
                                   args.lm_head, keep))
            del lm
            if args.json:
                write_results(args.json, models, schemes, args.lm_head, device)
        d = models[0]['data']
        print(tables.text_table(*table(models, list(schemes))))
        print(f"{d['dir']} val: {d['documents']:,} documents, {d['predicted_tokens']:,} predicted tokens, "
              f"batch size {args.batch_size}, LM head {'quantised' if args.lm_head else 'full precision'}"
              f"{', full precision: ' + ','.join(keep) if keep else ''}; "
              f"Δ = PPL_quant - PPL_full")
        if args.json:
            print(f'wrote {args.json}', file=sys.stderr)
    except ValueError as e:
        sys.exit(f'eval_quant.py: error: {e}')


if __name__ == '__main__':
    run_script(main)
