"""Causal tests of the first token: perplexity with its massive activations removed, and with its key hidden.

    python intervene.py --ckpt out/a out/b --data data/bigram_backcopy --max_docs 200 --json out/intervene.json
    python intervene.py --init_from model.Q4_1.gguf --data data/offline_smollm2 --max_docs 100   # a GGUF file
    python intervene.py --ckpt out/a --k 4 --interventions zero,mask_first_key

Each intervention is one pass of analyze.py's measurement (measure.analyze: the same documents, batches, BOS,
tokenizer check, --data default and metrics) over the model with the intervention in place, so every number of
analyze.py is also measured under it; the table shows perplexity and the first token's numbers.

  none            the model as it is: the reference, whose first-token hidden states choose the channels.
  zero            the first token's largest channels (its massive activations, where it has any) set to 0: at the
                  output of every block (the residual stream X_m, after the block's residual additions, as
                  analyze.py measures it), the channels chosen for that layer (below). Later layers see the change.
  mean            the same channels set to their mean over the documents (the reference pass's first tokens).
                  Sun et al. (2024) find that the mean keeps the perplexity and zero ruins it: the value acts as a
                  fixed bias. With a BOS the first token is the same token with the same causal context in every
                  document, so its hidden state is too, and `mean` is then the identity up to rounding.
  zero_random     the control of `zero`: k channels per layer drawn at random (seed 0) from the other channels, set
                  to 0. It tells the effect of the large channels from that of zeroing any k channels.
  mask_first_key  no query but the first token itself may attend to the first token: its probability is 0, softmax
                  renormalises over the other keys, softmax-1 (and attn_bias) sends the freed mass to its sink.
The first token is position 0 of each document (the BOS when one is prepended; --bos as analyze.py), with sink_token
the first real token. Public models (--init_from) are loaded as analyze.py does, then copied into this
repository's GPT (GPT.from_hf: GPT-2 and Llama families, the other ones are refused in one line), which holds
the interventions.

Channels. Sun et al. call an activation massive when |x| > 100 and about 1000 times the median |x| of the hidden
state (over its tokens and channels); large models have a few such channels at the starting token, small ones
none. The rule here works at any size: per layer m, the --k channels (default 2) with the largest mean
|X_{m,0,d}| over the documents of the reference pass, the same channels for every document. Whether they pass
Sun et al.'s bar, against the median |x| of each document's X_m (every real token and channel), is reported;
with --massive_only only the channels that pass it are changed, in the layers where they do (nothing elsewhere),
and zero_random changes as many random channels in the same layers.

--json PATH: {"format": 1, "k", "massive_only", "sink_eps", "interventions": [names], "models": [{"model" (the
spec), "label", "kind" ("ours" | "hf": how it was loaded), "config", "data" (analyze.py's data record),
"channels": {"channels" (per layer, the k channel indices, largest mean |x| first), "mean_abs" (per layer, their
mean |X_{m,0,d}|), "mean" (their mean value, what `mean` writes), "median_abs" (per layer, the mean over
documents of the median |x| of the document's X_m), "massive" (per layer, per channel: mean_abs > 100 and > 1000
median_abs), "random" (per layer, zero_random's channels)}, "results": {name: {analyze.py's summary keys (ppl,
kurtosis_first, ..., first_attn_argmax, first_attn_mass, attn_nowhere, attn_empty, sink_rate, sink_eps) and
per_layer lists, "delta_ppl" (ppl - ppl of none), "seconds"}}}]}; a non-finite number is null. It is rewritten after each model;
its folder is created before the first model runs.
"""
from harness.entry import early_exit_on_signal   # first: a signal while torch loads is one line, not a traceback
early_exit_on_signal(__name__)

import argparse
import dataclasses
import math
import sys
import time
from contextlib import contextmanager

import torch

from harness import devices, measure, runs, tables
from harness.entry import run_script
from harness.fileio import check_output, comma_list, integer, model_label, path_arg, write_json
from model import GPT

INTERVENTIONS = ('none', 'zero', 'mean', 'zero_random', 'mask_first_key')
MASSIVE_ABS, MASSIVE_RATIO = 100.0, 1000.0     # Sun et al.'s bar: |x| > 100 and > 1000 x the median |x|


