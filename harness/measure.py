"""The measurement core of analyze.py (its docstring defines every metric): a model's forward pass with its
attention maps, hidden states and value vectors, validation documents in length-sorted batches, perplexity, kurtosis,
max |x|, norm ratios, the first token's residual-state peak and value drain, first-token attention and sink rate as
running sums (Stats), and the optimizer's second moments.
eval_quant.py, intervene.py, lm_eval_adapter.py, stream_eval.py and train.py's probe measure through it."""
import json
import math
import os
import re
import shlex
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F

from harness import dataset
from harness.dataset import iter_documents, load_meta
from harness.fileio import Progress, model_label, portable_path
from harness.runs import LoadedModel
from harness.tables import run_label
from harness.tokenizer import tokenizer_mismatch


ATTN_PLOT_TOKENS = 32    # Fig. 1a shows the first tokens of one document
HIDDEN_PLOT_TOKENS = 64
BUCKET_DOCS = 512        # documents read ahead and sorted by length, so that a batch holds similar lengths
HIDDEN_METRICS = ('kurtosis_first', 'kurtosis_rest', 'max_abs_first', 'max_abs_rest', 'norm_ratio_first',
                  'norm_ratio_rest', 'resid_norm_first', 'resid_peak', 'max_over_median_first')
ATTN_METRICS = ('first_attn_argmax', 'first_attn_mass', 'attn_nowhere', 'attn_empty', 'attn_row_sum')
VALUE_METRICS = ('value_norm_first', 'value_drain')   # per layer and head, from the value vectors (ours only)
PEAK_METRICS = ('resid_norm_first', 'resid_peak', 'max_over_median_first')   # summary: the max over layers, not E_m
SINK_EPS = 0.3           # sink_rate's threshold epsilon, Gu et al. (2024)'s default


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
    probability each real query puts on it) for ours with sink_token, else None, and trace['value'] (per layer the
    (B, H, T, d) value vectors) for ours, else None."""
    if idx.numel() and int(idx.max()) >= lm.vocab_size:
        raise ValueError(f"token id {int(idx.max())} >= vocab_size {lm.vocab_size} of {lm.name}: "
                         f"the data was tokenised for another vocabulary")
    if idx.size(1) > lm.block_size:
        raise ValueError(f"sequence length {idx.size(1)} exceeds the analysis block size {lm.block_size}")
    if lm.kind == 'ours':
        if not analysis:
            return lm.model(idx)[0]
        logits, _, trace = lm.model(idx, analysis=True)
        return logits, trace['hidden'], trace['attn'], trace.get('sink'), trace['value']
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
    return out.logits, hidden, list(out.attentions), None, None


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


def val_sha256(meta):
    """The sha256 of the val split a measurement read (meta.json's, which load_meta checked against val.bin's
    size): the provenance of a number, as train.py's log records the data it trained on."""
    return ((meta.get('splits') or {}).get('val') or {}).get('sha256')


def check_data(data_dir, lm):
    """meta.json of the data, after checking it was tokenised for this model: the same tokenizer when both record
    one (ids of a test sentence, tokenizer.tokenizer_mismatch), and token ids within the model's vocabulary."""
    meta = load_meta(data_dir)
    problem = tokenizer_mismatch(meta.get('tokenizer_info'), lm.tokenizer)
    name = (lm.tokenizer or {}).get('name')
    if problem is None and meta.get('tokenizer') in TASKS and name not in (None, meta['tokenizer']):
        problem = (f"it is the {meta['tokenizer']} task, in a vocabulary of its own, but {lm.name} was trained with "
                   f"{name}")
    if problem is None and meta['vocab_size'] > lm.vocab_size:
        problem = (f"it was tokenised with {meta['tokenizer']} (vocab_size {meta['vocab_size']}) but {lm.name} has "
                   f"vocab_size {lm.vocab_size}: the data was tokenised for another vocabulary")
    if problem:
        command = prepare_command(lm, meta, data_dir)
        trained = f"the data it was trained on, {portable_path(lm.data)}" if lm.data else None
        advice = (f"make data in its vocabulary with {command}" + (f" (or measure it on {trained})" if trained else '')
                  if command else f"measure it on {trained}" if trained else
                  "measure it on data prepared with the tokenizer it was trained with")
        raise ValueError(f"{data_dir} does not fit {lm.name}: {problem}; {advice}")
    return meta


