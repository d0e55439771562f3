"""Measure first-token attention dominance and outlier activations (Table 2, Table 9, Appendix E, I, L).

    python analyze.py --ckpt out/gpt2_130m/ckpt.pt                  # C4 val, the paper's 100,000 documents
    python analyze.py --ckpt out/a/ckpt.pt out/b/ckpt.pt --json results/ --plots figures/
    python analyze.py --ckpt out/x/ckpt.pt --data data/offline --max_docs 200 --json x.json
    python analyze.py --init_from gpt2 gpt2-medium --max_docs 10000     # pip install transformers; cached weights
    python analyze.py --init_from model.Q4_1.gguf --data data/offline_smollm2 --max_docs 200   # a GGUF file
    python analyze.py --table results/ y.json                          # saved JSON files -> Markdown tables
    python analyze.py --trajectories out/a out/b --plots figures/      # train.py's probes -> trajectories.png

Models: --ckpt takes train.py checkpoints (a ckpt.pt or its folder); --init_from takes Hugging Face
names or local folders (any causal LM transformers loads: GPT-2, Llama, ...) and GGUF files (transformers
dequantises them; needs gguf and accelerate), loaded from local files only, in fp32 with eager attention.
Data: the first --max_docs documents (0 = all) of the val split of a prepare_c4.py folder (--data; default:
the dataset a checkpoint was trained on, data/c4 for Hugging Face models), empty ones skipped, each truncated
to the block size (ours: the model's; Hugging Face: 256, the paper's training length; --block_size
overrides). The data must be tokenised with the model's tokenizer: when both record one (meta.json
"tokenizer_info"; a checkpoint's "tokenizer"; a Hugging Face model's own tokenizer files or GGUF), their ids
on a test sentence must agree, else the error names the prepare_c4.py command that makes the right data.
Documents are read BUCKET_DOCS at a time and sorted by length before they are cut into --batch_size batches,
so padding is small; every metric is a sum over documents, so the order does not change the numbers.

Conventions (all metrics on the hidden state after each block's residual additions, X_m, m = 1..M):
  first token  position 0 of every document. --bos auto (default): models whose config has a BOS token
               (Llama family; every model type except gpt2) get it prepended, so for them position 0 is
               BOS; so do ours trained with windows='document' (their BOS is the data's eot token).
               --bos none / eot (the data's document separator, e.g. <|endoftext|>) / ID choose otherwise.
  rest         every other position of the document (within the block size).
  kurtosis     raw, per position over the features d: E_d[(X-mu)^4] / E_d[(X-mu)^2]^2 (Gaussian: 3),
               averaged over first tokens resp. rest positions, per layer.
  norm_ratio   ||X_{m,l}||_inf / ||X_{m,l}||_2 per position, averaged like kurtosis.
  max_abs      per document: max_d |X_{m,0,d}| (first), max over d and all rest positions (rest);
               averaged over documents (a document of one token has no rest).
  The extreme-token phenomena of Guo et al. (2024), per document, averaged over documents; a median is the middle
  value, or the mean of the two middle ones for an even count:
  resid_norm_first   ||X_{m,0}||_2, the first token's residual-state norm (in the hidden state's units).
  resid_peak   the residual-state peak ||X_{m,0}||_2 / median_{t>0} ||X_{m,t}||_2 (documents with a rest).
  max_over_median_first  max_d |X_{m,0,d}| / median_d |X_{m,0,d}|: the first token's largest channel over its
               median channel (beside kurtosis_first: one channel standing out of the first token).
  value_norm_first   per head, ||v_0||_2 of the first token's value vector v = W_v applied to the block's normalised
               input (the head's value vector as its attention mixes it; ours only, null for Hugging Face models).
  value_drain  per head, the value-state drain ||v_0||_2 / median_{t>0} ||v_t||_2 (documents with a rest; ours only);
               value_drain_min: per layer the smallest over its heads (the most drained head).
  first_attn_argmax  fraction of (query, head) pairs, query > 0 (query 0 can only see itself), whose
               most-attended real key is key 0, among the pairs whose row has some mass: a row of
               zeros (softpick, clipped softmax can give one) has no most-attended key and is left out (per layer:
               the layer's such pairs; per head: the head's, NaN if it has none). A tie is split: a row whose
               largest weight k keys share counts 1/k when key 0 is one of them (1 only when key 0 is strictly the
               largest; a uniform row over t + 1 keys counts 1/(t + 1), its mass).
  first_attn_mass    mean over (query > 0, head) of the attention probability on key 0 (sigmoid, relu: the weight
               as it is, not a probability; relu's can exceed 1).
  attn_nowhere       mean over (query > 0, head) of max(0, 1 - row sum): softmax-1's mass that went nowhere
               (0 for softmax; attn_bias, sink_token: the mass on the sink; an empty row counts 1; a row summing
               to more than 1, which sigmoid and relu can give, counts 0).
  attn_empty         fraction of (query > 0, head) pairs whose row has no mass at all (0 for softmax, softmax-1, gated).
  attn_row_sum       mean over (query > 0, head) of the row sum as it is (1 for softmax; < 1 softmax-1; any size >= 0
               for sigmoid and relu, whose rows above 1 attn_nowhere counts as 0: 1 - attn_row_sum is the signed
               mean of 1 - row sum).
  first_attn_mass_nontrigger  first_attn_mass over the queries > 0 whose token is not in the data's meta.json
               "triggers" (a list of token ids, e.g. Bigram-Backcopy's trigger tokens: Guo et al.'s "attention on
               <s> from non-trigger queries"); present only when meta.json names triggers.
  sink_rate    the attention-sink metric of Gu et al. (2024, "When Attention Sink Emerges"): per document, layer
               and head, alpha = the mean over every query t = 0..T-1 of the document (query 0 included, as in
               their formula) of the probability on key 0; sink_rate = the share of (document, layer, head)
               triples with alpha > --sink_eps (default 0.3, theirs); per layer: of (document, head), per head:
               of documents. Thresholded per document as they do (they use 64-token sequences; here whole
               documents within the block size). Summary: the mean over layers, i.e. over all triples.
  sink_token   (ours with sink_token=True) the learnt sink at position 0 is left out of every metric above:
               the first token is the first real token. The sink itself: sink_kurtosis, sink_max_abs (its
               kurtosis and max |x| per layer), sink_attn_mass (mean over every real query and head of its
               probability on the sink), sink_attn_argmax (the fraction of those whose most-attended key is
               the sink, over the real keys too; a tie split as for first_attn_argmax).
  Summary numbers are E_m[...]: the unweighted mean of the per-layer values over the M layers, except
               resid_norm_first, resid_peak and max_over_median_first (the max over layers: where the peak is)
               and value_drain_min (the min over layers, i.e. over every (layer, head)). Per layer, the per-head
               metrics are the mean over heads.
  kurtosis_norm_ratio_corr_*: Pearson correlation across layers of the per-layer kurtosis and
               norm ratio (Table 9); null when undefined (one layer, or a constant curve).
  ppl          exp of the mean next-token NLL over every predicted position (t and t+1 in the document; for ours
               with causal_free_prefix = k, t >= k - 1, as train.py's loss: earlier positions see their target).
Metrics are running sums per layer (and head): memory does not depend on the number of documents.
A model whose forward pass gives a NaN or an Inf (a hidden state or the logits) is not measured: one line says so
(which block, which document, whether the weights hold NaN or Inf or float32 overflows), exit 1, no JSON.
One batch holds every layer's (B, H, T, T) attention map: lower --batch_size for large models.

JSON (--json PATH: a file for one model; a folder, one <label>.json per model, for several; the folder is
created before any model runs):
  model, kind ('ours' | 'hf'), config (model_args or the Hugging Face config, n_params; ours also
  optimizer, iter_num, dataset), data {dir, split, val_sha256 (the split's sha256 from meta.json), tokenizer,
  source, stand_in_for_c4, max_docs,
  documents, positions, predicted_tokens, block_size, bos},
  ppl, kurtosis_first, kurtosis_rest, max_abs_first, max_abs_rest, norm_ratio_first, norm_ratio_rest,
  first_attn_argmax, first_attn_mass, attn_nowhere, attn_empty, sink_rate (fractions in [0, 1]), sink_eps (the threshold
  sink_rate used), attn_row_sum, kurtosis_norm_ratio_corr_first, kurtosis_norm_ratio_corr_rest,
  resid_norm_first, resid_peak, max_over_median_first, value_norm_first, value_drain, value_drain_min,
  first_attn_mass_nontrigger (data with "triggers" only),
  sink_kurtosis, sink_max_abs, sink_attn_mass, sink_attn_argmax (sink-token models only),
  per_layer {each metric above except ppl and the correlations: a list of M floats, layer 1 first},
  per_head {first_attn_argmax, first_attn_mass, attn_nowhere, attn_empty, attn_row_sum, sink_rate, value_norm_first,
  value_drain (and first_attn_mass_nontrigger, sink_attn_*): M lists of H floats}.
  provenance (harness/provenance.py: git commit, corpus manifest sha256, versions, device).
  max_abs is in the units of the hidden state; a NaN is written as null; model and data.dir are relative to the
  working directory (no absolute path).

--plots DIR (created before any model runs) writes attention_map.png (Fig. 1a), hidden_states.png
(Fig. 1b), attention_layers.png (Appendix K: mean over heads for the mean over layers, layer 1, L/4 and 3L/4), hidden_layers.png
(Appendix J: the largest channels for the same layers), layer_progression.png (Appendix I), training_curve.png (Appendix L, from log.jsonl next to each checkpoint) and
optimizer_basis.png (Appendix E: per-feature norm of the MLP output weight and the per-feature sum of
the optimizer's second moments from the checkpoint); trajectories.png when log.jsonl holds probes.
--trajectories RUN... --plots DIR draws only trajectories.png: the probe that train.py measures at every
evaluation (probe_docs > 0: the summary metrics above on the first probe_docs validation documents)
against the tokens seen, one line per run.
"""
from harness.entry import early_exit_on_signal   # first: a signal while torch loads is one line, not a traceback
early_exit_on_signal(__name__)