@contextmanager
def edited(model, edit=None, hide_first_key=False):
    """The model with an intervention in place, restored on exit. edit: per layer (channels (k,) long, values (k,))
    written into the first token's hidden state at the block's output; hide_first_key: the first key hidden."""
    first = int(model.config.sink_token)          # the sink token, when there is one, sits before the first token
    hooks = []

    def write(channels, values):
        def hook(module, inputs, x):
            x = x.clone()
            x[:, first, channels.to(x.device)] = values.to(x.device, x.dtype)
            return x
        return hook
    for block, (channels, values) in zip(model.transformer.h, edit or ()):
        hooks.append(block.register_forward_hook(write(channels, values)))
    for block in model.transformer.h:
        block.attn.hide_first_key = hide_first_key
    try:
        yield model
    finally:
        for h in hooks:
            h.remove()
        for block in model.transformer.h:
            block.attn.hide_first_key = False


@contextmanager
def first_token_sums(model):
    """Running sums over documents, per layer (float64), of the hidden state after every block: 'x' and 'abs' of the
    first token (C values), 'median_abs' of the median |x| of the document (every real token and channel), and
    'n' documents; filled by every forward pass inside the context, whose real-token mask goes to sums['mask']."""
    first, n_layer = int(model.config.sink_token), model.config.n_layer
    sums = {'n': 0, 'x': [0.0] * n_layer, 'abs': [0.0] * n_layer, 'median_abs': [0.0] * n_layer, 'mask': None}

    def record(m):
        def hook(module, inputs, x):
            h, mask = x[:, first:].detach(), sums['mask']                 # (B, T, C); every row is a document
            sums['x'][m] = sums['x'][m] + h[:, 0].double().sum(0).cpu()
            sums['abs'][m] = sums['abs'][m] + h[:, 0].double().abs().sum(0).cpu()
            sums['median_abs'][m] += sum(h[b][mask[b]].abs().median().item() for b in range(len(h)))
            if m == 0:
                sums['n'] += len(h)
        return hook
    hooks = [b.register_forward_hook(record(m)) for m, b in enumerate(model.transformer.h)]
    try:
        yield sums
    finally:
        for h in hooks:
            h.remove()


def choose_channels(sums, k):
    """Per layer: the k channels of largest mean |x| at the first token, their statistics, and k random others."""
    n, gen = sums['n'], torch.Generator().manual_seed(0)
    out = {key: [] for key in ('channels', 'mean_abs', 'mean', 'median_abs', 'massive', 'random')}
    for x, a, med in zip(sums['x'], sums['abs'], sums['median_abs']):
        mean_abs, mean, median = a / n, x / n, med / n
        top = torch.sort(mean_abs, descending=True, stable=True).indices[:k]
        others = torch.ones(len(mean_abs), dtype=torch.bool)
        others[top] = False
        rest = others.nonzero().squeeze(1)
        out['channels'].append(top.tolist())
        out['mean_abs'].append(mean_abs[top].tolist())
        out['mean'].append(mean[top].tolist())
        out['median_abs'].append(median)
        out['massive'].append([bool(v > MASSIVE_ABS and v > MASSIVE_RATIO * median) for v in mean_abs[top].tolist()])
        out['random'].append(rest[torch.randperm(len(rest), generator=gen)[:k]].sort().values.tolist())
    return out


def edit_for(name, channels, massive_only=False):
    """The per-layer (channels, values) that intervention `name` writes, or None. massive_only: only the channels
    that pass Sun et al.'s bar (zero_random: as many random ones in the same layers)."""
    picks = {'zero': 'channels', 'mean': 'channels', 'zero_random': 'random'}
    if name not in picks:
        return None
    edit = []
    for c, v, massive in zip(channels[picks[name]], channels['mean'], channels['massive']):
        n = sum(massive) if massive_only else len(c)      # the massive ones come first: largest mean |x| first
        edit.append((torch.tensor(c[:n], dtype=torch.long), torch.tensor(v[:n]) if name == 'mean' else torch.zeros(n)))
    return edit


def as_gpt(lm: runs.LoadedModel, device):
    """lm with a model of this repository (GPT), which holds the interventions: a public model is copied."""
    if lm.kind == 'ours':
        return lm
    return dataclasses.replace(lm, model=GPT.from_hf(lm.model, block_size=lm.block_size).to(device), kind='ours')