TASKS = ('bigram_backcopy', 'bb_shakespeare')   # prepare_c4.py sources whose data has a vocabulary of its own


def prepare_command(lm, meta, data_dir):
    """The prepare_c4.py command that writes data in the model's vocabulary: the data of `meta` (its source and
    settings, dataset.prepare_command) in the model's tokenizer; for a model of a task with a vocabulary of its own
    (TASKS: its tokenizer is the task's name), that task's data; for a text model and a task's data, the pinned
    corpus. None when the model's tokenizer is unknown or none prepare_c4.py has."""
    name = f'hf:{lm.name}' if lm.kind == 'hf' else (lm.tokenizer or {}).get('name')
    out = f"{str(data_dir).rstrip('/')}_{run_label(lm.name)}"
    if name in TASKS:
        return shlex.join(['python', 'prepare_c4.py', '--source', name, '--out_dir', out])
    if not isinstance(name, str) or not (name in ('gpt2', 'bytes') or name.startswith('hf:')
                                         or name.endswith('.tiktoken')):
        return None    # prepare_c4.py --tokenizer takes no other name
    args = meta.get('args') if isinstance(meta.get('args'), dict) else {}
    command = (dataset.prepare_command({**args, 'tokenizer': name}, out)
               if args.get('source') not in TASKS else None)
    return command or shlex.join(['python', 'prepare_c4.py', '--source', 'pinned', '--tokenizer', name,
                                  '--out_dir', out])


def data_or_hint(data_dir, hf_spec=None):
    """meta.json of data_dir; when it is not prepared data, the error names the command that prepares it (in the
    vocabulary of the Hugging Face model hf_spec when given)."""
    try:
        return load_meta(data_dir)
    except ValueError:
        if os.path.exists(os.path.join(data_dir, 'meta.json')):
            raise
        tokenizer = f' --tokenizer hf:{hf_spec}' if hf_spec else ''
        raise ValueError(f"{data_dir} is not a prepared dataset (no meta.json): python prepare_c4.py{tokenizer} "
                         f"--out_dir {data_dir} (C4 from the hub; add --data_files DIR for local shards), or "
                         f"python prepare_c4.py --source pinned{tokenizer} --out_dir DIR and pass --data DIR") from None


def seen_targets(lm: LoadedModel):
    """Positions whose next token the model can see: t < k - 1 for ours with causal_free_prefix = k (the first k
    tokens attend to each other), as train.py leaves them out of its loss; 0 for every other model."""
    return max(getattr(lm.model.config, 'causal_free_prefix', 0) - 1, 0) if lm.kind == 'ours' else 0


def nll_sum(logits, idx, mask, skip=0):
    """(sum of next-token NLL, number of predicted tokens) over positions t >= skip with mask[t] and mask[t+1]."""
    logits = logits.detach()    # a measurement, not a loss: no graph (float() of a tensor that needs grad warns)
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


