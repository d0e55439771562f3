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
  first_attn_argmax  fraction of (query, head) pairs, query > 0 (query 0 can only see itself), whose
               most-attended real key is key 0 (ties go to key 0).
  first_attn_mass    mean over (query > 0, head) of the attention probability on key 0.
  attn_nowhere       mean over (query > 0, head) of max(0, 1 - row sum): softmax-1's mass that went nowhere
               (0 for softmax; attn_bias, sink_token: the mass on the sink).
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
               the sink, over the real keys too).
  Summary numbers are E_m[...]: the unweighted mean of the per-layer values over the M layers.
  kurtosis_norm_ratio_corr_*: Pearson correlation across layers of the per-layer kurtosis and
               norm ratio (Table 9); null when undefined (one layer, or a constant curve).
  ppl          exp of the mean next-token NLL over every predicted position (t and t+1 in the document; for ours
               with causal_free_prefix = k, t >= k - 1, as train.py's loss: earlier positions see their target).
Metrics are running sums per layer (and head): memory does not depend on the number of documents.
One batch holds every layer's (B, H, T, T) attention map: lower --batch_size for large models.

JSON (--json PATH: a file for one model; a folder, one <label>.json per model, for several; the folder is
created before any model runs):
  model, kind ('ours' | 'hf'), config (model_args or the Hugging Face config, n_params; ours also
  optimizer, iter_num, dataset), data {dir, split, tokenizer, source, stand_in_for_c4, max_docs,
  documents, positions, predicted_tokens, block_size, bos},
  ppl, kurtosis_first, kurtosis_rest, max_abs_first, max_abs_rest, norm_ratio_first, norm_ratio_rest,
  first_attn_argmax, first_attn_mass, attn_nowhere, sink_rate (fractions in [0, 1]), sink_eps (the threshold
  sink_rate used), kurtosis_norm_ratio_corr_first, kurtosis_norm_ratio_corr_rest,
  sink_kurtosis, sink_max_abs, sink_attn_mass, sink_attn_argmax (sink-token models only),
  per_layer {each metric above except ppl and the correlations: a list of M floats, layer 1 first},
  per_head {first_attn_argmax, first_attn_mass, attn_nowhere, sink_rate (and sink_attn_*): M lists of H floats}.
  max_abs is in the units of the hidden state; a NaN is written as null.

--plots DIR (created before any model runs) writes attention_map.png (Fig. 1a), hidden_states.png
(Fig. 1b), attention_layers.png (Appendix K: mean over heads for the mean over layers, layer 1, L/4 and 3L/4), hidden_layers.png
(Appendix J: the largest channels for the same layers), layer_progression.png (Appendix I), training_curve.png (Appendix L, from log.jsonl next to each checkpoint) and
optimizer_basis.png (Appendix E: per-feature norm of the MLP output weight and the per-feature sum of
the optimizer's second moments from the checkpoint); trajectories.png when log.jsonl holds probes.
--trajectories RUN... --plots DIR draws only trajectories.png: the probe that train.py measures at every
evaluation (probe_docs > 0: the summary metrics above on the first probe_docs validation documents)
against the tokens seen, one line per run.
"""
import argparse
import glob
import json
import math
import os
import re
import sys
from dataclasses import asdict, dataclass
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F

from model import GPT, load_hf
from prepare_c4 import PrepareError, Progress, iter_documents, load_meta, load_tokenizer, tokenizer_mismatch, write_json

HF_BLOCK_SIZE = 256      # default analysis length for Hugging Face models (the paper trains at 256)
BUCKET_DOCS = 512        # documents read ahead and sorted by length, so that a batch holds similar lengths
ATTN_PLOT_TOKENS = 32    # Fig. 1a shows the first tokens of one document
HIDDEN_PLOT_TOKENS = 64
TOP_CHANNELS = 12
SUMMARY_KEYS = ('ppl', 'kurtosis_first', 'kurtosis_rest', 'max_abs_first', 'max_abs_rest', 'first_attn_argmax',
                'first_attn_mass', 'norm_ratio_first', 'norm_ratio_rest', 'kurtosis_norm_ratio_corr_first',
                'kurtosis_norm_ratio_corr_rest')
HIDDEN_METRICS = ('kurtosis_first', 'kurtosis_rest', 'max_abs_first', 'max_abs_rest', 'norm_ratio_first',
                  'norm_ratio_rest')
ATTN_METRICS = ('first_attn_argmax', 'first_attn_mass', 'attn_nowhere')
SINK_EPS = 0.3           # sink_rate's threshold epsilon, Gu et al. (2024)'s default


# ----------------------------------------------------------------------------- models
@dataclass
class LoadedModel:
    name: str                  # the spec it was loaded from, e.g. 'out/x/ckpt.pt', 'gpt2' or 'x/model.Q4_1.gguf'
    model: torch.nn.Module     # eval mode, on device
    kind: str                  # 'ours' | 'hf'
    bos: int | None            # token prepended to every document, or None
    block_size: int            # max sequence length used for analysis
    vocab_size: int
    config: dict               # model config for the JSON output
    tokenizer: dict | None = None   # the model's tokenizer record (prepare_c4 Tokenizer.record()), if known
    data: str | None = None    # ours: the dataset folder it was trained on (the default --data)


def load_model(spec: str, device: str = 'cpu', block_size: int | None = None) -> LoadedModel:
    """A train.py checkpoint (a .pt file or a folder holding ckpt.pt), a Hugging Face name / folder or a GGUF file."""
    path = os.path.join(spec, 'ckpt.pt') if os.path.isfile(os.path.join(spec, 'ckpt.pt')) else spec
    if path.endswith('.pt') or (os.path.isfile(path) and not path.endswith('.gguf')):
        model, ckpt = GPT.from_checkpoint(path, device)
        train_cfg = ckpt.get('config') or {}
        config = dict(ckpt['model_args'], n_params=model.num_params(), optimizer=train_cfg.get('optimizer'),
                      iter_num=ckpt.get('iter_num'), dataset=train_cfg.get('dataset'))
        data = os.path.join('data', train_cfg['dataset']) if train_cfg.get('dataset') else None
        tokenizer = ckpt.get('tokenizer')
        if tokenizer is None and data is not None:    # checkpoints that do not record it: the data they trained on
            try:
                tokenizer = load_meta(data).get('tokenizer_info')
            except ValueError:
                pass
        return LoadedModel(spec, model, 'ours', ckpt.get('bos'), _block_size(spec, block_size, model.config.block_size),
                           model.config.vocab_size, config, tokenizer, data)
    model = load_hf(spec)
    return wrap_hf(model.to(device), spec, block_size, hf_tokenizer(spec))


def hf_tokenizer(spec):
    """The tokenizer record of a Hugging Face name / folder / GGUF file, or None when it has no tokenizer here."""
    try:
        return load_tokenizer(f'hf:{spec}').record()
    except PrepareError:
        return None


def wrap_hf(model, name: str, block_size: int | None = None, tokenizer: dict | None = None) -> LoadedModel:
    """LoadedModel for an instantiated transformers causal LM (switched to eager attention)."""
    if model.config._attn_implementation != 'eager':
        model.set_attn_implementation('eager')
    c = model.config
    max_len = c.max_position_embeddings
    bos = None if c.model_type == 'gpt2' else c.bos_token_id
    config = dict(model_type=c.model_type, n_layer=c.num_hidden_layers, n_head=c.num_attention_heads,
                  n_embd=c.hidden_size, vocab_size=c.vocab_size, max_position_embeddings=max_len,
                  n_params=sum(p.numel() for p in model.parameters()))
    return LoadedModel(name, model.eval(), 'hf', bos, _block_size(name, block_size, max_len, HF_BLOCK_SIZE),
                       c.vocab_size, config, tokenizer)


def load_gpt(spec: str, device: str = 'cpu') -> LoadedModel:
    """load_model, but a Hugging Face model is copied into this repository's GPT (GPT.from_hf: GPT-2 and Llama
    families, at their full length), so that code written for GPT runs on every model (the KV cache of sample.py
    and stream_eval.py). kind is 'ours' either way; the tokenizer record, BOS and name are load_model's."""
    lm = load_model(spec, 'cpu')
    if lm.kind == 'hf':
        lm.model = GPT.from_hf(lm.model)
        lm.kind, lm.block_size = 'ours', lm.model.config.block_size
        lm.config = dict(asdict(lm.model.config), model_type=lm.config['model_type'], n_params=lm.model.num_params())
    lm.model = lm.model.to(device)
    return lm


def choose_bos(lm: LoadedModel, choice: str, meta: dict) -> LoadedModel:
    """Apply --bos: 'auto' keeps the model's convention (ours: the checkpoint's, Hugging Face: the config's
    bos_token_id except for GPT-2), 'none' prepends nothing, 'eot' the data's document separator, a number that id."""
    if choice == 'none':
        lm.bos = None
    elif choice == 'eot':
        lm.bos = meta['eot_token']
    elif choice != 'auto':
        if not re.fullmatch(r'\d+', choice) or int(choice) >= lm.vocab_size:
            raise ValueError(f"--bos {choice}: expected auto, none, eot or a token id below {lm.vocab_size}")
        lm.bos = int(choice)
    return lm


def _block_size(name, requested, limit, default=None):
    if requested is not None and not 1 <= requested <= limit:
        raise ValueError(f"--block_size {requested} is outside [1, {limit}], the range {name} supports")
    return requested or min(default or limit, limit)


def hf_blocks(model):
    base = model.base_model     # GPT2Model keeps its blocks in .h, Llama-style models in .layers
    return base.h if hasattr(base, 'h') else base.layers


@torch.no_grad()
def forward(lm: LoadedModel, idx: torch.Tensor, analysis: bool = False):
    """logits (B, T, V); with analysis=True (logits, hidden, attn): per layer the (B, T, C) hidden state after
    the block and the (B, H, T, T) attention probabilities (over the real tokens: a sink token is left out)."""
    return forward_trace(lm, idx)[:3] if analysis else forward_trace(lm, idx, analysis=False)


@torch.no_grad()
def forward_trace(lm: LoadedModel, idx: torch.Tensor, analysis: bool = True):
    """forward(), plus the model's trace['sink'] (per layer the sink's (B, C) hidden state and the (B, H, T)
    probability each real query puts on it) for ours with sink_token, else None."""
    if idx.numel() and int(idx.max()) >= lm.vocab_size:
        raise ValueError(f"token id {int(idx.max())} >= vocab_size {lm.vocab_size} of {lm.name}: "
                         f"the data was tokenised for another vocabulary")
    if idx.size(1) > lm.block_size:
        raise ValueError(f"sequence length {idx.size(1)} exceeds the analysis block size {lm.block_size}")
    if lm.kind == 'ours':
        if not analysis:
            return lm.model(idx)[0]
        logits, _, trace = lm.model(idx, analysis=True)
        return logits, trace['hidden'], trace['attn'], trace.get('sink')
    if not analysis:
        return lm.model(idx, use_cache=False).logits
    # hidden_states[-1] of transformers already has the final norm applied: take each block's output instead
    hidden = []
    hooks = [b.register_forward_hook(lambda mod, inp, out: hidden.append(out[0] if isinstance(out, tuple) else out))
             for b in hf_blocks(lm.model)]
    try:
        out = lm.model(idx, output_attentions=True, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return out.logits, hidden, list(out.attentions), None


# ----------------------------------------------------------------------------- data
def val_batches(data_dir: str, max_docs: int | None, block_size: int, batch_size: int,
                bos: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The first max_docs validation documents (BOS prepended when given; empty ones skipped), truncated to
    block_size, in batches of similar length: every BUCKET_DOCS documents are sorted by length (longest first,
    ties in file order) and cut into batches of batch_size, right-padded with 0, so that padding stays small.
    Yields (idx (B, T) int64, mask (B, T) bool, True = a real token)."""
    for idx, mask, _ in numbered_batches(data_dir, max_docs, block_size, batch_size, bos):
        yield idx, mask


def numbered_batches(data_dir, max_docs, block_size, batch_size, bos=None):
    """val_batches, each batch with the list of its rows' document numbers (0 = the first non-empty document)."""
    window, number = [], 0
    for doc in iter_documents(data_dir, 'val', max_docs):
        if len(doc) == 0:
            continue
        window.append((number, (np.concatenate(([bos], doc)) if bos is not None else doc)[:block_size]))
        number += 1
        if len(window) == BUCKET_DOCS:
            yield from _buckets(window, batch_size)
            window = []
    yield from _buckets(window, batch_size)


def _buckets(window, batch_size):
    window = sorted(window, key=lambda d: len(d[1]), reverse=True)     # stable: equal lengths keep their order
    for i in range(0, len(window), batch_size):
        part = window[i:i + batch_size]
        yield (*_collate([d for _, d in part]), [n for n, _ in part])


def _collate(docs):
    idx = torch.zeros(len(docs), max(map(len, docs)), dtype=torch.long)
    mask = torch.zeros(idx.shape, dtype=torch.bool)
    for i, d in enumerate(docs):
        idx[i, :len(d)], mask[i, :len(d)] = torch.from_numpy(d), True
    return idx, mask


def check_data(data_dir, lm):
    """meta.json of the data, after checking it was tokenised for this model: the same tokenizer when both record
    one (ids of a test sentence, prepare_c4.tokenizer_mismatch), and token ids within the model's vocabulary."""
    meta = load_meta(data_dir)
    problem = tokenizer_mismatch(meta.get('tokenizer_info'), lm.tokenizer)
    if problem is None and meta['vocab_size'] > lm.vocab_size:
        problem = (f"it was tokenised with {meta['tokenizer']} (vocab_size {meta['vocab_size']}) but {lm.name} has "
                   f"vocab_size {lm.vocab_size}: the data was tokenised for another vocabulary")
    if problem:
        raise ValueError(f"{data_dir} does not fit {lm.name}: {problem}; make data in its vocabulary with "
                         f"{prepare_command(lm, meta, data_dir)}")
    return meta


def prepare_command(lm, meta, data_dir):
    """The prepare_c4.py command that writes the data of `meta` (same source) in the model's vocabulary."""
    if lm.kind == 'hf':
        tokenizer = f'hf:{lm.name}'
    else:
        tokenizer = (lm.tokenizer or {}).get('name') or '<the tokenizer it was trained with>'
    args = meta.get('args') or {}
    source = {'offline': '--source offline', 'bigram_backcopy': '--source bigram_backcopy',
              'wikitext2': '--source wikitext2'}.get(args.get('source'), '')
    if args.get('data_files'):
        source = '--data_files ' + ' '.join(args['data_files'])
    if args.get('wikitext_dir'):
        source += f" --wikitext_dir {args['wikitext_dir']}"
    out = f"{str(data_dir).rstrip('/')}_{run_label(lm.name)}"
    return ' '.join(x for x in ('python prepare_c4.py', source, f'--tokenizer {tokenizer}', f'--out_dir {out}') if x)


def data_or_hint(data_dir, hf_spec=None):
    """meta.json of data_dir; when it is not prepared data, the error names the command that prepares it (in the
    vocabulary of the Hugging Face model hf_spec when given)."""
    try:
        return load_meta(data_dir)
    except ValueError as e:
        if os.path.exists(os.path.join(data_dir, 'meta.json')):
            raise
        tokenizer = f' --tokenizer hf:{hf_spec}' if hf_spec else ''
        raise ValueError(f"{data_dir} is not a prepared dataset (no meta.json): python prepare_c4.py{tokenizer} "
                         f"--out_dir {data_dir} (C4 from the hub; add --data_files DIR for local shards), or "
                         f"python prepare_c4.py --source offline{tokenizer} --out_dir DIR and pass --data DIR") from None


def seen_targets(lm: LoadedModel):
    """Positions whose next token the model can see: t < k - 1 for ours with causal_free_prefix = k (the first k
    tokens attend to each other), as train.py leaves them out of its loss; 0 for every other model."""
    return max(getattr(lm.model.config, 'causal_free_prefix', 0) - 1, 0) if lm.kind == 'ours' else 0


def nll_sum(logits, idx, mask, skip=0):
    """(sum of next-token NLL, number of predicted tokens) over positions t >= skip with mask[t] and mask[t+1]."""
    pairs = (mask[:, :-1] & mask[:, 1:]).sum(1)    # a row's predicted positions are a prefix (right padding)
    nll, count = 0.0, 0
    for b in range(len(idx)):      # one document at a time: its (T, vocab) log-probabilities stay in cache
        n = int(pairs[b])
        if n > skip:
            nll += float(F.cross_entropy(logits[b, skip:n].float(), idx[b, skip + 1:n + 1], reduction='sum'))
            count += n - skip
    return nll, count


def nll_total(lm: LoadedModel, data_dir, max_docs, batch_size, device, label=None, on_batch=None):
    """(sum of next-token NLL, predicted tokens, documents) over the validation documents, with progress.
    on_batch(mask), when given, sees each batch's real-token mask before the forward pass."""
    meta = check_data(data_dir, lm)
    total, count, docs = 0.0, 0, 0
    progress = Progress(label or f"{lm.name} ppl", target_docs=min(max_docs or math.inf, meta['splits']['val']['documents']))
    for idx, mask in val_batches(data_dir, max_docs, lm.block_size, batch_size, lm.bos):
        idx, mask = idx.to(device), mask.to(device)
        if on_batch is not None:
            on_batch(mask)
        s, n = nll_sum(forward(lm, idx), idx, mask, seen_targets(lm))
        total, count, docs = total + s, count + n, docs + len(idx)
        progress.update(docs, 0)
    progress.done()
    if count == 0:
        raise ValueError(f"{data_dir}: no document has two tokens, nothing to predict")
    return total, count, docs


def perplexity(lm: LoadedModel, data_dir: str, max_docs: int | None, batch_size: int, device: str) -> float:
    total, count, _ = nll_total(lm, data_dir, max_docs, batch_size, device)
    mean = total / count
    return math.exp(mean) if mean < 700 else math.inf    # exp overflows past ~709 nats


# ----------------------------------------------------------------------------- metrics
def hidden_metrics(x):
    """(kurtosis, norm ratio, max |x|) over the last (feature) axis, in float64, sharing their intermediate
    tensors: raw kurtosis E_d[(x - mu)^4] / E_d[(x - mu)^2]^2 (a Gaussian gives 3) and ||x||_inf / ||x||_2."""
    x = x.double()
    c2 = (x - x.mean(-1, keepdim=True)).square()
    var, top = c2.mean(-1), x.abs().amax(-1)
    return (c2 * c2).mean(-1) / (var * var), top / x.norm(dim=-1), top


def kurtosis(x):
    return hidden_metrics(x)[0]


def norm_ratio(x):
    return hidden_metrics(x)[1]


def pearson(a, b):
    """Pearson correlation of two sequences; None when undefined (fewer than 2 points, a constant one, NaN)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) < 2 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    a, b = a - a.mean(), b - b.mean()
    den = math.sqrt((a * a).sum() * (b * b).sum())
    return float((a * b).sum() / den) if den > 0 else None


class Stats:
    """Running sums of every metric, per layer (attention: per layer and head), and of the NLL."""

    def __init__(self, n_layer, n_head, sink_eps=SINK_EPS):
        self.sums = {k: torch.zeros(n_layer, dtype=torch.float64) for k in HIDDEN_METRICS}
        self.sums.update({k: torch.zeros(n_layer, n_head, dtype=torch.float64) for k in ATTN_METRICS + ('sink_rate',)})
        self.sink_eps = sink_eps
        self.n_first = self.n_rest = self.n_docs_rest = 0
        self.nll, self.n_predicted = 0.0, 0

    def update(self, hidden, attn, mask, sink=None):
        if sink is not None:
            self.update_sink(sink, attn, mask)
        first = mask[:, 0]
        rest = mask.clone()
        rest[:, 0] = False
        has_rest = rest.any(1)
        self.n_first += int(first.sum())
        self.n_rest += int(rest.sum())
        self.n_docs_rest += int(has_rest.sum())
        s = self.sums
        for m, h in enumerate(hidden):
            k, r, a = hidden_metrics(h)                                            # (B, T) each
            s['kurtosis_first'][m] += k[:, 0][first].sum().cpu()
            s['kurtosis_rest'][m] += k[rest].sum().cpu()
            s['norm_ratio_first'][m] += r[:, 0][first].sum().cpu()
            s['norm_ratio_rest'][m] += r[rest].sum().cpu()
            s['max_abs_first'][m] += a[:, 0][first].sum().cpu()
            s['max_abs_rest'][m] += a.masked_fill(~rest, 0).amax(1)[has_rest].sum().cpu()
        q = rest[:, None, :]                                                     # queries > 0, (B, 1, T)
        n_tokens = mask.sum(1, keepdim=True).clamp_min(1)                        # (B, 1)
        for m, p in enumerate(attn):
            s['first_attn_argmax'][m] += ((p.argmax(-1) == 0) & q).sum((0, 2)).cpu()
            s['first_attn_mass'][m] += torch.where(q, p[..., 0].double(), 0).sum((0, 2)).cpu()
            s['attn_nowhere'][m] += torch.where(q, (1 - p.sum(-1, dtype=torch.float64)).clamp_min(0), 0).sum((0, 2)).cpu()
            alpha = torch.where(mask[:, None, :], p[..., 0].double(), 0).sum(2) / n_tokens    # (B, H), every query
            s['sink_rate'][m] += ((alpha > self.sink_eps) & first[:, None]).sum(0).cpu()

    def update_sink(self, sink, attn, mask):
        """The sink token's own numbers: its hidden state (one per document) and the attention it gets."""
        s, n_head = self.sums, sink['attn'][0].size(1)
        if 'sink_kurtosis' not in s:
            s.update({k: torch.zeros(len(sink['hidden']), dtype=torch.float64) for k in ('sink_kurtosis', 'sink_max_abs')})
            s.update({k: torch.zeros(len(sink['hidden']), n_head, dtype=torch.float64)
                      for k in ('sink_attn_mass', 'sink_attn_argmax')})
            self.n_sink_docs = self.n_sink_queries = 0
        docs, q = mask.any(1), mask[:, None, :]                                  # real queries, (B, 1, T)
        self.n_sink_docs += int(docs.sum())
        self.n_sink_queries += int(mask.sum())
        for m, h in enumerate(sink['hidden']):
            k, _, a = hidden_metrics(h)
            s['sink_kurtosis'][m] += k[docs].sum().cpu()
            s['sink_max_abs'][m] += a[docs].sum().cpu()
        for m, (p, a) in enumerate(zip(sink['attn'], attn)):
            s['sink_attn_mass'][m] += torch.where(q, p.double(), 0).sum((0, 2)).cpu()
            s['sink_attn_argmax'][m] += ((p >= a.amax(-1)) & q).sum((0, 2)).cpu()

    def result(self):
        """Summary numbers, per-layer lists and per-head lists (NaN where nothing was counted)."""
        def div(x, n):
            return (x / n) if n else torch.full_like(x, math.nan)
        count = dict(kurtosis_first=self.n_first, norm_ratio_first=self.n_first, max_abs_first=self.n_first,
                     kurtosis_rest=self.n_rest, norm_ratio_rest=self.n_rest, max_abs_rest=self.n_docs_rest)
        per_head = {k: div(self.sums[k], self.n_rest) for k in ATTN_METRICS}
        per_head['sink_rate'] = div(self.sums['sink_rate'], self.n_first)
        per_layer = {k: div(self.sums[k], count[k]) for k in HIDDEN_METRICS}
        per_layer.update({k: v.mean(1) for k, v in per_head.items()})
        out = {'ppl': math.exp(self.nll / self.n_predicted) if self.n_predicted else math.nan}
        out.update({k: v.mean().item() for k, v in per_layer.items()})
        for pos in ('first', 'rest'):
            out[f'kurtosis_norm_ratio_corr_{pos}'] = pearson(per_layer[f'kurtosis_{pos}'],
                                                             per_layer[f'norm_ratio_{pos}'])
        out['sink_eps'] = self.sink_eps
        out['per_layer'] = {k: v.tolist() for k, v in per_layer.items()}
        out['per_head'] = {k: v.tolist() for k, v in per_head.items()}
        if 'sink_kurtosis' in self.sums:
            sink_layer = {k: div(self.sums[k], self.n_sink_docs) for k in ('sink_kurtosis', 'sink_max_abs')}
            sink_head = {k: div(self.sums[k], self.n_sink_queries) for k in ('sink_attn_mass', 'sink_attn_argmax')}
            sink_layer.update({k: v.mean(1) for k, v in sink_head.items()})
            out.update({k: v.mean().item() for k, v in sink_layer.items()})
            out['per_layer'].update({k: v.tolist() for k, v in sink_layer.items()})
            out['per_head'].update({k: v.tolist() for k, v in sink_head.items()})
        return out


def example_sequence(hidden, attn, mask, row=0):
    """Plot data from one document (row) of a batch: attention averaged over heads, per layer (attn_layers) and
    over layers too (attn), first ATTN_PLOT_TOKENS tokens; |hidden state| per layer (hidden_layers) and averaged
    over layers (hidden), first HIDDEN_PLOT_TOKENS tokens."""
    n = int(mask[row].sum())
    ta, th = min(n, ATTN_PLOT_TOKENS), min(n, HIDDEN_PLOT_TOKENS)
    attn_layers = torch.stack([p[row, :, :ta, :ta].float().mean(0) for p in attn]).cpu().numpy()
    hidden_layers = torch.stack([h[row, :th].float().abs() for h in hidden]).cpu().numpy()
    return {'attn': attn_layers.mean(0), 'hidden': hidden_layers.mean(0), 'attn_layers': attn_layers,
            'hidden_layers': hidden_layers}


def default_batch_size(device):
    """Documents per forward pass when --batch_size is not given: 8 on CUDA, 1 on CPU (measured fastest there)."""
    return 8 if device.startswith('cuda') else 1


def analyze(lm: LoadedModel, data_dir: str, max_docs: int | None, batch_size: int, device: str, quiet=False,
            sink_eps=SINK_EPS, on_batch=None):
    """(JSON-ready result dict, plot data of the first document) for one model; quiet: no progress lines.
    on_batch(mask), when given, sees each batch's real-token mask before the forward pass."""
    meta = check_data(data_dir, lm)
    stats, example, docs = None, None, 0
    progress = Progress(run_label(lm.name), target_docs=min(max_docs or math.inf, meta['splits']['val']['documents']))
    for idx, mask, numbers in numbered_batches(data_dir, max_docs, lm.block_size, batch_size, lm.bos):
        idx, mask = idx.to(device), mask.to(device)
        if on_batch is not None:
            on_batch(mask)
        logits, hidden, attn, sink = forward_trace(lm, idx)
        stats = stats or Stats(len(hidden), attn[0].size(1), sink_eps)
        stats.update(hidden, attn, mask, sink)
        s, n = nll_sum(logits, idx, mask, seen_targets(lm))
        stats.nll, stats.n_predicted = stats.nll + s, stats.n_predicted + n
        if 0 in numbers:                                   # the plots show the first document
            example = example_sequence(hidden, attn, mask, numbers.index(0))
        del logits, hidden, attn, sink
        docs += len(idx)
        if not quiet:
            progress.update(docs, 0)
    if stats is None:
        raise ValueError(f"{data_dir}: the val split has no documents")
    if not quiet:
        progress.done()
    data = dict(dir=data_dir, split='val', tokenizer=meta['tokenizer'], source=meta.get('source'),
                stand_in_for_c4=meta.get('stand_in_for_c4'), max_docs=max_docs, documents=stats.n_first,
                positions=stats.n_first + stats.n_rest, predicted_tokens=stats.n_predicted,
                block_size=lm.block_size, bos=lm.bos)
    return dict(model=lm.name, kind=lm.kind, config=lm.config, data=data, **stats.result()), example


def optimizer_basis(lm: LoadedModel):
    """Appendix E, per layer: the norm of each output feature (row) of the MLP output weight and the sum of the
    optimizer's second moments over that row (None without optimizer state). Returns (norms, moments, note)."""
    if lm.kind == 'ours':
        weights = [b.mlp.c_proj.weight for b in lm.model.transformer.h]
    else:   # GPT-2's Conv1D stores (in, out): transpose to (out, in) like nn.Linear
        weights = [b.mlp.down_proj.weight if hasattr(b.mlp, 'down_proj') else
                   b.mlp.c_proj.weight.T if type(b.mlp.c_proj).__name__ == 'Conv1D' else b.mlp.c_proj.weight
                   for b in hf_blocks(lm.model)]
    norms = [w.detach().float().norm(dim=1).cpu().numpy() for w in weights]
    moments, note = [None] * len(weights), 'no optimizer state (public weights)'
    if lm.kind == 'ours':
        ckpt = torch.load(lm.name if lm.name.endswith('.pt') else os.path.join(lm.name, 'ckpt.pt'),
                          map_location='cpu', weights_only=False)
        opt, name = ckpt.get('optimizer') or {}, (ckpt.get('config') or {}).get('optimizer', '?')
        ids = {re.sub(r'^(module\.|_orig_mod\.)+', '', n): i                   # DDP / torch.compile prefixes
               for g in opt.get('param_groups', []) for n, i in zip(g.get('param_names', []), g['params'])}
        rotated = False
        for m in range(len(weights)):
            state = opt.get('state', {}).get(ids.get(f'transformer.h.{m}.mlp.c_proj.weight'), {})
            v = state.get('exp_avg_sq', state.get('square_avg'))    # Adam-like / RMSProp
            moments[m] = None if v is None else v.float().sum(1).numpy()
            rotated |= 0 in tuple(state.get('rotated_axes', ()))
        note = (f'optimizer {name}: its rotated basis (row d is not feature d)' if rotated else
                f'optimizer {name}: model basis (row d = feature d)' if any(v is not None for v in moments) else
                f'optimizer {name}: no second moments in its state')
    return norms, moments, note


# ----------------------------------------------------------------------------- tables
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


def model_cells(label, config):
    """Model, #Params, Softmax+1?, OrthoAdam? cells of a table row (public weights have no optimizer: ✗)."""
    n, opt = config['n_params'], config.get('optimizer')
    size = f'{n / 1e9:.1f}B' if n >= 1e9 else f'{n / 1e6:.1f}M' if n >= 1e6 else f'{n / 1e3:.1f}K'
    oa = '✓' if opt == 'orthoadam' else '✗' if opt in ('adamw', None) else opt
    return [label, size, '✓' if config.get('attn') == 'softmax1' else '✗', oa]


def table_rows(results):
    """Tables, one row per model: Table 2's layout, then norm ratios, correlations (Table 9), mass; and for
    sink-token models the sink's own numbers."""
    table2 = (['Model', '#Params', 'Softmax+1?', 'OrthoAdam?', 'PPL', 'E_m[κ_m,1]', 'E_m[κ_m,>1]',
               'E_m[max|X_m,1,d|]', 'E_m[max|X_m,>1,d|]', 'First Attn', sink_rate_header(results)],
              [model_cells(run_label(r['model']), r['config']) + [_fmt(r['ppl'], '.2f')]
               + [_fmt(r[k], '.1f') for k in ('kurtosis_first', 'kurtosis_rest', 'max_abs_first', 'max_abs_rest')]
               + [_fmt(r['first_attn_argmax'], '.3f'), sink_rate_cell(r, results)] for r in results])
    keys = ('norm_ratio_first', 'norm_ratio_rest', 'kurtosis_norm_ratio_corr_first', 'kurtosis_norm_ratio_corr_rest',
            'first_attn_mass', 'attn_nowhere')
    table9 = (['Model', 'Norm ratio 1', 'Norm ratio >1', 'Corr κ~ratio 1', 'Corr κ~ratio >1', 'First mass', 'Nowhere'],
              [[run_label(r['model'])] + [_fmt(r[k], '.3f') for k in keys] for r in results])
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


# ----------------------------------------------------------------------------- figures
def _pyplot():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path):
    fig.savefig(path, dpi=100, bbox_inches='tight')
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


def read_log(path):
    """(train, eval) lists of events from a train.py log.jsonl; a repeated (event, iter) keeps the last line."""
    events = {}
    with open(path) as f:
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if isinstance(e, dict) and e.get('event') in ('train', 'eval') and 'iter' in e:
                events[e['event'], e['iter']] = e
    by = lambda kind: [events[k] for k in sorted(k for k in events if k[0] == kind)]
    return by('train'), by('eval')


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


def plot_trajectories(runs, path):
    """Outlier dynamics: the probe of every evaluation (train.py's probe_docs, in each run's log.jsonl) against
    the tokens seen, one colour per run: kurtosis and max |activation| of the first token (solid) and of the
    other tokens (dashed), first-token attention (argmax share solid, mass dashed). A log y-axis where a panel's
    values span more than a factor of 10. Runs without probes are left out; returns None when none has one."""
    plt = _pyplot()
    from matplotlib.ticker import EngFormatter
    curves = [(label, [e for e in read_log(log)[1] if e.get('probe')]) for label, log in runs]
    curves = [(label, evals) for label, evals in curves if evals]
    if not curves:
        return None
    panels = [('kurtosis_first', 'kurtosis_rest', 'kurtosis (raw, Gaussian 3)', 'first token', 'other tokens'),
              ('max_abs_first', 'max_abs_rest', 'max |activation|', 'first token', 'other tokens'),
              ('first_attn_argmax', 'first_attn_mass', 'first-token attention', 'argmax share', 'mass')]
    colors = [f'C{i}' for i in range(10)] if len(curves) <= 10 else list(plt.cm.tab20.colors)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.6), layout='constrained')
    for ax, (solid, dashed, title, l1, l2) in zip(axes, panels):
        for i, (label, evals) in enumerate(curves):
            x = [e['tokens'] for e in evals]
            y1, y2 = ([math.nan if e['probe'].get(k) is None else e['probe'][k] for e in evals] for k in (solid, dashed))
            color = colors[i % len(colors)]
            ax.plot(x, y1, '-o', color=color, ms=3, label=label)
            ax.plot(x, y2, '--', color=color, alpha=0.6)
        ax.set(title=f'{title}\n(solid: {l1}, dashed: {l2})', xlabel='tokens seen')
        ax.xaxis.set_major_formatter(EngFormatter())
        _log_scale_if_wide(ax, [e['probe'].get(k) for _, evals in curves for e in evals for k in (solid, dashed)])
        ax.grid(alpha=0.3)
    docs = sorted({e['probe'].get('documents') for _, evals in curves for e in evals} - {None})
    fig.suptitle('Outlier dynamics during training: the probe at every evaluation '
                 f"({'/'.join(map(str, docs)) or 'the first'} validation documents, E_m = mean over layers)")
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


