"""Streaming perplexity with a windowed KV cache (StreamingLLM, Xiao et al., 2024): does a model need its first
tokens (the attention sink) to keep predicting once they would slide out of the window?

    python stream_eval.py --ckpt out/a out/b --data data/offline --tokens 2048 --windows 32 64 --sinks 0 1 4 \\
        --json out/stream --plot out/stream/stream.png
    python stream_eval.py --init_from path/model.Q4_1.gguf --data data/offline_smollm2 --windows 128 256 --json s.json
    python stream_eval.py --replot out/stream/*.json s.json --plot both.png     # saved results, one figure

The stream: the model's BOS (--bos, as in analyze.py), then the first --tokens tokens of the val split of --data as
stored, documents one after another with their eot separators (default data: a checkpoint's own training data;
data/c4 for public models, which are copied into this repository's GPT with GPT.from_hf, GPT-2 and Llama families).
For every window W (--windows) and number k of first tokens kept (--sinks), the tokens go through the model one at
a time (GPT.forward_cached); before a token enters a cache that already holds k + W tokens, the oldest token that is
not one of the first k is evicted. So every token sees the first k tokens of the stream and the W most recent ones,
itself included; a learnt sink token (sink_token models) is always kept, in front, and counts in neither.

Positions: a token's position is its index in the cache, as StreamingLLM does (they are not the positions in the
stream, which would pass block_size). Rotary models keep their keys un-rotated and rotate them again at every step,
so after an eviction the kept tokens move up: the tokens seen are always at positions 0 .. k + W - 1, as in an
ordinary forward pass over them. Absolute (learnt) position embeddings enter at the input and are part of every
cached key and value, so they cannot move: a token keeps the position it entered at, which is k + W - 1 for every
token that enters a full cache; the model then sees many tokens at one position, which it never saw in training,
and only recomputing the window (not done here) would avoid that. pos_emb='none' has no positions.

Cached is not recomputed. From the second layer on, a cached key and value come from the hidden state computed when
its token entered, with the cache of that moment in view (tokens since evicted included), and are never updated;
recomputing the window for every token (StreamingLLM's "sliding window with re-computation") gives every kept token
the current window only. So the two perplexities differ, in either direction, even where the positions agree (one
layer: equal, as the tests check). Measured on SmolLM2-135M-Instruct, k = 1, over text of this repository
(docs/public-models.md, BOS first, the tokens after the cache filled): W = 64, 190 tokens, PPL 62.67 cached and
64.87 recomputed (+3.5%); W = 128, 254 tokens, 19.25 cached and 17.82 recomputed (-7.4%). A difference of about
9% on SmolLM2, once reported as a suspected bug, is of this kind, not an error of the cache.

Reference (no window): the ordinary perplexity of the same tokens, one forward pass over the whole stream when it
fits in block_size, else windows of block_size tokens every block_size / 2 tokens, each token scored once with at
least block_size / 2 tokens of context.

Output: a table per model on stdout (PPL over every predicted token, and over those predicted after the cache of
the largest k began to slide, the same tokens for every k of a window); --plot PNG: the loss (a moving average over
--smooth tokens) against the position in the stream, one panel per model (rows) and window (columns), one line per
k and the reference in black; --json PATH (a file for one model, else a folder of <label>.json):
  model, kind, config, data {dir, split, tokenizer, tokens, documents, bos}, block_size, smooth,
  reference {method: 'full' | 'strided', context, stride, ppl, nll},
  runs: [{window, sinks, cache (k + W), sliding_from, ppl, ppl_sliding, reference_sliding, seconds, nll}, ...]
where nll is the per-token loss in nats, entry t - 1 for the token at stream position t (t = 1 .. tokens - 1), and
ppl_sliding is over the tokens at positions >= sliding_from = W + max(k) + 1, where the caches of every k of that
window slide (reference_sliding: the reference over the same tokens).
"""
from harness.entry import early_exit_on_signal   # first: a signal while torch loads is one line, not a traceback
early_exit_on_signal(__name__)

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from harness.devices import choose_device
from harness.entry import run_script
from harness.fileio import (PrepareError, check_output, integer, model_label, path_arg, portable_path, read_json,
                            write_json)
from harness.measure import check_data, choose_bos, data_or_hint
from harness.plots import _pyplot, _save
from harness.runs import check_ckpt, load_gpt, read_paths
from harness.tables import json_safe, run_label, text_table