def median_over(x, keep=None):
    """The median of x over its last axis (where keep, broadcast to x, is True): the middle value, or the mean of the
    two middle ones for an even count; NaN where nothing is kept. x: float64. By a sort (torch.nanquantile takes
    ten times as long on a probe's small tensors)."""
    if keep is None:
        keep = torch.ones((), dtype=torch.bool, device=x.device)
    keep = keep.expand_as(x)
    k = keep.sum(-1, keepdim=True)
    s = x.masked_fill(~keep, math.inf).sort(-1).values                 # the kept values first, in order
    middle = (s.gather(-1, ((k - 1) // 2).clamp_min(0)) + s.gather(-1, k // 2)) / 2
    return torch.where(k > 0, middle, math.nan).squeeze(-1)


def first_token_peaks(hidden, rest):
    """Per layer and document (L, B), in float64, from the hidden states (L tensors (B, T, C)) and the rest positions
    (B, T): ||h_0|| (the residual-state norm of the first token), ||h_0|| / median_t ||h_t|| over the rest (the
    residual-state peak) and max_c |h_0,c| / median_c |h_0,c| (its largest channel over its median channel). The
    layers are stacked after the norms, so that a small model's probe pays a few operations, not a few per layer."""
    norms = torch.stack([torch.linalg.vector_norm(h, dim=-1, dtype=torch.float64) for h in hidden])   # (L, B, T)
    first = torch.stack([h[:, 0] for h in hidden]).double().abs()                                     # (L, B, C)
    return norms[..., 0], norms[..., 0] / median_over(norms, rest), first.amax(-1) / median_over(first)


def pearson(a, b):
    """Pearson correlation of two sequences; None when undefined (fewer than 2 points, a constant one, NaN)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) < 2 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    a, b = a - a.mean(), b - b.mean()
    den = math.sqrt((a * a).sum() * (b * b).sum())
    return float((a * b).sum() / den) if den > 0 else None


def first_share(p, top=None):
    """Per row of attention weights p (..., T): key 0's share of the row's most-attended key. A tie is split: a row
    whose largest weight k keys share counts 1/k for each of them (a uniform row over t + 1 keys gives key 0
    1/(t + 1), as its mass does), so key 0 counts 1 only when it is strictly the largest. float64; NaN for a row
    with a NaN (no most-attended key)."""
    top = p.amax(-1) if top is None else top
    at_top = p == top[..., None]
    return torch.where(at_top[..., 0], 1 / at_top.sum(-1, dtype=torch.float64), 0).masked_fill(top.isnan(), math.nan)


class Stats:
    """Running sums of every metric, per layer (attention: per layer and head), and of the NLL."""

    def __init__(self, n_layer, n_head, sink_eps=SINK_EPS):
        self.sums = {k: torch.zeros(n_layer, dtype=torch.float64) for k in HIDDEN_METRICS}
        self.sums.update({k: torch.zeros(n_layer, n_head, dtype=torch.float64)
                          for k in ATTN_METRICS + VALUE_METRICS + ('sink_rate', 'first_attn_mass_nontrigger')})
        self.attending = torch.zeros(n_layer, n_head, dtype=torch.float64)   # (query > 0, head) rows with some mass
        self.sink_eps = sink_eps
        self.n_first = self.n_rest = self.n_docs_rest = 0
        self.n_value_first = self.n_value_rest = 0        # documents whose value vectors were given
        self.n_nontrigger = None                            # (query > 0) positions kept by `queries`; None: no filter
        self.nll, self.n_predicted = 0.0, 0

    def update(self, hidden, attn, mask, sink=None, values=None, queries=None):
        """One batch: per layer the hidden states (B, T, C), attention weights (B, H, T, T) and (ours) value vectors
        (B, H, T, d); mask (B, T) the real tokens; sink the sink token's trace (or None); queries (B, T) the query
        positions first_attn_mass_nontrigger counts (those whose token is no trigger), or None."""
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
        norm, peak, top = first_token_peaks(hidden, rest)                              # (L, B) each
        s['resid_norm_first'] += norm[:, first].sum(1).cpu()
        s['resid_peak'] += peak[:, has_rest].sum(1).cpu()
        s['max_over_median_first'] += top[:, first].sum(1).cpu()
        if values is not None:
            self.update_values(values, first, rest, has_rest)
        q = rest[:, None, :]                                                     # queries > 0, (B, 1, T)
        n_tokens = mask.sum(1, keepdim=True).clamp_min(1)                        # (B, 1)
        for m, p in enumerate(attn):
            # a row with no mass at all (softpick, clipped softmax can give one) has no most-attended key: it is left
            # out of first_attn_argmax and counted in attn_empty
            top = p.amax(-1)
            empty = (top <= 0) & q
            attending = q & ~empty
            self.attending[m] += attending.sum((0, 2)).cpu()
            s['attn_empty'][m] += empty.sum((0, 2)).cpu()
            s['first_attn_argmax'][m] += torch.where(attending, first_share(p, top), 0).sum((0, 2)).cpu()
            s['first_attn_mass'][m] += torch.where(q, p[..., 0].double(), 0).sum((0, 2)).cpu()
            row = p.sum(-1, dtype=torch.float64)
            s['attn_nowhere'][m] += torch.where(q, (1 - row).clamp_min(0), 0).sum((0, 2)).cpu()
            s['attn_row_sum'][m] += torch.where(q, row, 0).sum((0, 2)).cpu()
            alpha = torch.where(mask[:, None, :], p[..., 0].double(), 0).sum(2) / n_tokens    # (B, H), every query
            s['sink_rate'][m] += ((alpha > self.sink_eps) & first[:, None]).sum(0).cpu()
        if queries is not None:
            kept = rest & queries
            self.n_nontrigger = (self.n_nontrigger or 0) + int(kept.sum())
            for m, p in enumerate(attn):
                s['first_attn_mass_nontrigger'][m] += torch.where(kept[:, None], p[..., 0].double(), 0).sum((0, 2)).cpu()

    def update_values(self, values, first, rest, has_rest):
        """The value drain: per layer and head, ||v_0|| and ||v_0|| / median_t ||v_t|| over the rest positions."""
        s = self.sums
        self.n_value_first += int(first.sum())
        self.n_value_rest += int(has_rest.sum())
        norms = torch.stack([torch.linalg.vector_norm(v, dim=-1, dtype=torch.float64) for v in values])  # (L, B, H, T)
        drain = norms[..., 0] / median_over(norms, rest[:, None, :])             # (L, B, H)
        s['value_norm_first'] += norms[..., 0][:, first].sum(1).cpu()
        s['value_drain'] += drain[:, has_rest].sum(1).cpu()

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
            ties = (a == p[..., None]).sum(-1, dtype=torch.float64)                 # real keys as large as the sink
            s['sink_attn_argmax'][m] += torch.where((p >= a.amax(-1)) & q, 1 / (1 + ties), 0).sum((0, 2)).cpu()

    def result(self):
        """Summary numbers, per-layer lists and per-head lists (NaN where nothing was counted)."""
        def div(x, n):
            return (x / n) if n else torch.full_like(x, math.nan)
        count = dict(kurtosis_first=self.n_first, norm_ratio_first=self.n_first, max_abs_first=self.n_first,
                     kurtosis_rest=self.n_rest, norm_ratio_rest=self.n_rest, max_abs_rest=self.n_docs_rest,
                     resid_norm_first=self.n_first, max_over_median_first=self.n_first, resid_peak=self.n_docs_rest)
        per_head = {k: div(self.sums[k], self.n_rest) for k in ATTN_METRICS}
        per_head['sink_rate'] = div(self.sums['sink_rate'], self.n_first)
        per_head['value_norm_first'] = div(self.sums['value_norm_first'], self.n_value_first)
        per_head['value_drain'] = div(self.sums['value_drain'], self.n_value_rest)
        if self.n_nontrigger is not None:
            per_head['first_attn_mass_nontrigger'] = div(self.sums['first_attn_mass_nontrigger'], self.n_nontrigger)
        per_layer = {k: div(self.sums[k], count[k]) for k in HIDDEN_METRICS}
        per_layer.update({k: v.mean(1) for k, v in per_head.items()})
        per_layer['value_drain_min'] = per_head['value_drain'].amin(1)          # the most drained head of the layer
        # first_attn_argmax is a share of the rows that attend somewhere: per head of its own rows, per layer of the
        # layer's (with no empty row, every head has n_rest rows and this is the mean over heads, as for the others)
        per_head['first_attn_argmax'] = self.sums['first_attn_argmax'] / self.attending   # 0 / 0: NaN, no such row
        per_layer['first_attn_argmax'] = self.sums['first_attn_argmax'].sum(1) / self.attending.sum(1)
        out = {'ppl': math.exp(self.nll / self.n_predicted) if self.n_predicted else math.nan}
        out.update({k: v.mean().item() for k, v in per_layer.items()})
        out.update({k: per_layer[k].max().item() for k in PEAK_METRICS})       # where the peak is, not E_m
        out['value_drain_min'] = per_layer['value_drain_min'].min().item()
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


def trigger_ids(meta, data_dir):
    """meta.json's "triggers" (a list of token ids: first_attn_mass_nontrigger leaves out the queries whose token is
    one of them) as a tensor, or None when the data names none."""
    ids = meta.get('triggers')
    if ids is None:
        return None
    if not isinstance(ids, list) or not all(type(i) is int and 0 <= i < meta['vocab_size'] for i in ids):
        raise ValueError(f"{os.path.join(data_dir, 'meta.json')}: \"triggers\" must be a list of token ids in "
                         f"[0, {meta['vocab_size']}), got {json.dumps(ids)[:80]}; correct it or remove the key")
    return torch.tensor(ids, dtype=torch.long)


def default_batch_size(device):
    """Documents per forward pass when --batch_size is not given: 8 on CUDA, 1 on CPU (measured fastest there)."""
    return 8 if device.startswith('cuda') else 1


def check_finite(lm: LoadedModel, logits, hidden, numbers):
    """A ValueError, one line, when the forward pass gave a NaN or an Inf (in a hidden state or the logits): a broken
    model has no first-token attention or kurtosis, and its attention rows would count as sinks. By min and max,
    which carry a NaN, so no copy of the logits is made."""
    def finite(x):
        lo, hi = torch.aminmax(x.detach())
        return bool(torch.isfinite(lo) & torch.isfinite(hi))
    where = next(((f'the hidden state after block {m + 1}', h) for m, h in enumerate(hidden) if not finite(h)),
                 None if finite(logits) else ('the logits', logits))
    if where is None:
        return
    where, x = where
    row = int((~torch.isfinite(x)).flatten(1).any(1).nonzero()[0])
    bad = [n for n, p in lm.model.named_parameters() if not bool(torch.isfinite(p).all())]
    why = (f"its weights hold NaN or Inf ({bad[0]}{f' and {len(bad) - 1} more' if len(bad) > 1 else ''})" if bad else
           "its weights are finite but too large: float32 overflows")
    raise ValueError(f"{lm.name}: the forward pass gives non-finite values (NaN or Inf) in {where} on validation "
                     f"document {numbers[row]}: {why}; nothing is measured (a broken model, or one that diverged: "
                     f"measure an earlier checkpoint)")


def analyze(lm: LoadedModel, data_dir: str, max_docs: int | None, batch_size: int, device: str, quiet=False,
            sink_eps=SINK_EPS, on_batch=None):
    """(JSON-ready result dict, plot data of the first document) for one model; quiet: no progress lines.
    on_batch(mask), when given, sees each batch's real-token mask before the forward pass."""
    meta = check_data(data_dir, lm)
    triggers = trigger_ids(meta, data_dir)
    stats, example, docs = None, None, 0
    progress = Progress(run_label(lm.name), target_docs=min(max_docs or math.inf, meta['splits']['val']['documents']))
    for idx, mask, numbers in numbered_batches(data_dir, max_docs, lm.block_size, batch_size, lm.bos):
        idx, mask = idx.to(device), mask.to(device)
        if on_batch is not None:
            on_batch(mask)
        logits, hidden, attn, sink, values = forward_trace(lm, idx)
        check_finite(lm, logits, hidden, numbers)
        stats = stats or Stats(len(hidden), attn[0].size(1), sink_eps)
        queries = None if triggers is None else ~torch.isin(idx, triggers.to(idx.device))
        stats.update(hidden, attn, mask, sink, values, queries)
        s, n = nll_sum(logits, idx, mask, seen_targets(lm))
        stats.nll, stats.n_predicted = stats.nll + s, stats.n_predicted + n
        if 0 in numbers:                                   # the plots show the first document
            example = example_sequence(hidden, attn, mask, numbers.index(0))
        del logits, hidden, attn, sink, values
        docs += len(idx)
        if not quiet:
            progress.update(docs, 0)
    if stats is None:
        raise ValueError(f"{data_dir}: the val split has no documents")
    if not quiet:
        progress.done()
    data = dict(dir=portable_path(data_dir), split='val', val_sha256=val_sha256(meta), tokenizer=meta['tokenizer'],
                source=meta.get('source'), stand_in_for_c4=meta.get('stand_in_for_c4'), max_docs=max_docs,
                documents=stats.n_first,
                positions=stats.n_first + stats.n_rest, predicted_tokens=stats.n_predicted,
                block_size=lm.block_size, bos=lm.bos)
    return dict(model=model_label(lm.name), kind=lm.kind, config=lm.config, data=data, **stats.result()), example


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