def intervene(lm: runs.LoadedModel, data_dir, max_docs, batch_size, device, k, names=INTERVENTIONS,
              sink_eps=measure.SINK_EPS, quiet=False, massive_only=False):
    """(channels record, {name: analyze.py's result under that intervention + delta_ppl, seconds}, analyze.py's
    data record) for one model (lm already checked against the data and made a GPT, see as_gpt); 'none' runs first."""
    model, results = lm.model, {}
    if k > model.config.n_embd:
        raise ValueError(f"--k {k} exceeds the width of {lm.name} ({model.config.n_embd} channels)")
    measure_once = lambda **kw: measure.analyze(lm, data_dir, max_docs, batch_size, device, quiet, sink_eps, **kw)[0]
    for name in ('none',) + tuple(n for n in names if n != 'none'):
        t0 = time.time()
        if name == 'none':
            with first_token_sums(model) as sums:
                result = measure_once(on_batch=lambda mask: sums.update(mask=mask))
            channels, data = choose_channels(sums, k), result['data']
            if data['predicted_tokens'] == 0:      # every document one token long (or within the free prefix)
                raise ValueError(f"{data_dir}: no document of the {data['documents']} measured has a token to "
                                 f"predict within block_size {lm.block_size}; a perplexity needs documents of two "
                                 f"or more tokens")
        else:
            with edited(model, edit_for(name, channels, massive_only), hide_first_key=name == 'mask_first_key'):
                result = measure_once()
        result = {key: v for key, v in result.items() if key not in ('model', 'kind', 'config', 'data', 'per_head')}
        result['delta_ppl'] = result['ppl'] - results['none']['ppl'] if results else 0.0
        result['seconds'] = round(time.time() - t0, 2)
        results[name] = result
        if not quiet:
            print(f"{tables.run_label(lm.name)} {name}: ppl {result['ppl']:.4g}", file=sys.stderr)
    return channels, results, data


# ----------------------------------------------------------------------------- tables
def layer_ranges(flags):
    """[True, True, False, True] -> '1-2, 4' (1-based layer numbers), '' when none."""
    spans, start = [], None
    for m, f in enumerate(list(flags) + [False]):
        if f and start is None:
            start = m
        elif not f and start is not None:
            spans.append(f'{start + 1}' if m - 1 == start else f'{start + 1}-{m}')
            start = None
    return ', '.join(spans)


def table(models):
    """(header, rows): one row per model and intervention."""
    header = ['Model', 'Intervention', 'PPL', 'ΔPPL', 'First Attn', 'First mass', 'Sink rate', 'E_m[max|X_m,1,d|]',
              'E_m[max|X_m,>1,d|]', 'E_m[κ_m,1]']
    f = tables._fmt
    rows = [[m['label'], name, f(r['ppl'], '.3f'), f(r['delta_ppl'], '+.3f'), f(r['first_attn_argmax'], '.3f'),
             f(r['first_attn_mass'], '.3f'), f(r['sink_rate'], '.3f'), f(r['max_abs_first'], '.1f'),
             f(r['max_abs_rest'], '.1f'), f(r['kurtosis_first'], '.1f')] for m in models for name, r in m['results'].items()]
    return header, rows


def channel_summary(m):
    """One line per model: the chosen channels' size against the median and where they pass Sun et al.'s bar."""
    c = m['channels']
    ratio = [a[0] / med if med > 0 else math.inf for a, med in zip(c['mean_abs'], c['median_abs'])]
    massive = layer_ranges(any(x) for x in c['massive'])
    return (f"{m['label']}: largest first-token channel per layer, mean |x| {min(a[0] for a in c['mean_abs']):.3g} to "
            f"{max(a[0] for a in c['mean_abs']):.3g}, {min(ratio):.3g} to {max(ratio):.3g} x the documents' median "
            f"|x|; massive (> {MASSIVE_ABS:g} and > {MASSIVE_RATIO:g} x median) in layers {massive or 'none'}")