# ----------------------------------------------------------------------------- command line
def choose_device(spec):
    """--device: 'auto' is cuda when there is a GPU, else cpu; a device this machine lacks is a one-line ValueError
    (train.py's check)."""
    from train import device_problem   # train.py imports this module: import it when called
    problem = device_problem(spec)
    if problem:
        raise ValueError(problem)
    return ('cuda' if torch.cuda.is_available() else 'cpu') if spec == 'auto' else spec


def make_folder(path, option):
    """Create the output folder of `option` (and its parents), or say in one line why it cannot be made."""
    path = path or '.'
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{option}: {path} is a file, not a folder; choose another path")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{option}: cannot create the folder {path} ({e.strerror}: {e.filename}); "
                         f"choose another path") from None


def check_ckpt(c):
    """--ckpt is a train.py checkpoint or its out_dir (Hugging Face names go to --init_from): a one-line ValueError
    before any model is loaded."""
    if not os.path.exists(c):
        raise ValueError(f"--ckpt {c}: not found, no such file or folder (--ckpt takes a train.py checkpoint "
                         f"or its out_dir)")
    if os.path.isdir(c) and not os.path.isfile(os.path.join(c, 'ckpt.pt')):
        raise ValueError(f"--ckpt {c}: the folder holds no ckpt.pt (pass best.pt's path for the best checkpoint)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument('--ckpt', nargs='+', default=[], metavar='PATH', help='train.py checkpoints (ckpt.pt or its folder)')
    p.add_argument('--init_from', nargs='+', default=[], metavar='NAME',
                   help='Hugging Face models: gpt2, gpt2-medium, gpt2-large, gpt2-xl, a local Llama folder')
    p.add_argument('--data', default=None, help='prepared dataset folder (prepare_c4.py); its val split is used '
                   '(default: a checkpoint\'s own training data, data/c4 for Hugging Face models)')
    p.add_argument('--bos', default='auto', help="token prepended to every document: auto (the model's convention), "
                   "none, eot (the data's document separator) or a token id")
    p.add_argument('--max_docs', type=int, default=100_000, help='first N validation documents (0 = all)')
    p.add_argument('--batch_size', type=int, default=None, help='documents per forward pass (default: 8 on CUDA, 1 on '
                   'CPU, where one document at a time was measured fastest; the numbers do not depend on it)')
    p.add_argument('--block_size', type=int, default=None, help='max tokens per document (default: see docstring)')
    p.add_argument('--sink_eps', type=float, default=SINK_EPS, help='threshold epsilon of sink_rate (Gu et al.): a head '
                   'is a sink in a document when its mean attention on the first token exceeds it (default 0.3)')
    p.add_argument('--device', default='auto', help="'auto' (cuda if available), 'cpu', 'cuda', 'cuda:1', ...")
    p.add_argument('--json', metavar='PATH', help='write results: PATH.json for one model, else a folder')
    p.add_argument('--plots', metavar='DIR', help='write the PNG figures into DIR')
    p.add_argument('--table', nargs='+', metavar='JSON',
                   help='render saved JSON files / folders as Markdown; no model runs')
    p.add_argument('--trajectories', nargs='+', metavar='RUN',
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
            os.makedirs(args.plots, exist_ok=True)
            path = plot_trajectories(list(zip(labels, logs)), os.path.join(args.plots, 'trajectories.png'))
            if path is None:
                raise ValueError(f"no evaluation in {', '.join(logs)} has a probe: train with --probe_docs=N (N > 0)")
            print(f'wrote {path}', file=sys.stderr)
            return
        specs = args.ckpt + args.init_from
        if not specs:
            p.error('nothing to analyse: give --ckpt PATH..., --init_from NAME... or --table JSON...')
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
        if args.json:   # the folders exist before any model runs: a bad path costs no analysis
            make_folder(args.json if not args.json.endswith('.json') else os.path.dirname(args.json), '--json')
        if args.plots:
            make_folder(args.plots, '--plots')
        if args.data is not None or args.init_from:
            data_or_hint(args.data or 'data/c4', args.init_from[0] if args.init_from else None)  # before loading a model
        labels = unique_labels([run_label(s) for s in specs])
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
              f"share of (document, layer, head) whose mean attention on key 0 exceeds ε = {args.sink_eps:g}.\n")
        for header, rows in table_rows(results):
            print(text_table(header, rows) + '\n')
        if args.json:
            one_file = args.json.endswith('.json')
            for r, (label, _) in zip(results, examples):
                path = args.json if one_file else os.path.join(args.json, f'{label}.json')
                write_json(path, json_safe(r), indent=1)
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
    main()