import argparse
import os
import sys

from harness import provenance
from harness.devices import choose_device
from harness.entry import run_script
from harness.fileio import check_output, integer, path_arg, write_json
from harness.measure import SINK_EPS, analyze, choose_bos, data_or_hint, default_batch_size, optimizer_basis
from harness.plots import (plot_attention_layers, plot_attention_maps, plot_hidden_layers, plot_hidden_states,
                           plot_layer_progression, plot_optimizer_basis, plot_training_curves, plot_trajectories)
from harness.runs import check_ckpt, load_model, make_folder, read_paths
from harness.tables import json_safe, load_results, markdown_table, run_label, table_rows, text_table, unique_labels


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument('--ckpt', nargs='+', default=[], type=path_arg, metavar='PATH',
                   help='train.py checkpoints (ckpt.pt or its folder)')
    p.add_argument('--init_from', nargs='+', default=[], type=path_arg, metavar='NAME',
                   help='Hugging Face models: gpt2, gpt2-medium, gpt2-large, gpt2-xl, a local Llama folder')
    p.add_argument('--data', default=None, type=path_arg, help='prepared dataset folder (prepare_c4.py); its val '
                   'split is used '
                   '(default: a checkpoint\'s own training data, data/c4 for Hugging Face models)')
    p.add_argument('--bos', default='auto', help="token prepended to every document: auto (the model's convention), "
                   "none, eot (the data's document separator) or a token id")
    p.add_argument('--max_docs', type=integer, default=100_000, help='first N validation documents (0 = all)')
    p.add_argument('--batch_size', type=integer, default=None, help='documents per forward pass (default: 8 on CUDA, 1 on '
                   'CPU, where one document at a time was measured fastest; the numbers do not depend on it)')
    p.add_argument('--block_size', type=integer, default=None, help='max tokens per document (default: see docstring)')
    p.add_argument('--sink_eps', type=float, default=SINK_EPS, help='threshold epsilon of sink_rate (Gu et al.): a head '
                   'is a sink in a document when its mean attention on the first token exceeds it (default 0.3)')
    p.add_argument('--device', default='auto', help="'auto' (cuda if available), 'cpu', 'cuda', 'cuda:1', ...")
    p.add_argument('--json', metavar='PATH', type=path_arg,
                   help='write results: PATH.json for one model, else a folder')
    p.add_argument('--plots', metavar='DIR', type=path_arg, help='write the PNG figures into DIR')
    p.add_argument('--table', nargs='+', type=path_arg, metavar='JSON',
                   help='render saved JSON files / folders as Markdown; no model runs')
    p.add_argument('--trajectories', nargs='+', type=path_arg, metavar='RUN',
                   help="train.py run folders (or their log.jsonl): the probe of every evaluation against tokens seen, "
                        "one line per run, into --plots DIR/trajectories.png; no model runs")
    args = p.parse_args(argv)
    try:
        if args.table:
            print('\n\n'.join(markdown_table(*t) for t in table_rows(load_results(args.table))))
            return
        if args.trajectories:
            if not args.plots:
                p.error('--trajectories draws a figure: give --plots DIR')
            logs = [r if r.endswith('.jsonl') else os.path.join(r, 'log.jsonl') for r in args.trajectories]
            for run, log in zip(args.trajectories, logs):
                if not os.path.isfile(log):
                    raise ValueError(f"--trajectories {run}: no such file {log} (pass train.py's out_dir or its log.jsonl)")
            labels = unique_labels([run_label(os.path.dirname(os.path.abspath(log))) for log in logs])
            make_folder(args.plots, '--plots')
            check_output(os.path.join(args.plots, 'trajectories.png'), '--plots', inputs=logs)
            path = plot_trajectories(list(zip(labels, logs)), os.path.join(args.plots, 'trajectories.png'))
            if path is None:
                raise ValueError(f"no evaluation in {', '.join(logs)} has a probe: train with --probe_docs=N (N > 0)")
            print(f'wrote {path}', file=sys.stderr)
            return
        specs = args.ckpt + args.init_from
        if not specs:
            p.error('nothing to analyse: give --ckpt PATH..., --init_from NAME... or --table JSON...')
        if args.block_size is not None and args.block_size < 2:   # one token per document: no metric has a token to use
            raise ValueError(f"--block_size must be >= 2 (a document needs two tokens for a perplexity and a first "
                             f"token beside the others), got {args.block_size}")
        for c in args.ckpt:
            check_ckpt(c)
        if args.json and args.json.endswith('.json') and len(specs) > 1:
            raise ValueError(f"--json {args.json} is one file but {len(specs)} models were given: pass a folder")
        device = choose_device(args.device)
        if args.batch_size is None:
            args.batch_size = default_batch_size(device)
        if args.batch_size < 1:
            raise ValueError(f"--batch_size must be >= 1, got {args.batch_size}")
        if args.max_docs < 0:
            raise ValueError(f"--max_docs must be >= 0 (0 = all documents), got {args.max_docs}")
        if not 0 <= args.sink_eps < 1:
            raise ValueError(f"--sink_eps must be in [0, 1) (a probability threshold), got {args.sink_eps}")
        max_docs = args.max_docs if args.max_docs > 0 else None
        labels = unique_labels([run_label(s) for s in specs])
        if args.json:   # the folders exist before any model runs: a bad path costs no analysis; no file is an input
            inputs = read_paths(args.ckpt, [args.data or 'data/c4'], args.init_from)
            for label in labels:
                check_output(args.json if args.json.endswith('.json') else os.path.join(args.json, f'{label}.json'),
                             '--json', inputs=inputs, make=True)
        if args.plots:
            make_folder(args.plots, '--plots')
        if args.data is not None or args.init_from:
            data_or_hint(args.data or 'data/c4', args.init_from[0] if args.init_from else None)  # before loading a model
        results, examples, bases, logs = [], [], [], []
        for spec, label in zip(specs, labels):
            lm = load_model(spec, device, args.block_size)
            data = args.data or lm.data or 'data/c4'
            lm = choose_bos(lm, args.bos, data_or_hint(data, spec if lm.kind == 'hf' else None))
            result, example = analyze(lm, data, max_docs, args.batch_size, device, sink_eps=args.sink_eps)
            results.append(result)
            examples.append((label, example))
            if args.plots:
                bases.append((label, optimizer_basis(lm)))
                log = os.path.join(os.path.dirname(lm.name) if lm.name.endswith('.pt') else lm.name, 'log.jsonl')
                if lm.kind == 'ours' and os.path.isfile(log):
                    logs.append((label, log))
            del lm
        d = results[0]['data']
        print(f"{d['dir']} val split, {d['documents']:,} documents, {d['positions']:,} positions. E_m = mean over "
              f"layers; First Attn = share of (query > 0, head) pairs whose most-attended key is key 0; Sink rate = "
              f"share of (document, layer, head) whose mean attention on key 0 exceeds ε = {args.sink_eps:g}. PPL: each "
              f"document read from its first token (up to the block size), so it differs from train.py's val ppl, "
              f"which is over consecutive block_size windows of val.bin cut without regard to documents, so most "
              f"predictions there have a longer context.\n")
        for header, rows in table_rows(results):
            print(text_table(header, rows) + '\n')
        if args.json:
            one_file = args.json.endswith('.json')
            for r, (label, _) in zip(results, examples):
                path = args.json if one_file else os.path.join(args.json, f'{label}.json')
                write_json(path, json_safe({**r, 'provenance': provenance.record(device)}), indent=1)
                print(f'wrote {path}', file=sys.stderr)
        if args.plots:
            d = args.plots
            written = [plot_attention_maps(examples, f'{d}/attention_map.png'),
                       plot_hidden_states(examples, f'{d}/hidden_states.png'),
                       plot_attention_layers(examples, f'{d}/attention_layers.png'),
                       plot_hidden_layers(examples, f'{d}/hidden_layers.png'),
                       plot_layer_progression(results, f'{d}/layer_progression.png'),
                       plot_optimizer_basis(bases, f'{d}/optimizer_basis.png')]
            if logs:
                written.append(plot_training_curves(logs, f'{d}/training_curve.png'))
                written += [p for p in [plot_trajectories(logs, f'{d}/trajectories.png')] if p]
            print('wrote ' + ', '.join(written), file=sys.stderr)
    except ValueError as e:
        sys.exit(f'analyze.py: error: {e}')


if __name__ == '__main__':
    run_script(main)