# ----------------------------------------------------------------------------- command line
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument('--ckpt', nargs='+', default=[], type=path_arg, metavar='PATH',
                   help='train.py checkpoints (ckpt.pt or its folder)')
    p.add_argument('--init_from', nargs='+', default=[], type=path_arg, metavar='NAME',
                   help='Hugging Face GPT-2 / Llama models (local files only) or GGUF files')
    p.add_argument('--interventions', default=','.join(INTERVENTIONS[1:]),
                   help=f"comma-separated, from {', '.join(INTERVENTIONS[1:])} (default: all; none always runs)")
    p.add_argument('--k', type=integer, default=2, help='channels per layer that zero, mean and zero_random change')
    p.add_argument('--massive_only', action='store_true', help="zero, mean and zero_random change only the chosen "
                   "channels that pass Sun et al.'s bar, in the layers where they do (zero_random: as many random "
                   "ones)")
    p.add_argument('--data', default=None, type=path_arg, help='prepared dataset folder (prepare_c4.py); its val '
                   'split is used '
                   '(default: a checkpoint\'s own training data, data/c4 for Hugging Face models)')
    p.add_argument('--bos', default='auto', help="token prepended to every document: auto (the model's convention), "
                   "none, eot (the data's document separator) or a token id")
    p.add_argument('--max_docs', type=integer, default=100_000, help='first N validation documents (0 = all)')
    p.add_argument('--batch_size', type=integer, default=None, help='documents per forward pass (default: as analyze.py)')
    p.add_argument('--block_size', type=integer, default=None, help='max tokens per document, >= 2 and above a '
                   'causal_free_prefix (default: as analyze.py)')
    p.add_argument('--sink_eps', type=float, default=measure.SINK_EPS, help="sink_rate's threshold (as analyze.py)")
    p.add_argument('--device', default='auto', help="'auto' (cuda if available), 'cpu', 'cuda', 'cuda:1', ...")
    p.add_argument('--json', metavar='PATH', type=path_arg,
                   help='write the results of all models to PATH (format: see above)')
    args = p.parse_args(argv)
    try:
        names = list(comma_list(args.interventions))
        unknown = [x for x in names if x not in INTERVENTIONS]
        if unknown or not names:
            raise ValueError(f"--interventions {args.interventions!r}: unknown {', '.join(unknown) or '(empty)'}; "
                             f"choose from {', '.join(INTERVENTIONS[1:])}")
        specs = args.ckpt + args.init_from
        if not specs:
            p.error('nothing to measure: give --ckpt PATH... or --init_from NAME...')
        for c in args.ckpt:
            runs.check_ckpt(c)
        if args.k < 1:
            raise ValueError(f"--k must be >= 1 (channels per layer), got {args.k}")
        if args.max_docs < 0:
            raise ValueError(f"--max_docs must be >= 0 (0 = all documents), got {args.max_docs}")
        if not 0 <= args.sink_eps < 1:
            raise ValueError(f"--sink_eps must be in [0, 1) (a probability threshold), got {args.sink_eps}")
        if args.batch_size is not None and args.batch_size < 1:      # 0 is an error, not "the default"
            raise ValueError(f"--batch_size must be >= 1 (documents per forward pass), got {args.batch_size}")
        if args.block_size is not None and args.block_size < 2:      # one token per document predicts nothing
            raise ValueError(f"--block_size must be >= 2 (a document needs two tokens for a perplexity), got "
                             f"{args.block_size}")
        device = devices.choose_device(args.device)
        batch_size = args.batch_size or measure.default_batch_size(device)
        if args.json:   # the folder exists before any model runs; the file is none of the inputs
            inputs = runs.read_paths(args.ckpt, [args.data or 'data/c4'], args.init_from)
            check_output(args.json, '--json', inputs=inputs, make=True)
        if args.data is not None or args.init_from:      # fail before loading any model
            measure.data_or_hint(args.data or 'data/c4', args.init_from[0] if args.init_from else None)
        models = []
        for spec, label in zip(specs, tables.unique_labels([tables.run_label(s) for s in specs])):
            lm = runs.load_model(spec, device, args.block_size)
            free = getattr(lm.model.config, 'causal_free_prefix', 0) if lm.kind == 'ours' else 0
            if lm.block_size <= free:
                raise ValueError(f"--block_size {lm.block_size}: {spec} has causal_free_prefix={free}, whose positions "
                                 f"see the tokens they predict; give a block_size above {free}")
            data = args.data or lm.data or 'data/c4'
            lm = measure.choose_bos(lm, args.bos, measure.data_or_hint(data, spec if lm.kind == 'hf' else None))
            measure.check_data(data, lm)         # while a public model is still one: the hint names its tokenizer
            kind, lm = lm.kind, as_gpt(lm, device)
            channels, results, record = intervene(lm, data, args.max_docs or None, batch_size, device, args.k, names,
                                                  args.sink_eps, massive_only=args.massive_only)
            models.append(dict(model=model_label(spec), label=label, kind=kind, config=lm.config, data=record,
                               channels=channels, results=results))
            del lm
            if args.json:
                write_json(args.json, tables.json_safe(dict(format=1, k=args.k, massive_only=args.massive_only,
                                                             sink_eps=args.sink_eps, interventions=names,
                                                             models=models)), indent=1)
        print(tables.text_table(*table(models)))
        d = models[0]['data']
        only = '; only the massive ones' if args.massive_only else ''
        print(f"{d['dir']} val: {d['documents']:,} documents, {d['predicted_tokens']:,} predicted tokens; k = {args.k} "
              f"channels per layer (the largest mean |x| of the first token{only}); ΔPPL = PPL - PPL of none; Sink "
              f"rate ε = {args.sink_eps:g}")
        for m in models:
            print(channel_summary(m))
        if args.json:
            print(f'wrote {args.json}', file=sys.stderr)
    except ValueError as e:
        sys.exit(f'intervene.py: error: {e}')


if __name__ == '__main__':
    run_script(main)