@torch.no_grad()
def stream_nll(model, tokens, window, sinks):
    """(nll, cache, kept) of a stream (1-d int64 tensor) fed one token at a time to model (a GPT in eval mode), the
    cache holding the first `sinks` tokens and the `window` most recent ones: nll[t - 1] = -log p(tokens[t] | the
    cache after tokens[t - 1]) as a float64 array; the final KVCache, and the stream positions of the tokens it holds."""
    cfg, n = model.config, len(tokens)
    fixed = cfg.sink_token + sinks                     # cache entries never evicted
    capacity = fixed + window
    evict = list(range(fixed)) + list(range(fixed + 1, capacity))   # the cache without its oldest windowed token
    nll, cache, kept = np.empty(n - 1), None, []
    for s in range(n - 1):
        if cache is not None and len(cache) == capacity:
            cache.keep(evict)
            kept.pop(sinks)
        logits, cache = model.forward_cached(tokens[None, s:s + 1], cache)
        kept.append(s)
        nll[s] = F.cross_entropy(logits[0, -1].float(), tokens[s + 1]).item()
    return nll, cache, kept


@torch.no_grad()
def reference_nll(model, tokens):
    """(nll, method, stride): the ordinary next-token loss of the stream; one forward pass when it fits in block_size,
    else windows of block_size tokens every block_size // 2, each token scored once (after >= block_size // 2)."""
    n, context = len(tokens), model.config.block_size
    stride = max(1, context // 2)
    nll, end = np.empty(n - 1), 0
    while end < n:
        new_end = min(n, context if end == 0 else end + stride)
        start = max(0, new_end - context)
        logits = model(tokens[None, start:new_end])[0][0]
        first = max(end, 1)                            # the tokens at positions first .. new_end - 1
        nll[first - 1:new_end - 1] = F.cross_entropy(logits[first - 1 - start:new_end - 1 - start].float(),
                                                     tokens[first:new_end], reduction='none').double().cpu().numpy()
        end = new_end
    return nll, ('full' if n <= context else 'strided'), (None if n <= context else stride)


def ppl(nll):
    mean = float(np.mean(nll)) if len(nll) else math.nan
    return math.exp(mean) if mean < 700 else math.inf


def read_stream(data_dir, lm, n_tokens):
    """(tokens (n,) int64 tensor, meta, documents begun): the BOS of lm, then the val split's first tokens as stored."""
    meta = check_data(data_dir, lm)
    val = np.memmap(os.path.join(data_dir, 'val.bin'), dtype=meta['dtype'], mode='r')
    head = [lm.bos] if lm.bos is not None else []
    body = np.asarray(val[:n_tokens - len(head)], dtype=np.int64)
    if len(head) + len(body) < n_tokens:
        raise ValueError(f"--tokens {n_tokens}: the val split of {data_dir} has only {len(val)} tokens")
    documents = int((body == meta['eot_token']).sum()) + int(body[-1] != meta['eot_token'])
    return torch.from_numpy(np.concatenate((head, body)).astype(np.int64)), meta, documents


def evaluate(lm, data_dir, n_tokens, windows, sinks, device):
    """The JSON-ready result of one model (see the module docstring)."""
    cfg = lm.model.config
    if cfg.causal_free_prefix:
        raise ValueError(f"{lm.name} has causal_free_prefix={cfg.causal_free_prefix}: its first tokens attend to "
                         f"each other in every window, which a stream has no counterpart for")
    too_big = [(w, k) for w in windows for k in sinks if k + w > cfg.block_size]
    if too_big:
        w, k = too_big[0]
        raise ValueError(f"--windows {w} with --sinks {k}: a cache of {k + w} tokens exceeds block_size "
                         f"{cfg.block_size} of {lm.name}, the positions it has")
    tokens, meta, documents = read_stream(data_dir, lm, n_tokens)
    tokens = tokens.to(device)
    label = run_label(lm.name)
    t0 = time.perf_counter()
    nll, method, stride = reference_nll(lm.model, tokens)
    print(f"{label}: reference ({method}) PPL {ppl(nll):.3f}, {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    reference = dict(method=method, context=min(cfg.block_size, n_tokens), stride=stride, ppl=ppl(nll),
                     nll=nll.round(5).tolist())
    runs = []
    for w in windows:
        sliding_from = w + max(sinks) + 1
        for k in sinks:
            t0 = time.perf_counter()
            run_nll, _, _ = stream_nll(lm.model, tokens, w, k)
            seconds = time.perf_counter() - t0
            runs.append(dict(window=w, sinks=k, cache=w + k, sliding_from=sliding_from, ppl=ppl(run_nll),
                             ppl_sliding=ppl(run_nll[sliding_from - 1:]), reference_sliding=ppl(nll[sliding_from - 1:]),
                             seconds=round(seconds, 2), nll=run_nll.round(5).tolist()))
            print(f"{label}: W={w} k={k}: PPL {runs[-1]['ppl']:.3f}, {seconds:.1f} s "
                  f"({(n_tokens - 1) / seconds:.0f} tokens/s)", file=sys.stderr)
    data = dict(dir=portable_path(data_dir), split='val', tokenizer=meta['tokenizer'], stand_in_for_c4=meta.get('stand_in_for_c4'),
                tokens=n_tokens, documents=documents, bos=lm.bos)
    return dict(model=model_label(lm.name), kind=lm.kind, config=lm.config, data=data, block_size=cfg.block_size,
                reference=reference, runs=runs)


# ----------------------------------------------------------------------------- tables and figures
def table(result):
    """(header, rows) of one model: one row per (W, k), then the reference."""
    ref = result['reference']
    rows = [[str(r['window']), str(r['sinks']), str(r['cache']), f"{r['ppl']:.3f}", f"{r['ppl_sliding']:.3f}",
             f"{r['reference_sliding']:.3f}", str(r['sliding_from'])] for r in result['runs']]
    rows.append([f"reference ({ref['method']}, context {ref['context']})", '', '', f"{ref['ppl']:.3f}", '', '', ''])
    return ['W', 'k', 'cache', 'PPL', 'PPL sliding', 'reference sliding', 'sliding from'], rows


def moving_average(x, n):
    x = np.asarray(x, dtype=float)
    n = max(1, min(n, len(x)))
    c = np.cumsum(np.insert(x, 0, 0.0))
    return (c[n:] - c[:-n]) / n


def plot(results, path, smooth=64):
    """Loss (moving average over `smooth` tokens) against stream position: a row per model, a column per window,
    a line per k, the reference in black."""
    plt = _pyplot()
    windows = sorted({r['window'] for res in results for r in res['runs']})
    fig, axes = plt.subplots(len(results), len(windows), figsize=(4.4 * len(windows), 2.9 * len(results)),
                             squeeze=False, sharey='row', layout='constrained')
    sinks = sorted({r['sinks'] for res in results for r in res['runs']})
    for row, res in zip(axes, results):
        for ax, w in zip(row, windows):
            ref = moving_average(res['reference']['nll'], smooth)
            x = np.arange(len(ref)) + smooth // 2 + 1
            ax.plot(x, ref, color='black', lw=1.2, label=f"no window ({res['reference']['method']})")
            for r in (r for r in res['runs'] if r['window'] == w):
                i = sinks.index(r['sinks'])
                color = f'C{i}'
                ax.plot(x, moving_average(r['nll'], smooth), color=color, lw=1.0, ls=('-', '--', '-.', ':')[i % 4],
                        label=f"k={r['sinks']}: PPL {r['ppl']:.2f}")
                ax.axvline(r['cache'] + 1, color=color, ls=':', lw=0.8)
            ax.set(title=f"{run_label(res['model'])}, W={w}", xlabel='position in the stream')
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        row[0].set_ylabel(f'loss (nats), mean of {smooth} tokens')
    fig.suptitle('Streaming loss with a KV cache of the first k and the W most recent tokens '
                 '(dotted: the first eviction)', fontsize=10)
    return _save(fig, path)


def load_results(paths):
    results = []
    for path in paths:
        r = read_json(Path(path))
        if not (isinstance(r, dict) and {'model', 'reference', 'runs'} <= set(r)):
            raise ValueError(f"--replot {path}: not a stream_eval.py JSON file")
        results.append(r)
    return results


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument('--ckpt', nargs='+', default=[], type=path_arg, metavar='PATH',
                   help='train.py checkpoints (ckpt.pt or its folder)')
    p.add_argument('--init_from', nargs='+', default=[], type=path_arg, metavar='NAME',
                   help="public models: Hugging Face names or folders (local files) or GGUF files ('hf:' optional)")
    p.add_argument('--data', default=None, type=path_arg,
                   help="prepared dataset folder (prepare_c4.py); its val split is the stream "
                   "(default: a checkpoint's own training data, data/c4 for public models)")
    p.add_argument('--tokens', type=integer, default=2048, help='length of the stream, the BOS included')
    p.add_argument('--windows', type=integer, nargs='+', default=[128, 256], metavar='W', help='recent tokens kept')
    p.add_argument('--sinks', type=integer, nargs='+', default=[0, 1, 4], metavar='K', help='first tokens kept')
    p.add_argument('--bos', default='auto', help="token before the stream: auto (the model's convention), none, eot "
                   "or a token id")
    p.add_argument('--smooth', type=integer, default=64, help='tokens per point of the plotted moving average')
    p.add_argument('--device', default='auto', help="'auto' (cuda if available), 'cpu', 'cuda', 'cuda:1', ...")
    p.add_argument('--json', metavar='PATH', type=path_arg,
                   help='write results: PATH.json for one model, else a folder')
    p.add_argument('--plot', metavar='PNG', type=path_arg, help='write the figure (all models on one figure)')
    p.add_argument('--replot', nargs='+', type=path_arg, metavar='JSON',
                   help='draw saved JSON files (--plot) instead of running')
    args = p.parse_args(argv)
    try:
        if args.smooth < 1:
            raise ValueError(f"--smooth must be >= 1, got {args.smooth}")
        if args.replot:
            if not args.plot:
                raise ValueError("--replot draws a figure: give --plot PNG")
            check_output(args.plot, '--plot', inputs=args.replot, make=True)
            results = load_results(args.replot)
            for r in results:
                print(f"{run_label(r['model'])} ({r['data']['tokens']:,} tokens of {r['data']['dir']})\n"
                      + text_table(*table(r)) + '\n')
            print('wrote ' + plot(results, args.plot, args.smooth), file=sys.stderr)
            return
        specs = args.ckpt + [s[3:] if s.startswith('hf:') else s for s in args.init_from]
        if not specs:
            p.error('nothing to evaluate: give --ckpt PATH..., --init_from NAME... or --replot JSON...')
        for c in args.ckpt:
            check_ckpt(c)
        if args.tokens < 2:
            raise ValueError(f"--tokens must be >= 2 (one token to predict), got {args.tokens}")
        if min(args.windows) < 1 or min(args.sinks) < 0:
            raise ValueError(f"--windows must be >= 1 and --sinks >= 0, got {args.windows} and {args.sinks}")
        windows, sinks = sorted(set(args.windows)), sorted(set(args.sinks))
        if args.json and args.json.endswith('.json') and len(specs) > 1:
            raise ValueError(f"--json {args.json} is one file but {len(specs)} models were given: pass a folder")
        labels = [run_label(s) for s in specs]
        labels = [x if labels.count(x) == 1 else f'{x}-{i + 1}' for i, x in enumerate(labels)]
        inputs = read_paths(args.ckpt, [args.data or 'data/c4'], specs[len(args.ckpt):])
        for label in labels if args.json else []:   # the folders exist before any model runs; no file is an input
            check_output(args.json if args.json.endswith('.json') else os.path.join(args.json, f'{label}.json'),
                         '--json', inputs=inputs, make=True)
        if args.plot:
            check_output(args.plot, '--plot', inputs=inputs, make=True)
        device = choose_device(args.device)
        if args.data is not None or args.init_from:
            data_or_hint(args.data or 'data/c4', specs[len(args.ckpt)] if args.init_from else None)
        results = []
        for spec in specs:
            lm = load_gpt(spec, device)
            data = args.data or lm.data or 'data/c4'
            lm = choose_bos(lm, args.bos, data_or_hint(data))
            results.append(evaluate(lm, data, args.tokens, windows, sinks, device))
            del lm
        for label, r in zip(labels, results):
            print(f"{label} ({args.tokens:,} tokens of {r['data']['dir']}, {r['data']['documents']} documents)\n"
                  + text_table(*table(r)) + '\n')
            if args.json:
                path = args.json if args.json.endswith('.json') else os.path.join(args.json, f'{label}.json')
                write_json(path, json_safe(r), indent=None)
                print(f'wrote {path}', file=sys.stderr)
        if args.plot:
            print('wrote ' + plot(results, args.plot, args.smooth), file=sys.stderr)
    except (ValueError, PrepareError) as e:
        sys.exit(f'stream_eval.py: error: {e}')


if __name__ == '__main__':
    run_script(main)
